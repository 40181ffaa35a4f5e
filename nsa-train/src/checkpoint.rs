//! Checkpoints: model, optimiser state, step and data cursor, written atomically.
//!
//! A checkpoint is the directory `checkpoints/step-NNNNNNNN` of the run directory. It is written
//! under a temporary name, synced, and renamed into place, so a crash mid-write leaves the
//! previous checkpoints untouched and never a half-written one under a real name.

use std::fs;
use std::path::{Path, PathBuf};

use burn::module::Module;
use burn::optim::Optimizer;
use burn::record::{FullPrecisionSettings, NamedMpkFileRecorder, Recorder};
use burn::tensor::backend::AutodiffBackend;
use serde::{Deserialize, Serialize};

use crate::data::corpus::DataCursor;

pub type CheckpointRecorder = NamedMpkFileRecorder<FullPrecisionSettings>;

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
pub fn save<B, M, O>(run_dir: &Path, model: &M, optim: &O, state: &TrainState, keep: usize) -> Result<PathBuf, String>
where
    B: AutodiffBackend,
    M: Module<B> + burn::module::AutodiffModule<B>,
    O: Optimizer<M, B>,
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
    recorder.record(optim.to_record(), tmp.join("optimizer")).map_err(|e| io_err(&tmp, e))?;
    let state_json = serde_json::to_string_pretty(state).expect("state serialises");
    fs::write(tmp.join("state.json"), state_json).map_err(|e| io_err(&tmp, e))?;
    for entry in fs::read_dir(&tmp).map_err(|e| io_err(&tmp, e))? {
        let path = entry.map_err(|e| io_err(&tmp, e))?.path();
        fs::File::open(&path).and_then(|f| f.sync_all()).map_err(|e| io_err(&path, e))?;
    }
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

pub fn load_optimizer<B, M, O>(dir: &Path, optim: O, device: &B::Device) -> Result<O, String>
where
    B: AutodiffBackend,
    M: burn::module::AutodiffModule<B>,
    O: Optimizer<M, B>,
{
    let record = CheckpointRecorder::new().load(dir.join("optimizer"), device).map_err(|e| io_err(dir, e))?;
    Ok(optim.load_record(record))
}
