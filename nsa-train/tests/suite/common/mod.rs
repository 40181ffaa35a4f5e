//! Shared helpers for the training tests.
#![allow(dead_code)]

use std::path::PathBuf;

use nsa_core::{NsaConfig, NsaLmConfig};
use nsa_train::config::{DataConfig, RunConfig, TrainConfig};

/// A unique scratch directory under the target dir's tmp (removed first).
pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("nsa-train-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
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
