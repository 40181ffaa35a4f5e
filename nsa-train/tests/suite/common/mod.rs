//! Shared helpers for the training tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;

use nsa_core::{NsaConfig, NsaLmConfig};
use nsa_train::config::{DataConfig, RunConfig, TrainConfig};
use nsa_train::splits::load_splits;
use nsa_train::trainer::Trainer;
use nsa_train::TrainBackend;

/// A unique scratch directory under the target dir's tmp (removed first).
pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("nsa-train-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs this binary's test `name` (one marked `#[ignore]`, so a plain run skips it) in a process
/// of its own, failing with its output if it fails, and returns its standard error: for a test
/// that changes what a whole process does (its panic hook).
pub fn in_own_process(name: &str) -> String {
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new(exe).args([name, "--exact", "--ignored", "--nocapture"]).output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && stdout.contains("1 passed"), "{name} in its own process:\n{stdout}\n{stderr}");
    stderr.into_owned()
}

/// The small attention shape of the generation and evaluation tests: every branch and boundary
/// within a few dozen tokens.
pub fn small_attention() -> NsaConfig {
    NsaConfig::new()
        .with_dim(32)
        .with_n_heads(4)
        .with_n_kv_heads(2)
        .with_d_k(8)
        .with_d_v(8)
        .with_l(8)
        .with_d(4)
        .with_l_sel(8)
        .with_n(3)
        .with_w(12)
}

/// A very small NSA model on the copy task.
pub fn tiny_run(out: &std::path::Path, steps: usize) -> RunConfig {
    let model = NsaLmConfig::new().with_n_layers(2).with_seq_len(64).with_attention(
        NsaConfig::new()
            .with_dim(64)
            .with_n_heads(4)
            .with_n_kv_heads(2)
            .with_d_k(16)
            .with_d_v(16)
            .with_l(8)
            .with_d(4)
            .with_l_sel(8)
            .with_n(4)
            .with_w(16),
    );
    let train = TrainConfig::new()
        .with_steps(steps)
        .with_batch_size(8)
        .with_lr(3e-3)
        .with_warmup_steps(10)
        .with_log_every(1)
        .with_valid_every(0)
        .with_checkpoint_every(1000)
        .with_out(out.display().to_string());
    RunConfig::new().with_model(model).with_train(train).with_data(DataConfig::new().with_synthetic("copy".into()))
}

/// Every parameter's values, in module order.
pub fn weights<B: Backend, M: Module<B>>(m: &M) -> Vec<f64> {
    struct Flatten(Vec<f64>);
    impl<B: Backend> ModuleVisitor<B> for Flatten {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<B, D>>) {
            self.0.extend(p.val().into_data().convert::<f64>().to_vec::<f64>().unwrap());
        }
    }
    let mut f = Flatten(Vec::new());
    m.visit(&mut f);
    f.0
}

/// Copies the checkpoint `from` into `run_dir` as its step-0 checkpoint, so a resume there starts
/// from those weights.
pub fn seed_checkpoint(from: &Path, run_dir: &Path) {
    let step0 = nsa_train::checkpoint::checkpoints_dir(run_dir).join("step-00000000");
    std::fs::create_dir_all(&step0).unwrap();
    for file in std::fs::read_dir(from).unwrap() {
        let file = file.unwrap().path();
        std::fs::copy(&file, step0.join(file.file_name().unwrap())).unwrap();
    }
}

/// A trainer of `cfg` on its own data splits on the default device (`resume`: from its newest
/// checkpoint), or its one-line refusal.
pub fn new_trainer<B: TrainBackend>(cfg: RunConfig, resume: bool) -> Result<Trainer<B>, String> {
    let (train, valid, _) = load_splits(&cfg, &[]).unwrap();
    Trainer::<B>::new(cfg, train, valid, Default::default(), resume)
}
