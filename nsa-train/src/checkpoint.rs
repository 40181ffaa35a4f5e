//! Checkpoints: model, optimiser state, step and data cursor, written atomically.
//!
//! A checkpoint is the directory `checkpoints/step-NNNNNNNN` of the run directory. It is written
//! under a temporary name, synced, and renamed into place, so a crash mid-write leaves the
//! previous checkpoints untouched and never a half-written one under a real name. Its files'
//! sizes and CRC-32s go in `checksums.json`, written last: a checkpoint damaged after the fact
//! (a truncated copy, a full disk, bit rot) fails [`verify`] instead of loading garbage.

use std::fs;
use std::path::{Path, PathBuf};

use burn::module::Module;
use burn::record::{FullPrecisionSettings, NamedMpkFileRecorder, Record, Recorder};
use burn::tensor::backend::AutodiffBackend;
use serde::{Deserialize, Serialize};

use nsa_core::{NsaLm, Phi};

use crate::data::corpus::DataCursor;

pub type CheckpointRecorder = NamedMpkFileRecorder<FullPrecisionSettings>;

/// The files of a checkpoint, each listed with its size and CRC-32 in [`MANIFEST`].
pub const FILES: [&str; 3] = ["model.mpk", "optimizer.mpk", "state.json"];
/// Sizes and checksums of [`FILES`], written after them.
pub const MANIFEST: &str = "checksums.json";

/// One file's entry in [`MANIFEST`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct FileSum {
    bytes: u64,
    crc32: u32,
}

fn file_sum(path: &Path) -> Result<FileSum, String> {
    use std::io::Read;
    let mut file = fs::File::open(path).map_err(|e| io_err(path, e))?;
    let mut hasher = crc32fast::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut bytes = 0u64;
    loop {
        let n = file.read(&mut buf).map_err(|e| io_err(path, e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        bytes += n as u64;
    }
    Ok(FileSum { bytes, crc32: hasher.finalize() })
}

/// Checks a checkpoint's files against its manifest: `Err` says which file is missing, cut short
/// or changed. A checkpoint written before manifests existed passes if its files are present
/// (loading it is then the check).
pub fn verify(dir: &Path) -> Result<(), String> {
    for name in FILES {
        if !dir.join(name).is_file() {
            return Err(format!("{name} is missing"));
        }
    }
    let manifest = dir.join(MANIFEST);
    if !manifest.exists() {
        return Ok(());
    }
    let text = fs::read_to_string(&manifest).map_err(|e| format!("{MANIFEST}: {e}"))?;
    let sums: std::collections::BTreeMap<String, FileSum> =
        serde_json::from_str(&text).map_err(|e| format!("{MANIFEST} is damaged: {e}"))?;
    for name in FILES {
        let want = sums.get(name).ok_or_else(|| format!("{MANIFEST} does not list {name}"))?;
        let got = file_sum(&dir.join(name))?;
        if got.bytes != want.bytes {
            return Err(format!("{name} has {} bytes, {} were written", got.bytes, want.bytes));
        }
        if got.crc32 != want.crc32 {
            return Err(format!("{name} does not match the checksum written with it"));
        }
    }
    Ok(())
}

/// Moves a damaged checkpoint out of the list (to `damaged-step-NNNNNNNN`, kept for inspection)
/// so that the next save's pruning and the next resume do not take it for the newest. Returns
/// where it went.
pub fn set_aside(dir: &Path) -> Result<PathBuf, String> {
    let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let parent = dir.parent().unwrap_or(Path::new("."));
    let mut target = parent.join(format!("damaged-{name}"));
    let mut n = 1;
    while target.exists() {
        n += 1;
        target = parent.join(format!("damaged-{name}.{n}"));
    }
    fs::rename(dir, &target).map_err(|e| io_err(dir, e))?;
    Ok(target)
}

/// Checkpoint directories that failed [`verify`], each with why.
pub type Damaged = Vec<(PathBuf, String)>;

/// The newest checkpoint that passes [`verify`], and each newer one that did not, with why.
pub fn newest_intact(run_dir: &Path) -> (Option<(usize, PathBuf)>, Damaged) {
    let mut damaged = Vec::new();
    for (step, dir) in list(run_dir).into_iter().rev() {
        match verify(&dir) {
            Ok(()) => return (Some((step, dir)), damaged),
            Err(why) => damaged.push((dir, why)),
        }
    }
    (None, damaged)
}

/// What `--checkpoint PATH` names: a run directory (its newest intact checkpoint, warning about
/// each newer damaged one) or one checkpoint directory. The run directory, whose `config.toml`
/// gives the model, and the checkpoint directory.
pub fn locate(path: &Path) -> Result<(PathBuf, PathBuf), String> {
    let (newest, damaged) = newest_intact(path);
    for (dir, why) in &damaged {
        eprintln!("warning: checkpoint {} is damaged ({why}); skipping it", dir.display());
    }
    match newest {
        Some((_, dir)) => Ok((path.to_path_buf(), dir)),
        None if path.join("model.mpk").exists() => {
            verify(path).map_err(|why| format!("checkpoint {} is damaged: {why}", path.display()))?;
            let run_dir = path.parent().and_then(Path::parent).map(PathBuf::from).unwrap_or_default();
            Ok((run_dir, path.to_path_buf()))
        }
        None if !damaged.is_empty() => Err(format!("{}: no intact checkpoint", path.display())),
        None => {
            Err(format!("{}: no checkpoint found (expected a run directory or a checkpoint directory)", path.display()))
        }
    }
}

/// Everything besides tensors needed to continue a run exactly. Training draws no random numbers
/// besides the data order, which is a function of `seed` and `cursor`: that is the RNG state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainState {
    /// Optimiser steps completed.
    pub step: usize,
    pub cursor: DataCursor,
    pub seed: u64,
}

pub fn checkpoints_dir(run_dir: &Path) -> PathBuf {
    run_dir.join("checkpoints")
}

/// Completed checkpoints, oldest first.
pub fn list(run_dir: &Path) -> Vec<(usize, PathBuf)> {
    let Ok(entries) = fs::read_dir(checkpoints_dir(run_dir)) else { return Vec::new() };
    let mut found: Vec<(usize, PathBuf)> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let step = name.strip_prefix("step-")?.parse().ok()?;
            Some((step, e.path()))
        })
        .collect();
    found.sort();
    found
}

pub fn latest(run_dir: &Path) -> Option<(usize, PathBuf)> {
    list(run_dir).pop()
}

fn io_err(path: &Path, e: impl std::fmt::Display) -> String {
    format!("{}: {e}", path.display())
}

/// Writes a checkpoint and prunes all but the newest `keep`. Returns its directory.
pub fn save<B, M, O>(run_dir: &Path, model: &M, optim: O, state: &TrainState, keep: usize) -> Result<PathBuf, String>
where
    B: AutodiffBackend,
    M: Module<B> + burn::module::AutodiffModule<B>,
    O: Record<B>,
{
    let dir = checkpoints_dir(run_dir);
    let final_path = dir.join(format!("step-{:08}", state.step));
    let tmp = dir.join(format!(".step-{:08}.tmp", state.step));
    if tmp.exists() {
        fs::remove_dir_all(&tmp).map_err(|e| io_err(&tmp, e))?;
    }
    fs::create_dir_all(&tmp).map_err(|e| io_err(&tmp, e))?;
    let recorder = CheckpointRecorder::new();
    model.clone().save_file(tmp.join("model"), &recorder).map_err(|e| io_err(&tmp, e))?;
    recorder.record(optim, tmp.join("optimizer")).map_err(|e| io_err(&tmp, e))?;
    let state_json = serde_json::to_string_pretty(state).expect("state serialises");
    fs::write(tmp.join("state.json"), state_json).map_err(|e| io_err(&tmp, e))?;
    let mut sums = std::collections::BTreeMap::new();
    for name in FILES {
        let path = tmp.join(name);
        fs::File::open(&path).and_then(|f| f.sync_all()).map_err(|e| io_err(&path, e))?;
        sums.insert(name, file_sum(&path)?);
    }
    let manifest = tmp.join(MANIFEST);
    fs::write(&manifest, serde_json::to_string_pretty(&sums).expect("sums serialise"))
        .map_err(|e| io_err(&manifest, e))?;
    fs::File::open(&manifest).and_then(|f| f.sync_all()).map_err(|e| io_err(&manifest, e))?;
    if final_path.exists() {
        fs::remove_dir_all(&final_path).map_err(|e| io_err(&final_path, e))?;
    }
    fs::rename(&tmp, &final_path).map_err(|e| io_err(&final_path, e))?;
    fs::File::open(&dir).and_then(|f| f.sync_all()).map_err(|e| io_err(&dir, e))?;
    let all = list(run_dir);
    for (_, old) in all.iter().take(all.len().saturating_sub(keep)) {
        fs::remove_dir_all(old).map_err(|e| io_err(old, e))?;
    }
    Ok(final_path)
}

pub fn load_state(dir: &Path) -> Result<TrainState, String> {
    let path = dir.join("state.json");
    let text = fs::read_to_string(&path).map_err(|e| io_err(&path, e))?;
    serde_json::from_str(&text).map_err(|e| io_err(&path, e))
}

/// Loads a checkpoint's model weights into `model` (whose shapes must match).
pub fn load_model<B: burn::tensor::backend::Backend, M: Module<B>>(
    dir: &Path,
    model: M,
    device: &B::Device,
) -> Result<M, String> {
    model.load_file(dir.join("model"), &CheckpointRecorder::new(), device).map_err(|e| io_err(dir, e))
}

/// Refuses a loaded model whose NSA layers hold another `phi`'s parameters than `want`, the
/// configured one: Burn's loader leaves out the parameters a checkpoint lacks, and the model
/// would compute the checkpoint's `phi`.
pub fn check_phi<B: burn::tensor::backend::Backend>(dir: &Path, model: &NsaLm<B>, want: Phi) -> Result<(), String> {
    let name = |phi: Phi| format!("{phi:?}").to_lowercase();
    match model.phi() {
        Some(got) if got != want && want == Phi::Mlp => Err(format!(
            "{}: the checkpoint holds no phi = \"mlp\" network: set phi = \"linear\" for a checkpoint saved when \
             \"mlp\" named the single linear map (or the phi it was trained with)",
            dir.display()
        )),
        Some(got) if got != want => Err(format!(
            "{}: the checkpoint holds phi = \"{}\"'s parameters, the config says phi = \"{}\"",
            dir.display(),
            name(got),
            name(want)
        )),
        _ => Ok(()),
    }
}

pub fn load_optimizer<B, O>(dir: &Path, device: &B::Device) -> Result<O, String>
where
    B: AutodiffBackend,
    O: Record<B>,
{
    CheckpointRecorder::new().load(dir.join("optimizer"), device).map_err(|e| io_err(dir, e))
}
