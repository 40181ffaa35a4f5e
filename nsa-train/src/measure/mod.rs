//! Measuring the training run: `nsa bench-train`'s benchmark of the steps as a run queues them
//! ([`bench`]) and the breakdown of one step into phases timed apart ([`profile`]).

mod attention_parts;
pub mod bench;
mod matmuls;
pub mod profile;
mod stopwatch;
