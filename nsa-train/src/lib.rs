//! Training and sampling for NSA language models.

pub mod checkpoint;
pub mod config;
pub mod dashboard;
pub mod data;
pub mod generate;
pub mod grads;
pub mod kernel_cache;
pub mod metrics;
pub mod profile;
pub mod schedule;
pub mod trainer;
