//! `cargo xtask bench train [--anchor] [--scaling]`: `nsa bench-train` in release mode, then,
//! with `--anchor`, PyTorch's dense model of the same shape trained in the same invocation
//! (`bench/train_anchor.py`), and ours over it. With `--scaling` (and `--devices A,B,..` for
//! `nsa`), the one-device run on A comes first and the data-parallel speed-up is printed.

use std::path::Path;
use std::process::{Command, ExitCode};

use serde_json::Value;

use crate::{nsa, NsaArgs};

pub fn run(args: NsaArgs, anchor: bool, scaling: bool, out: &Path) -> ExitCode {
    match bench(args, anchor, scaling, out) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Command(status)) => status,
        Err(Failure::Message(e)) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// How the benchmark failed: a command that did (and said why), or one line of our own.
enum Failure {
    Command(ExitCode),
    Message(String),
}

impl From<String> for Failure {
    fn from(e: String) -> Self {
        Failure::Message(e)
    }
}

/// Runs `nsa` (`--release` set); a failing run is a [`Failure::Command`].
fn nsa_ok(command: &str, args: NsaArgs) -> Result<(), Failure> {
    match nsa(command, NsaArgs { release: true, ..args }) {
        ExitCode::SUCCESS => Ok(()),
        status => Err(Failure::Command(status)),
    }
}

fn bench(mut args: NsaArgs, anchor: bool, scaling: bool, out: &Path) -> Result<(), Failure> {
    std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let ours_path = out.join("bench-train.json");
    let one_path = out.join("bench-train-1.json");
    if scaling {
        let one = first_device_only(&args.args)
            .ok_or("--scaling needs `--devices A,B,..` (two or more) after `--`".to_string())?;
        let one = [one, vec!["--json".to_string(), one_path.display().to_string()]].concat();
        nsa_ok("bench-train", NsaArgs { backend: args.backend, release: true, args: one })?;
    }
    args.args.extend(["--json".to_string(), ours_path.display().to_string()]);
    nsa_ok("bench-train", args)?;
    if scaling {
        let (one, all) = (read_json(&one_path)?, read_json(&ours_path)?);
        let (a, b) = (one["tokens_per_s"].as_f64().unwrap_or(0.0), all["tokens_per_s"].as_f64().unwrap_or(0.0));
        let devices = all["devices"].as_u64().unwrap_or(0);
        println!("data parallel: {devices} devices {b:.0} tokens/s, one device {a:.0} tokens/s: {:.2}x", b / a);
    }
    if anchor {
        run_anchor(&read_json(&ours_path)?, out)?;
    }
    Ok(())
}

/// Trains PyTorch's dense model of `ours`' shape (`bench/train_anchor.py`), keeps its lines in
/// `anchor.jsonl` under `out`, and prints ours over each anchor run.
fn run_anchor(ours: &Value, out: &Path) -> Result<(), String> {
    let (batch, seq_len) = (ours["batch"].as_u64().unwrap_or(0), ours["seq_len"].as_u64().unwrap_or(0));
    let mut cmd = Command::new("python3");
    cmd.args(["bench/train_anchor.py", "--batch", &batch.to_string(), "--seq-len", &seq_len.to_string()]);
    let text = run_anchor_script(&mut cmd)?;
    if let Err(e) = std::fs::write(out.join("anchor.jsonl"), &text) {
        eprintln!("error: {e}");
    }
    let tokens = ours["tokens_per_s"].as_f64().unwrap_or(0.0);
    let peak = ours["peak_reserved_gib"].as_f64();
    println!("ours (NSA, batch {batch} x {seq_len}): {tokens:.0} tokens/s, peak reserved {}", gib(peak));
    for line in text.lines().filter(|l| l.starts_with('{')) {
        let Ok(a) = serde_json::from_str::<Value>(line) else { continue };
        let a_tokens = a["tokens_per_s"].as_f64().unwrap_or(f64::NAN);
        let a_peak = a["peak_gib"].as_f64();
        let mode = if a["compiled"].as_bool() == Some(true) { "torch.compile" } else { "eager" };
        let memory = match (peak, a_peak) {
            (Some(p), Some(q)) => format!("{:.2}x", p / q),
            _ => "?".into(),
        };
        println!(
            "anchor (PyTorch dense, {mode}, {}): {a_tokens:.0} tokens/s, peak {} \
             | ours / anchor: {:.3}x tokens/s, {memory} memory",
            a["device"].as_str().unwrap_or("?"),
            gib(a_peak),
            tokens / a_tokens,
        );
    }
    Ok(())
}

/// `args` with `--devices A,B,..` cut to `--devices A`; `None` without two or more devices.
fn first_device_only(args: &[String]) -> Option<Vec<String>> {
    let mut out = args.to_vec();
    let (at, list) = args.iter().enumerate().find_map(|(i, a)| match a.strip_prefix("--devices") {
        Some("") => args.get(i + 1).map(|v| (i + 1, v.clone())),
        Some(v) => v.strip_prefix('=').map(|v| (i, v.to_string())),
        None => None,
    })?;
    let devices: Vec<&str> = list.split(',').collect();
    if devices.len() < 2 {
        return None;
    }
    out[at] =
        if at > 0 && out[at - 1] == "--devices" { devices[0].to_string() } else { format!("--devices={}", devices[0]) };
    Some(out)
}

/// Runs an anchor script (printed first) and returns its standard output; a failure says what
/// the anchor needs.
pub(crate) fn run_anchor_script(cmd: &mut Command) -> Result<String, String> {
    eprintln!("+ {cmd:?}");
    let output = cmd.output().map_err(|e| format!("cannot run python3 for the anchor: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "the anchor failed (python3 with torch and a CUDA GPU?):\n{}",
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&output.stdout).to_string())
}

pub(crate) fn read_json(path: &Path) -> Result<Value, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

fn gib(v: Option<f64>) -> String {
    v.map_or("?".into(), |g| format!("{g:.2} GiB"))
}

#[cfg(test)]
mod tests {
    use super::first_device_only;

    fn args(s: &str) -> Vec<String> {
        s.split(' ').map(String::from).collect()
    }

    #[test]
    fn scaling_runs_the_first_device_alone() {
        assert_eq!(
            first_device_only(&args("--batch-size 16 --devices 2,3")),
            Some(args("--batch-size 16 --devices 2"))
        );
        assert_eq!(first_device_only(&args("--devices=0,1,2 --steps 5")), Some(args("--devices=0 --steps 5")));
        assert_eq!(first_device_only(&args("--devices 0")), None);
        assert_eq!(first_device_only(&args("--batch-size 16")), None);
    }
}
