//! Training and sampling for NSA language models.

pub mod checkpoint;
pub mod config;
pub mod data;
pub mod generate;
pub mod grads;
pub mod metrics;
pub mod schedule;
pub mod trainer;
