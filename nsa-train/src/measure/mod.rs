//! Measuring the training run: `nsa bench-train`'s benchmark of the steps as a run queues them
//! ([`bench`]) and the breakdown of one step into phases timed apart ([`profile`]); and
//! generation: `nsa bench-decode` ([`decode`]) and its check against the forward
//! ([`decode_parity`]).

mod attention_parts;
pub mod bench;
pub mod cpu_profile;
pub mod decode;
pub mod decode_parity;
mod matmuls;
pub mod profile;
mod stopwatch;

/// The largest difference between `got` and `want`, relative to `want`'s largest magnitude.
pub fn rel_err(got: &[f64], want: &[f64]) -> f64 {
    let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs())).max(1e-12);
    got.iter().zip(want).fold(0.0f64, |m, (a, b)| m.max((a - b).abs() / scale))
}
