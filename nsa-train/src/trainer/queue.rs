//! How the trainer queues a step (drawing its batches, the learning rate) and reads one back,
//! turning a device failure on either side into a [`Stop`].

use std::time::Instant;

use burn::tensor::{Tensor, TensorData};

use super::Trainer;
use crate::checkpoint;
use crate::data::batch::HostBatch;
use crate::failures::{catch, panic_message, Stop};
use crate::parallel::{self, StepPlan};
use crate::schedule::learning_rate;
use crate::step::{DoneStep, PendingStep, StepQueue};
use crate::TrainBackend;

impl<B: TrainBackend> StepQueue<B> for Trainer<B> {
    /// Queues a step; a panic inside it (a device failure surfacing on this thread) becomes a
    /// [`Stop`].
    fn queue(&mut self, with_stats: bool) -> Result<PendingStep<B>, Stop> {
        let step = self.step + 1;
        let (start, before) = (Instant::now(), self.replica.host.clone());
        let mut pending = match catch(|| self.queue_step(with_stats)) {
            Ok(Ok(pending)) => pending,
            // A failed allocation can surface as another error first: a data-parallel peer or
            // the collective that met it stops, and rank 0 hears of that.
            Ok(Err(stop)) if crate::failures::failed_allocation().is_some() => {
                return Err(self.device_failure(step, stop))
            }
            Ok(Err(stop)) => return Err(stop),
            Err(panic) => return Err(self.device_failure(step, panic_message(&panic).unwrap_or_default())),
        };
        pending.queue_ms = start.elapsed().as_secs_f64() * 1e3;
        pending.queue_parts_ms = self.replica.host.since(&before);
        Ok(pending)
    }

    fn read(&self, pending: PendingStep<B>) -> Result<DoneStep, Stop> {
        let data = self.read_tensor(pending.step, &pending.health)?;
        let v: Vec<f64> = data.convert::<f64>().to_vec().unwrap();
        let (loss, grad_norm) = (v[0], v[1]);
        if !(loss.is_finite() && grad_norm.is_finite()) {
            let last_good = checkpoint::latest(&self.run_dir).map(|(_, p)| p);
            return Err(Stop::NonFinite { step: pending.step, loss, grad_norm, last_good });
        }
        let stats = match &pending.stats {
            Some(s) => Some(self.read_tensor(pending.step, s)?.convert::<f64>().to_vec::<f64>().unwrap()),
            None => None,
        };
        let PendingStep { step, lr, queue_ms, queue_parts_ms, .. } = pending;
        Ok(DoneStep { step, loss, grad_norm, lr, stats, queue_ms, queue_parts_ms })
    }
}

impl<B: TrainBackend> Trainer<B> {
    /// Queues one optimiser step (all micro-batches, on every replica) and returns its
    /// device-side results.
    fn queue_step(&mut self, with_stats: bool) -> Result<PendingStep<B>, Stop> {
        let t = self.cfg.train.clone();
        let step = self.step + 1;
        let lr = learning_rate(&t, self.step);
        let rows = t.batch_size * self.world();
        let global: Vec<HostBatch> = (0..t.grad_accumulation)
            .map(|_| HostBatch::of_windows(&self.train, &self.order.take(&mut self.cursor, rows)))
            .collect();
        let plan = StepPlan { lr, with_stats, fault: self.fault.filter(|f| f.step == step) };
        let output = parallel::queue_step(&mut self.replica, self.group.as_mut(), &t, step, global, &plan)?;
        self.step = step;
        Ok(PendingStep {
            step,
            health: output.health,
            stats: output.stats,
            lr,
            queue_ms: 0.0,
            queue_parts_ms: [0.0; 3],
        })
    }

    /// Why the device failed at `step` ([`crate::failures::device_failure`]).
    fn device_failure(&self, step: usize, error: impl std::fmt::Debug) -> Stop {
        let last_good = || checkpoint::latest(&self.run_dir).map(|(_, p)| p);
        crate::failures::device_failure(step, self.cfg.train.batch_size, self.train.seq_len(), last_good, error)
    }

    /// Reads `tensor` of `step`; a device error, or a panic (a device failure surfacing on this
    /// thread while the op stream drains), becomes a [`Stop`].
    fn read_tensor(&self, step: usize, tensor: &Tensor<B::InnerBackend, 1>) -> Result<TensorData, Stop> {
        match catch(|| tensor.clone().try_into_data()) {
            Ok(Ok(data)) => Ok(data),
            Ok(Err(e)) => Err(self.device_failure(step, e)),
            Err(panic) => Err(self.device_failure(step, panic_message(&panic).unwrap_or_default())),
        }
    }
}
