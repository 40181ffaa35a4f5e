//! `nsa eval needle` from the command line: its one-line errors, its report, and a run stopped
//! by a signal that keeps its cells and goes on from them.

use std::process::Command;

use crate::cli::{assert_fails_with, stopped_by_sigterm};

/// `nsa eval needle` of the checkpoint in `out` (a model of 32 tokens, run past them).
pub(crate) fn asks_for_keys(dir: &std::path::Path, out: &str) {
    let out = out.to_string();
    // This model's 32 tokens hold no haystack: the needle alone is longer.
    assert_fails_with(&["eval", "needle", "--checkpoint", &out, "--backend", "cpu"], "no room for filler");
    assert_fails_with(&["eval", "needle", "--checkpoint", &out, "--depths", "50,120"], "percentages from 0 to 100");
    // Run past the trained length, a haystack fits.
    let report = dir.join("needle.json");
    let report_arg = report.to_str().unwrap();
    let args = ["eval", "needle", "--checkpoint", &out, "--context", "128", "--lengths", "100", "--depths", "50"];
    let needle = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_nsa"))
            .args(args)
            .args(["--trials", "1", "--backend", "cpu", "--json", report_arg])
            .args(extra)
            .output()
            .unwrap()
    };
    let output = needle(&[]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(text.lines().any(|line| line.trim_start().starts_with("100 ")), "{text}");
    let result: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert!(result["complete"] == true && result["cells"].as_array().unwrap().len() == 1, "{result}");
    // Run again with --resume, its cell is kept rather than run again.
    let output = needle(&["--resume"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(String::from_utf8_lossy(&output.stderr).contains("1/1: length 100 depth 50%"), "progress");
    assert!(String::from_utf8_lossy(&output.stderr).contains("(kept)"), "the cell kept");
    // Another context asks other questions of the model: its cells are not kept.
    let other =
        [&args[..4], &["--context", "256", "--lengths", "100", "--backend", "cpu", "--json", report_arg, "--resume"]]
            .concat();
    assert_fails_with(&other, "holds cells of");
    needle_stopped_by_a_signal_goes_on(dir, &out);
}

/// `nsa eval needle` stopped by SIGTERM keeps the cells it ran and exits 75; `--resume` keeps
/// them and runs the rest.
fn needle_stopped_by_a_signal_goes_on(dir: &std::path::Path, out: &str) {
    let report = dir.join("needle-stopped.json");
    let cells = |path: &std::path::Path| -> (bool, usize) {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let report: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
        (report["complete"] == true, report["cells"].as_array().map_or(0, |c| c.len()))
    };
    let args = ["eval", "needle", "--checkpoint", out, "--context", "128", "--lengths", "100,110,120"];
    let args = [&args[..], &["--trials", "1", "--backend", "cpu", "--json", report.to_str().unwrap()]].concat();
    let mut child = Command::new(env!("CARGO_BIN_EXE_nsa"))
        .args(&args)
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    while cells(&report).1 == 0 {
        assert!(start.elapsed().as_secs() < 300, "no cell within 300 s");
        assert!(child.try_wait().unwrap().is_none(), "the eval ended before the signal");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let stderr = stopped_by_sigterm(child, 1);
    let (complete, ran) = cells(&report);
    assert!(!complete && ran < 33, "stopped after {ran} of 33 cells:\n{stderr}");
    assert!(stderr.contains("--resume"), "{stderr}");

    let output = Command::new(env!("CARGO_BIN_EXE_nsa")).args(&args).arg("--resume").output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert_eq!(stderr.matches("(kept)").count(), ran, "{stderr}");
    assert_eq!(cells(&report), (true, 33));
}
