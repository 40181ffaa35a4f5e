//! The `nsa` binary: configuration and input errors are one line, name the problem, exit non-zero.

use crate::{cli_needle, common};

use std::process::Command;

fn nsa(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_nsa")).args(args).output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

pub(crate) fn assert_fails_with(args: &[&str], needle: &str) {
    let (ok, stderr) = nsa(args);
    assert!(!ok, "should fail: {args:?}");
    let last = stderr.trim_end().lines().last().unwrap_or_default();
    assert!(
        last.starts_with("error: ") && last.contains(needle),
        "expected one error line with `{needle}`, got:\n{stderr}"
    );
}

#[test]
fn config_and_data_errors_are_one_line() {
    let dir = common::scratch("cli");
    let cfg = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    };
    assert_fails_with(&["train", "--config", "no/such/config.toml"], "config.toml`: cannot read");
    assert_fails_with(&["train", "--config", &cfg("a.toml", "[train]\nstepz = 3\n")], "`train.stepz`: unknown key");
    assert_fails_with(
        &["train", "--config", &cfg("b.toml", "[train]\nsteps = \"many\"\n")],
        "`train.steps`: expected integer, found string",
    );
    assert_fails_with(&["train", "--config", &cfg("c.toml", "[model.attention]\nl = 24\n")], "`model.attention.l`");
    assert_fails_with(&["train", "--config", &cfg("d.toml", "[data]\nsynthetic = \"sort\"\n")], "unknown task `sort`");
    assert_fails_with(
        &["train", "--config", &cfg("f.toml", &tiny_model(32, 32)), "--lr", "0"],
        "`train.lr`: must be a finite number > 0",
    );
    let ok_cfg = cfg("e.toml", &tiny_model(32, 32));
    let out = dir.join("run").display().to_string();
    assert_fails_with(
        &["train", "--config", &ok_cfg, "--data", "no/such/dir", "--out", &out],
        "no/such/dir: cannot open",
    );
    std::fs::write(dir.join("tiny.txt"), "too short").unwrap();
    let data = dir.join("tiny.txt").display().to_string();
    assert_fails_with(&["train", "--config", &ok_cfg, "--data", &data, "--out", &out], "fewer than one window");
    assert_fails_with(&["train", "--config", &ok_cfg, "--data", &data, "--out", &out, "--resume"], "nothing to resume");
    assert_fails_with(&["generate", "--checkpoint", &out, "--prompt", "x"], "no checkpoint found");
}

#[test]
fn train_then_generate_from_the_checkpoint() {
    let dir = common::scratch("cli-run");
    write_corpus(&dir);
    let cfg = dir.join("run.toml");
    std::fs::write(
        &cfg,
        tiny_model(32, 32) + "fused_kernels = false\n[train]\nsteps = 4\nbatch_size = 2\nlog_every = 2\n",
    )
    .unwrap();
    let out = dir.join("run").display().to_string();
    let (ok, stderr) = nsa(&[
        "train",
        "--config",
        cfg.to_str().unwrap(),
        "--data",
        dir.join("corpus.txt").to_str().unwrap(),
        "--out",
        &out,
        "--backend",
        "cpu",
        "--lr",
        "3e-4",
    ]);
    assert!(ok, "{stderr}");
    assert!(std::path::Path::new(&out).join("checkpoints/step-00000004/model.mpk").exists());
    let saved = std::fs::read_to_string(std::path::Path::new(&out).join("config.toml")).unwrap();
    assert!(saved.contains("lr = 0.0003\n"), "the flag's learning rate is the run's: {saved}");
    let metrics = std::fs::read_to_string(std::path::Path::new(&out).join("metrics.jsonl")).unwrap();
    assert_eq!(metrics.lines().filter(|l| l.contains("\"loss\"")).count(), 2);
    generates_from(&dir, &out);
    scores_held_out_text(&dir, &out);
    cli_needle::asks_for_keys(&dir, &out);
    plots_the_run(&dir, &out);
    goes_on_at_a_longer_length(&dir, &cfg, &out);
}

/// `nsa train --init` from the run in `out`, at twice its length and packed as one stream: the
/// run starts from its weights and keeps both flags in its config.
fn goes_on_at_a_longer_length(dir: &std::path::Path, cfg: &std::path::Path, out: &str) {
    let longer = dir.join("run-64").display().to_string();
    let corpus = dir.join("corpus.txt");
    let (ok, stderr) = nsa(&[
        "train",
        "--config",
        cfg.to_str().unwrap(),
        "--data",
        corpus.to_str().unwrap(),
        "--out",
        &longer,
        "--backend",
        "cpu",
        "--seq-len",
        "64",
        "--steps",
        "2",
        "--init",
        out,
        "--pack",
        "stream",
    ]);
    assert!(ok && stderr.contains("weights from "), "{stderr}");
    let saved = std::fs::read_to_string(std::path::Path::new(&longer).join("config.toml")).unwrap();
    assert!(saved.contains(&format!("init = \"{out}\"")) && saved.contains("seq_len = 64\n"), "{saved}");
    assert!(saved.contains("pack = \"stream\"\n"), "--pack is the run's: {saved}");
}

/// `nsa generate` from the checkpoint in `out`: a prompt, a prompt file, several samples.
fn generates_from(dir: &std::path::Path, out: &str) {
    let out = out.to_string();
    let output = Command::new(env!("CARGO_BIN_EXE_nsa"))
        .args(["generate", "--checkpoint", &out, "--prompt", "line 1", "--tokens", "12", "--backend", "cpu"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(text.starts_with("line 1") && text.trim_end().len() >= 6, "{text}");
    assert!(String::from_utf8_lossy(&output.stderr).contains("tokens/s), decode"), "the closing speed line");

    // A prompt from a file, several samples at once.
    std::fs::write(dir.join("prompt.txt"), "line 2").unwrap();
    let prompt_file = dir.join("prompt.txt").display().to_string();
    let args = ["generate", "--checkpoint", &out, "--prompt-file", &prompt_file, "--max-tokens", "8", "--batch", "2"];
    let output = Command::new(env!("CARGO_BIN_EXE_nsa")).args(args).args(["--backend", "cpu"]).output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let text = String::from_utf8_lossy(&output.stdout);
    assert_eq!(text.matches("--- sample").count(), 2, "{text}");
    assert_fails_with(
        &["generate", "--checkpoint", &out, "--prompt", "x", "--top-p", "0"],
        "--top-p must be in (0, 1]",
    );
}

/// `nsa eval` of the checkpoint in `out`.
fn scores_held_out_text(dir: &std::path::Path, out: &str) {
    let out = out.to_string();
    // Held-out scores of the same checkpoint.
    let json = dir.join("eval.json");
    let corpus = dir.join("corpus.txt").display().to_string();
    let args = ["eval", "--checkpoint", &out, "--data", &corpus, "--max-windows", "3", "--batch-size", "2"];
    let output = Command::new(env!("CARGO_BIN_EXE_nsa"))
        .args(args)
        .args(["--backend", "cpu", "--json", json.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(String::from_utf8_lossy(&output.stdout).contains("bits/byte over 96 tokens (3 windows of 32)"));
    assert!(String::from_utf8_lossy(&output.stderr).contains("eval: 3/3 windows"), "progress");
    let result: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let loss = result["loss"].as_f64().unwrap();
    assert!(loss > 0.0 && loss < 8.0 && result["windows"] == 3, "{result}");
    std::fs::write(dir.join("short.txt"), "too short").unwrap();
    let short = dir.join("short.txt").display().to_string();
    assert_fails_with(&["eval", "--checkpoint", &out, "--data", &short], "fewer than one window");
    assert_fails_with(&["eval", "--checkpoint", &out, "--data", &corpus, "--batch-size", "0"], "at least 1");
}

/// Sends `child` SIGTERM `times` times at once, and gives back its stderr once it has exited
/// with the status of a run stopped on a signal.
pub(crate) fn stopped_by_sigterm(mut child: std::process::Child, times: usize) -> String {
    for _ in 0..times {
        let killed = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
        assert!(killed.success());
    }
    let status = child.wait().unwrap();
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.code(), Some(i32::from(nsa_train::signals::PREEMPTED)), "{stderr}");
    stderr
}

/// `nsa plot` of the run in `out`.
fn plots_the_run(dir: &std::path::Path, out: &str) {
    let out = out.to_string();
    // The run's charts.
    let plots = dir.join("plots");
    let output = Command::new(env!("CARGO_BIN_EXE_nsa"))
        .args(["plot", &out, "--out", plots.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    for file in ["loss.png", "tokens_per_s.png", "gates.png"] {
        let png = std::fs::read(plots.join(file)).unwrap();
        assert!(png.starts_with(b"\x89PNG") && png.len() > 1000, "{file}");
        assert!(String::from_utf8_lossy(&output.stdout).contains(file));
    }
    assert_fails_with(&["plot", dir.join("no-run").to_str().unwrap()], "metrics.jsonl");
}

#[test]
fn shipped_configs_load_as_run_configs() {
    let configs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs");
    let mut loaded = 0;
    for dir in [configs.clone(), configs.join("bench")] {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "toml") {
                nsa_train::config::RunConfig::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                loaded += 1;
            }
        }
    }
    assert!(loaded >= 8, "{loaded} configs");
}

/// The 64k passkey recipe starts from the 16k one's run, whose model is its own but for the length.
#[test]
fn the_64k_recipe_goes_on_from_the_16k_run() {
    let load = |name: &str| {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs").join(name);
        nsa_train::config::RunConfig::load(&path).unwrap()
    };
    let (short, long) = (load("nsa-125m-passkey-16k.toml"), load("nsa-125m-passkey-64k.toml"));
    assert_eq!(long.train.init, short.train.out);
    assert_eq!((short.model.seq_len, long.model.seq_len), (16384, 65536));
    long.check_init_from(&short).unwrap();
}

/// Writes a small text corpus to `dir/corpus.txt`.
fn write_corpus(dir: &std::path::Path) {
    let text: String = (0..400).map(|i| format!("line {i}: the quick brown fox jumps over the lazy dog.\n")).collect();
    std::fs::write(dir.join("corpus.txt"), text).unwrap();
}

/// A tiny run on the CPU: config (the tiny model and `train`), corpus and run directory under
/// `dir`.
fn tiny_cli_run(dir: &std::path::Path, train: &str) -> (String, String, String) {
    write_corpus(dir);
    let cfg = dir.join("run.toml");
    std::fs::write(
        &cfg,
        tiny_model(32, 32) + "fused_kernels = false\n[train]\nbatch_size = 2\nlog_every = 1\n" + train,
    )
    .unwrap();
    let data = dir.join("corpus.txt").display().to_string();
    (cfg.display().to_string(), data, dir.join("run").display().to_string())
}

fn logged_steps(run: &str) -> Vec<u64> {
    let metrics = std::fs::read_to_string(std::path::Path::new(run).join("metrics.jsonl")).unwrap();
    metrics
        .lines()
        .filter(|l| l.contains("\"loss\""))
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["step"].as_u64().unwrap())
        .collect()
}

#[test]
fn bad_inputs_around_a_run_are_one_line_errors_and_lose_nothing() {
    let dir = common::scratch("cli-bad");
    let (cfg, data, run) = tiny_cli_run(&dir, "steps = 4\ncheckpoint_every = 2\nbackend = \"cpu\"\n");
    let (ok, stderr) = nsa(&["train", "--config", &cfg, "--data", &data, "--out", &run]);
    assert!(ok, "{stderr}");

    // Sampling needs a prompt.
    assert_fails_with(&["generate", "--checkpoint", &run, "--prompt", ""], "--prompt is empty");
    // A TOML syntax error says where.
    let broken = dir.join("broken.toml");
    std::fs::write(&broken, "[train]\nsteps = = 3\n").unwrap();
    assert_fails_with(&["train", "--config", broken.to_str().unwrap()], "line 2, column 9: not valid TOML");
    // A resume keeps the run's batch and data.
    assert_fails_with(&["train", "--out", &run, "--resume", "--batch-size", "4"], "cannot change `train.batch_size`");
    assert_fails_with(&["train", "--out", &run, "--resume", "--data", &cfg], "cannot change `data.paths`");
    assert_fails_with(&["train", "--out", &run, "--resume", "--pack", "stream"], "cannot change `data.pack`");
    let other = dir.join("other.toml");
    std::fs::write(&other, std::fs::read_to_string(&cfg).unwrap().replace("n_layers = 1", "n_layers = 2")).unwrap();
    assert_fails_with(
        &["train", "--config", other.to_str().unwrap(), "--data", &data, "--out", &run, "--resume"],
        "cannot change `model.n_layers`",
    );
    // A directory of files that are not data names what it skipped.
    let junk = dir.join("junk");
    std::fs::create_dir_all(&junk).unwrap();
    std::fs::write(junk.join("weights.bin"), [0u8, 1, 2]).unwrap();
    let out2 = dir.join("run2").display().to_string();
    assert_fails_with(
        &["train", "--config", &cfg, "--data", junk.to_str().unwrap(), "--out", &out2],
        "skipped 1 file(s) that are not .txt, .md, .jsonl or .parquet",
    );

    // A truncated newest checkpoint: the resume says so, sets it aside, and continues from the
    // newest intact one; the metrics log holds each step once.
    let newest = std::path::Path::new(&run).join("checkpoints/step-00000004");
    let model = newest.join("model.mpk");
    let len = std::fs::metadata(&model).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&model).unwrap().set_len(len / 2).unwrap();
    let (ok, stderr) = nsa(&["train", "--out", &run, "--resume", "--steps", "6", "--no-dashboard"]);
    assert!(ok, "{stderr}");
    assert!(stderr.contains("step-00000004 is damaged (model.mpk has"), "{stderr}");
    assert!(stderr.contains("resumed from") && stderr.contains("(step 2)"), "{stderr}");
    assert!(std::path::Path::new(&run).join("checkpoints/damaged-step-00000004/model.mpk").exists());
    assert_eq!(logged_steps(&run), vec![1, 2, 3, 4, 5, 6]);

    // Damaged optimiser state in every checkpoint: one line, nothing deleted.
    for (_, ckpt) in nsa_train::checkpoint::list(std::path::Path::new(&run)) {
        std::fs::write(ckpt.join("optimizer.mpk"), b"cut").unwrap();
    }
    assert_fails_with(&["generate", "--checkpoint", &run, "--prompt", "x"], "no intact checkpoint");
    assert_fails_with(&["train", "--out", &run, "--resume", "--steps", "8"], "nothing to resume: no intact checkpoint");
    let kept = std::fs::read_dir(std::path::Path::new(&run).join("checkpoints")).unwrap().count();
    assert!(kept >= 3, "damaged checkpoints are kept, set aside");
}

/// SIGTERM (a cluster's preemption) mid-run, delivered twice at once: the step in flight finishes
/// and is checkpointed, the binary exits with `nsa_train::signals::PREEMPTED`, and `--resume`
/// continues exactly: its losses equal an uninterrupted run's (a constant learning rate, so the
/// schedule does not depend on the step count).
#[cfg(unix)]
#[test]
fn a_preempted_run_checkpoints_exits_75_and_resumes_exactly() {
    let dir = common::scratch("cli-signal");
    let train = concat!(
        "steps = 100000\ncheckpoint_every = 100000\nvalid_every = 0\nwarmup_steps = 0\nmin_lr_ratio = 1.0\n",
        "backend = \"cpu\"\n"
    );
    let (cfg, data, run) = tiny_cli_run(&dir, train);
    let mut child = Command::new(env!("CARGO_BIN_EXE_nsa"))
        .args(["train", "--config", &cfg, "--data", &data, "--out", &run, "--no-dashboard"])
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let metrics = std::path::Path::new(&run).join("metrics.jsonl");
    let start = std::time::Instant::now();
    while std::fs::read_to_string(&metrics).map_or(0, |m| m.matches("\"loss\"").count()) < 2 {
        assert!(start.elapsed().as_secs() < 300, "the run logged no steps within 300 s");
        assert!(child.try_wait().unwrap().is_none(), "the run ended before the signal");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // Twice, as `timeout` sends it (to the process, then to its process group): one request.
    let stderr = stopped_by_sigterm(child, 2);
    let line = stderr.lines().find(|l| l.contains("on a signal")).unwrap_or_else(|| panic!("{stderr}"));
    let step: usize = line.split_whitespace().nth(3).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("{line}"));
    assert!(std::path::Path::new(&run).join(format!("checkpoints/step-{step:08}")).exists(), "{stderr}");

    let until = (step + 2).to_string();
    let (ok, stderr) = nsa(&["train", "--out", &run, "--resume", "--steps", &until, "--no-dashboard"]);
    assert!(ok, "{stderr}");
    let fresh = dir.join("fresh").display().to_string();
    let (ok, stderr) = nsa(&["train", "--config", &cfg, "--data", &data, "--out", &fresh, "--steps", &until]);
    assert!(ok, "{stderr}");
    let losses = |run: &str| -> Vec<(u64, f64)> {
        let text = std::fs::read_to_string(std::path::Path::new(run).join("metrics.jsonl")).unwrap();
        text.lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .filter(|v| v.get("loss").is_some() && v["step"].as_u64().unwrap() > step as u64)
            .map(|v| (v["step"].as_u64().unwrap(), v["loss"].as_f64().unwrap()))
            .collect()
    };
    let resumed = losses(&run);
    assert_eq!(resumed.len(), 2, "the resumed run logs steps {} and {}", step + 1, step + 2);
    assert_eq!(resumed, losses(&fresh), "the resumed run's losses differ from the uninterrupted run's");
}

/// A one-layer model's TOML at sequence length `seq_len` and width `dim`.
fn tiny_model(seq_len: usize, dim: usize) -> String {
    format!(
        "[model]\nseq_len = {seq_len}\nn_layers = 1\n[model.attention]\ndim = {dim}\nn_heads = 2\nn_kv_heads = 1\n\
         d_k = 8\nd_v = 8\nl = 8\nd = 4\nl_sel = 8\nn = 3\nw = 8\n"
    )
}

/// `nsa bench-decode --parity` on the CPU (f32): decoding with the cache follows one forward over
/// the whole sequence, past several selection blocks, and the report line says how closely.
#[test]
fn bench_decode_parity_reports_decoding_against_the_forward() {
    let config = concat!(env!("CARGO_MANIFEST_DIR"), "/../configs/tiny.toml");
    let args = ["--contexts", "60", "--batches", "1", "--tokens", "1", "--warmup", "0", "--parity", "40"];
    let (ok, stderr) =
        nsa(&[&["bench-decode", "--config", config, "--backend", "cpu", "--precision", "f32"], &args[..]].concat());
    assert!(ok, "{stderr}");
    let line =
        stderr.lines().find(|l| l.starts_with("parity: ")).unwrap_or_else(|| panic!("no parity line:\n{stderr}"));
    let number = |before: &str, after: &str| -> f64 {
        let from = line.find(before).unwrap() + before.len();
        line[from..from + line[from..].find(after).unwrap()].trim().parse().unwrap()
    };
    let err = number("logits within", "of the forward");
    let equal = number("scale,", "% of block lists");
    assert!(err < 1e-4, "{line}");
    assert!(equal >= 95.0, "{line}");
}
