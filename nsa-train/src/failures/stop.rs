//! How a training run ends: completed or stopped on request ([`Finish`]), or early ([`Stop`]),
//! each with what a user needs to go on (the step, the newest good checkpoint).

use std::path::PathBuf;

/// How a run that did not fail ended.
#[derive(Debug, PartialEq)]
pub enum Finish {
    /// Reached its step count.
    Completed,
    /// Stopped on the user's request (the dashboard's `q`, `s`) after writing this checkpoint.
    Interrupted { step: usize, checkpoint: PathBuf },
}

/// Why a run ended early.
#[derive(Debug)]
pub enum Stop {
    /// A non-finite loss or gradient norm at `step`; `last_good` is the newest checkpoint kept.
    NonFinite { step: usize, loss: f64, grad_norm: f64, last_good: Option<PathBuf> },
    /// The device could not allocate what `step` needed (`requested` bytes in one buffer, when
    /// known); `last_good` is the newest checkpoint kept.
    OutOfMemory { step: usize, batch: usize, seq_len: usize, requested: Option<u64>, last_good: Option<PathBuf> },
    /// Any other failure (I/O, a checkpoint that does not load), as one line.
    Error(String),
}

impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Stop::NonFinite { step, loss, grad_norm, last_good } => {
                let good = last_good.as_ref().map_or("none".to_string(), |p| p.display().to_string());
                write!(f, "non-finite value at step {step} (loss {loss}, grad norm {grad_norm}); stopped, ")?;
                write!(f, "last good checkpoint: {good}")
            }
            Stop::OutOfMemory { step, batch, seq_len, requested, last_good } => {
                let good = last_good.as_ref().map_or("none".to_string(), |p| p.display().to_string());
                let asked = requested.map_or("more".to_string(), |r| format!("{:.2} GiB more", super::gib(r)));
                write!(
                    f,
                    "out of device memory at step {step}: a batch of {batch} x {seq_len} tokens asked for {asked} \
                     than the device could give; lower --batch-size (and raise train.grad_accumulation to keep the \
                     global batch) or the sequence length; last good checkpoint: {good}"
                )
            }
            Stop::Error(e) => f.write_str(e),
        }
    }
}
