//! `cargo xtask bench train [--anchor] [--scaling]`: `nsa bench-train` in release mode, then,
//! with `--anchor`, PyTorch's dense model of the same shape trained in the same invocation
//! (`bench/train_anchor.py`), and ours over it. With `--scaling` (and `--devices A,B,..` for
//! `nsa`), the one-device run on A comes first and the data-parallel speed-up is printed.

use std::path::Path;
use std::process::{Command, ExitCode};

use serde_json::Value;

use crate::{nsa, NsaArgs};

pub fn run(mut args: NsaArgs, anchor: bool, scaling: bool, out: &Path) -> ExitCode {
    if let Err(e) = std::fs::create_dir_all(out) {
        eprintln!("error: {}: {e}", out.display());
        return ExitCode::FAILURE;
    }
    let ours_path = out.join("bench-train.json");
    let one_path = out.join("bench-train-1.json");
    args.release = true;
    if scaling {
        let Some(one) = first_device_only(&args.args) else {
            eprintln!("error: --scaling needs `--devices A,B,..` (two or more) after `--`");
            return ExitCode::FAILURE;
        };
        let one = [one, vec!["--json".to_string(), one_path.display().to_string()]].concat();
        let status = nsa("bench-train", NsaArgs { backend: args.backend, release: true, args: one });
        if status != ExitCode::SUCCESS {
            return status;
        }
    }
    args.args.extend(["--json".to_string(), ours_path.display().to_string()]);
    let status = nsa("bench-train", args);
    if status == ExitCode::SUCCESS && scaling {
        match (read_json(&one_path), read_json(&ours_path)) {
            (Ok(one), Ok(all)) => {
                let (a, b) = (one["tokens_per_s"].as_f64().unwrap_or(0.0), all["tokens_per_s"].as_f64().unwrap_or(0.0));
                println!(
                    "data parallel: {} devices {b:.0} tokens/s, one device {a:.0} tokens/s: {:.2}x",
                    all["devices"].as_u64().unwrap_or(0),
                    b / a
                );
            }
            (Err(e), _) | (_, Err(e)) => eprintln!("error: {e}"),
        }
    }
    if status != ExitCode::SUCCESS || !anchor {
        return status;
    }
    let ours = match read_json(&ours_path) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let (batch, seq_len) = (ours["batch"].as_u64().unwrap_or(0), ours["seq_len"].as_u64().unwrap_or(0));
    let mut cmd = Command::new("python3");
    cmd.args(["bench/train_anchor.py", "--batch", &batch.to_string(), "--seq-len", &seq_len.to_string()]);
    eprintln!("+ {cmd:?}");
    let output = match cmd.output() {
        Ok(o) if o.status.success() => o,
        Ok(o) => {
            eprintln!(
                "error: the anchor failed (python3 with torch and a CUDA GPU?):\n{}",
                String::from_utf8_lossy(&o.stderr)
            );
            return ExitCode::FAILURE;
        }
        Err(e) => {
            eprintln!("error: cannot run python3 for the anchor: {e}");
            return ExitCode::FAILURE;
        }
    };
    let text = String::from_utf8_lossy(&output.stdout).to_string();
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
        println!(
            "anchor (PyTorch dense, {mode}, {}): {a_tokens:.0} tokens/s, peak {} \
             | ours / anchor: {:.3}x tokens/s, {} memory",
            a["device"].as_str().unwrap_or("?"),
            gib(a_peak),
            tokens / a_tokens,
            match (peak, a_peak) {
                (Some(p), Some(q)) => format!("{:.2}x", p / q),
                _ => "?".into(),
            }
        );
    }
    ExitCode::SUCCESS
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

fn read_json(path: &Path) -> Result<Value, String> {
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
