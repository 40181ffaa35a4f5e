//! `RunConfig::resolve`, the config `nsa train` runs with: a new run's file and flags; a resumed
//! run's saved config with the flags laid over it, refusing what would change the run's state.

use std::path::Path;

use nsa_train::config::RunConfig;

use crate::common;

fn write(path: &Path, cfg: &RunConfig) {
    std::fs::write(path, toml::to_string(cfg).unwrap()).unwrap();
}

#[test]
fn resolve_lays_flags_over_the_file_or_the_resumed_runs_config() {
    let dir = common::scratch("resolve");
    let run = dir.join("run");
    std::fs::create_dir_all(&run).unwrap();
    let out = run.display().to_string();
    let started = common::tiny_run(&run, 20);
    let file = dir.join("new.toml");
    write(&file, &started);
    let missing = dir.join("no-such-default.toml");

    // A new run: the file, the flags over it, `out` over `train.out`.
    let cfg = RunConfig::resolve(Some(&file), &missing, Some("elsewhere"), false, |c| c.train.batch_size = 3).unwrap();
    assert_eq!((cfg.train.batch_size, cfg.train.out.as_str()), (3, "elsewhere"));
    let err = RunConfig::resolve(None, &missing, Some(&out), false, |_| {}).unwrap_err();
    assert!(err.contains("no-such-default.toml"), "{err}");

    // Nothing saved yet: nothing to resume.
    let err = RunConfig::resolve(None, &missing, Some(&out), true, |_| {}).unwrap_err();
    assert!(err.starts_with("nothing to resume"), "{err}");

    // `--resume --out` alone: the saved config, with the flags a resume may change.
    write(&run.join("config.toml"), &started);
    let cfg = RunConfig::resolve(None, &missing, Some(&out), true, |c| c.train.steps = 40).unwrap();
    assert_eq!(cfg.train.steps, 40);
    assert_eq!(
        toml::to_string(&cfg.clone().with_train(cfg.train.clone().with_steps(20))).unwrap(),
        toml::to_string(&started).unwrap()
    );

    // Where the run's weights started (`train.init`, read only at its start) may differ.
    let cfg = RunConfig::resolve(None, &missing, Some(&out), true, |c| c.train.init = "runs/16k".into()).unwrap();
    assert_eq!(cfg.train.init, "runs/16k");

    // A flag that changes the batch, or an explicit config with another model: refused.
    let err = RunConfig::resolve(None, &missing, Some(&out), true, |c| c.train.batch_size = 3).unwrap_err();
    assert!(err.contains("cannot change `train.batch_size` (8 in the run, 3 requested)"), "{err}");
    let mut other = started.clone();
    other.model.n_layers = 3;
    write(&file, &other);
    let err = RunConfig::resolve(Some(&file), &missing, Some(&out), true, |_| {}).unwrap_err();
    assert!(err.contains("cannot change `model.n_layers`"), "{err}");
}
