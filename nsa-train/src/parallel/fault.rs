//! Failures injected into a step, a test hook: what a bad batch or a dying device does, so the
//! tests can check that a run stops with the right line and keeps its last good checkpoint.

/// A failure to inject at one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    pub step: usize,
    /// The replica it hits (0 without data parallelism).
    pub rank: usize,
    pub kind: FaultKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// The step's loss, and so its gradients, become NaN.
    NonFinite,
    /// The replica's thread panics before the all-reduce.
    Panic,
    /// An allocation of [`INJECTED_ALLOCATION`] bytes fails, as CubeCL reports it: a panic on
    /// the device's thread with its `BufferTooBig` error.
    OutOfMemory,
}

/// The size of the allocation a [`FaultKind::OutOfMemory`] fails: 64 GiB.
pub const INJECTED_ALLOCATION: u64 = 64 << 30;

impl Fault {
    /// A NaN loss at `step` on the first replica.
    pub fn nan_at(step: usize) -> Self {
        Self { step, rank: 0, kind: FaultKind::NonFinite }
    }
}
