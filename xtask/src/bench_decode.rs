//! `cargo xtask bench decode [--anchor]`: `nsa bench-decode` in release mode, then, with
//! `--anchor`, PyTorch's dense model of the same shape decoding with a static KV cache
//! (`bench/decode_anchor.py`) at the same contexts and batches, and ours beside it.

use std::path::Path;
use std::process::{Command, ExitCode};

use serde_json::Value;

use crate::bench_train::run_anchor_script;
use crate::{nsa, NsaArgs};

pub fn run(mut args: NsaArgs, anchor: bool, out: &Path) -> ExitCode {
    if let Err(e) = std::fs::create_dir_all(out) {
        eprintln!("error: {}: {e}", out.display());
        return ExitCode::FAILURE;
    }
    let ours_path = out.join("bench-decode.json");
    let passed = args.args.clone();
    args.args.extend(["--json".to_string(), ours_path.display().to_string()]);
    let status = nsa("bench-decode", NsaArgs { release: true, ..args });
    if status != ExitCode::SUCCESS || !anchor {
        return status;
    }
    match run_anchor(&ours_path, &passed, out) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The anchor at our runs' contexts and batches (and `--tokens`/`--warmup` when given), its
/// lines kept in `decode-anchor.jsonl`, and each of our runs beside its anchor run.
fn run_anchor(ours_path: &Path, passed: &[String], out: &Path) -> Result<(), String> {
    let text = std::fs::read_to_string(ours_path).map_err(|e| format!("{}: {e}", ours_path.display()))?;
    let ours: Vec<Value> = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", ours_path.display()))?;
    let list = |key: &str| {
        let mut v: Vec<u64> = ours.iter().filter_map(|r| r[key].as_u64()).collect();
        v.dedup();
        v.iter().map(u64::to_string).collect::<Vec<_>>().join(",")
    };
    let mut cmd = Command::new("python3");
    cmd.args(["bench/decode_anchor.py", "--contexts", &list("context"), "--batches", &list("batch")]);
    for flag in ["--tokens", "--warmup"] {
        if let Some(value) = flag_value(passed, flag) {
            cmd.args([flag, &value]);
        }
    }
    let anchor = run_anchor_script(&mut cmd)?;
    std::fs::write(out.join("decode-anchor.jsonl"), &anchor).map_err(|e| e.to_string())?;
    let anchors: Vec<Value> = anchor.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    println!("context  batch | ours ms/token tokens/s | anchor ms/token tokens/s | ours/anchor tokens/s");
    for r in &ours {
        let same = |a: &&Value| a["context"] == r["context"] && a["batch"] == r["batch"];
        let Some(a) = anchors.iter().find(same) else { continue };
        let f = |v: &Value, key: &str| v[key].as_f64().unwrap_or(f64::NAN);
        println!(
            "{:>7}  {:>5} | {:>8.2} {:>12.0} | {:>10.2} {:>12.0} | {:.2}x",
            r["context"],
            r["batch"],
            f(r, "token_ms"),
            f(r, "tokens_per_s"),
            f(a, "token_ms"),
            f(a, "tokens_per_s"),
            f(r, "tokens_per_s") / f(a, "tokens_per_s")
        );
    }
    Ok(())
}

/// The value given to `flag` (`--flag V` or `--flag=V`).
pub(crate) fn flag_value(args: &[String], flag: &str) -> Option<String> {
    args.iter().enumerate().find_map(|(i, a)| match a.strip_prefix(flag) {
        Some("") => args.get(i + 1).cloned(),
        Some(v) => v.strip_prefix('=').map(String::from),
        None => None,
    })
}
