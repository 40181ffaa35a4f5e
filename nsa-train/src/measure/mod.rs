//! Measuring the training run: `nsa bench-train`'s benchmark of the steps as a run queues them
//! ([`bench`]) and the breakdown of one step into phases timed apart ([`profile`]); and
//! generation: `nsa bench-decode` ([`decode`]) and its check against the forward
//! ([`decode_parity`]).

mod attention_parts;
pub mod bench;
pub mod decode;
pub mod decode_parity;
mod matmuls;
pub mod profile;
mod stopwatch;
