//! The step pipeline: how a run keeps the device busy. Step `k + 1` is queued before step `k`'s
//! loss and gradient norm (two floats) are read, so the host records the next step while the
//! device runs the last, a bad step is caught at most one step late, and no step syncs inside
//! itself. `nsa train` ([`crate::trainer::Trainer::train_until`]) and `nsa bench-train`
//! ([`crate::measure::bench`]) both run their steps through it.

use burn::tensor::backend::AutodiffBackend;
use burn::tensor::Tensor;

use crate::failures::Stop;
use crate::TrainBackend;

/// A step queued on the device and not yet read.
pub struct PendingStep<B: AutodiffBackend> {
    pub step: usize,
    /// `[loss, grad_norm]`.
    pub health: Tensor<B::InnerBackend, 1>,
    pub stats: Option<Tensor<B::InnerBackend, 1>>,
    pub lr: f64,
    /// The host's time to queue it, ms.
    pub queue_ms: f64,
    /// Its parts: forward and loss, backward, optimiser.
    pub queue_parts_ms: [f64; 3],
}

/// A step read back and found finite.
#[derive(Debug, Clone)]
pub struct DoneStep {
    pub step: usize,
    pub loss: f64,
    pub grad_norm: f64,
    pub lr: f64,
    /// The gate and selection statistics, when the step computed them.
    pub stats: Option<Vec<f64>>,
    pub queue_ms: f64,
    pub queue_parts_ms: [f64; 3],
}

/// What queues steps and reads them back (the trainer).
pub trait StepQueue<B: TrainBackend> {
    /// Queues the next optimiser step, with the gate and selection statistics when `with_stats`.
    fn queue(&mut self, with_stats: bool) -> Result<PendingStep<B>, Stop>;
    /// Waits for a queued step and reads it; an error if its loss or gradient norm is not finite.
    fn read(&self, pending: PendingStep<B>) -> Result<DoneStep, Stop>;
}

/// At most one step in flight beyond the one being queued.
pub struct StepPipeline<B: AutodiffBackend> {
    in_flight: Option<PendingStep<B>>,
}

impl<B: TrainBackend> Default for StepPipeline<B> {
    fn default() -> Self {
        Self { in_flight: None }
    }
}

impl<B: TrainBackend> StepPipeline<B> {
    /// Queues the next step, then reads the one queued before it (if any).
    pub fn advance(&mut self, queue: &mut impl StepQueue<B>, with_stats: bool) -> Result<Option<DoneStep>, Stop> {
        let pending = queue.queue(with_stats)?;
        self.in_flight.replace(pending).map(|previous| queue.read(previous)).transpose()
    }

    /// Reads the step in flight (if any): the device runs dry until the next is queued.
    pub fn drain(&mut self, queue: &impl StepQueue<B>) -> Result<Option<DoneStep>, Stop> {
        self.in_flight.take().map(|pending| queue.read(pending)).transpose()
    }
}
