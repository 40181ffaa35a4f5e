//! Training and sampling for NSA language models.

pub mod backends;
pub mod checkpoint;
pub mod config;
pub mod dashboard;
pub mod data;
pub mod evaluate;
pub mod failures;
pub mod files;
pub mod generate;
pub mod grads;
pub mod host_times;
pub mod kernel_cache;
pub mod measure;
pub mod metrics;
pub mod needle;
pub mod optim;
pub mod parallel;
pub mod plot;
pub mod run_args;
pub mod schedule;
pub mod signals;
pub mod splits;
pub mod step;
pub mod trainer;

use burn::tensor::backend::AutodiffBackend;
use nsa_core::SparseAttentionBackend;
use nsa_kernels::FusedAdamWBackend;

/// A backend training runs on: autodiff over a backend with NSA's sparse attention, so both the
/// training step and validation (on the inner backend) can run the model, and the fused
/// optimiser step on the inner backend.
pub trait TrainBackend:
    AutodiffBackend<InnerBackend: SparseAttentionBackend + FusedAdamWBackend> + SparseAttentionBackend
{
}

impl<B> TrainBackend for B where
    B: AutodiffBackend<InnerBackend: SparseAttentionBackend + FusedAdamWBackend> + SparseAttentionBackend
{
}
