//! The replicas of a run: one model copy per device, each with its optimiser. A single-device
//! run has one; a data-parallel run one per device, each on its own thread, each reading its own
//! rows of every global batch. After the backward pass the replicas average their gradients (and
//! loss) with burn-collective's all-reduce (device-to-device copies through NCCL on CUDA), then
//! take the same optimiser step, so their weights stay equal.
//!
//! Rank 0 is the trainer's own replica, on the calling thread: it draws the batches, sends each
//! peer its rows, and alone validates, logs and writes checkpoints. [`queue_step`] is the one
//! place that chooses between one device and many.

mod bucket;
mod fault;
mod group;
mod replica;

pub use fault::{Fault, FaultKind, INJECTED_ALLOCATION};
pub use group::Group;
pub use replica::{Gradients, Replica, StepOutput, StepPlan};

use crate::config::TrainConfig;
use crate::data::batch::HostBatch;
use crate::failures::Stop;
use crate::TrainBackend;

/// Queues optimiser step `step` on every replica: `global` holds the step's micro-batches with
/// every replica's rows; `own` (rank 0) takes its share and, with a `group`, its peers theirs.
pub fn queue_step<B: TrainBackend>(
    own: &mut Replica<B>,
    group: Option<&mut Group>,
    t: &TrainConfig,
    step: usize,
    global: Vec<HostBatch>,
    plan: &StepPlan,
) -> Result<StepOutput<B>, Stop> {
    let Some(group) = group else {
        return Ok(own.queue_step(t, global, plan));
    };
    let mine = group.send_step(step, &global, plan, plan.with_stats)?;
    let gradients = own.forward_backward(mine, plan);
    let gradients = group.all_reduce_mean::<B>(step, &own.model, gradients)?;
    let output = own.apply(t, plan.lr, gradients);
    group.collect(step)?;
    Ok(output)
}
