//! One copy of the model and its optimiser on one device, and the two halves of the training
//! step that changes it: [`Replica::forward_backward`] (the step's micro-batches, gradient
//! accumulation) and [`Replica::apply`] (global-norm clipping, decoupled weight decay, AdamW).
//! A data-parallel run averages the gradients over its replicas between the two
//! ([`super::queue_step`]).

use std::collections::HashSet;

use burn::module::{Module, ParamId};
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{DType, FloatDType, Tensor};
use nsa_core::{cast_params, lm_loss, NsaAux, NsaLm};

use super::fault::{Fault, FaultKind, INJECTED_ALLOCATION};
use crate::config::TrainConfig;
use crate::data::batch::HostBatch;
use crate::grads::{to_param_dtype, weight_decay_ids};
use crate::host_times::{HostClock, HostTimes};
use crate::optim::{compute_copy, AdamRecord, FusedAdamW, StepSettings};
use crate::TrainBackend;

/// A step's gradients and loss on one replica, before the replicas average them.
pub struct Gradients<B: AutodiffBackend> {
    pub grads: GradientsParams,
    /// The loss, summed over the micro-batches (each already divided by their count).
    pub loss: Tensor<B::InnerBackend, 1>,
    /// The gate and selection statistics of the first micro-batch, when asked.
    pub stats: Option<Tensor<B::InnerBackend, 1>>,
}

/// What one step queued on the device: `[loss, grad_norm]` and, when asked, the gate and
/// selection statistics of the first micro-batch.
pub struct StepOutput<B: AutodiffBackend> {
    pub health: Tensor<B::InnerBackend, 1>,
    pub stats: Option<Tensor<B::InnerBackend, 1>>,
}

/// How one step runs, beside its data.
#[derive(Debug, Clone)]
pub struct StepPlan {
    pub lr: f64,
    pub with_stats: bool,
    /// Test hook: a failure to inject in this step.
    pub fault: Option<Fault>,
}

pub struct Replica<B: TrainBackend> {
    /// 0 for the trainer's own replica; 1.. for data-parallel peers.
    pub rank: usize,
    pub device: B::Device,
    /// The master weights. Whoever replaces them drops [`Self::compute`] with them.
    pub model: NsaLm<B>,
    /// The forward's copy of the weights in the compute dtype (leaves of their own, with the
    /// master's parameter ids), written by the optimiser step; `None` until first needed.
    compute: Option<NsaLm<B>>,
    optim: FusedAdamW<B>,
    decay_ids: HashSet<ParamId>,
    /// The dtype forward passes run in (`train.precision`); `None` runs in the parameters' dtype.
    pub compute_dtype: Option<FloatDType>,
    /// The host's time spent queueing each part of the steps so far.
    pub host: HostTimes,
}

impl<B: TrainBackend> Replica<B> {
    /// Rank 0's replica: `model`'s weights as the master weights, trained by `optim`, with
    /// forward passes in `compute_dtype` (`None`: the weights' own).
    pub fn new(model: NsaLm<B>, device: B::Device, optim: FusedAdamW<B>, compute_dtype: Option<FloatDType>) -> Self {
        let decay_ids = weight_decay_ids::<B, _>(&model);
        Self { rank: 0, device, model, compute: None, optim, decay_ids, compute_dtype, host: HostTimes::default() }
    }

    /// The same weights and optimiser state on `device` (the state moves there on first use),
    /// as replica `rank`.
    pub fn fork(&self, device: &B::Device, rank: usize) -> Self {
        Self {
            rank,
            device: device.clone(),
            model: self.model.clone().fork(device),
            compute: None,
            optim: self.optim.clone(),
            decay_ids: self.decay_ids.clone(),
            compute_dtype: self.compute_dtype,
            host: HostTimes::default(),
        }
    }

    /// The model a forward pass runs: the master weights, or a copy in the compute dtype whose
    /// gradients flow back to them in their own dtype.
    pub fn compute_model<M: Module<C>, C: Backend>(&self, model: M) -> M {
        match self.compute_dtype {
            Some(dtype) => cast_params(model, dtype),
            None => model,
        }
    }

    /// The model a training forward runs: the compute copy under mixed precision (made from the
    /// master weights when there is none yet), else the master weights.
    pub fn training_model(&mut self) -> NsaLm<B> {
        let Some(dtype) = self.compute_dtype else {
            return self.model.clone();
        };
        self.compute.get_or_insert_with(|| compute_copy(self.model.clone(), dtype)).clone()
    }

    /// Replaces the master weights and the optimiser's state (a checkpoint's); the compute copy
    /// follows on next use.
    pub fn restore(&mut self, model: NsaLm<B>, optimiser: AdamRecord<B>) {
        self.optim = self.optim.clone().load_record(optimiser);
        self.decay_ids = weight_decay_ids::<B, _>(&model);
        self.model = model;
        self.compute = None;
    }

    /// The optimiser's state, as a checkpoint keeps it.
    pub fn optimiser_record(&self) -> AdamRecord<B> {
        self.optim.to_record()
    }

    /// Queues one optimiser step over `micro_batches` on this replica alone.
    pub fn queue_step(&mut self, t: &TrainConfig, micro_batches: Vec<HostBatch>, plan: &StepPlan) -> StepOutput<B> {
        let gradients = self.forward_backward(micro_batches, plan);
        self.apply(t, plan.lr, gradients)
    }

    /// Queues the forward and backward passes over `micro_batches` (the accumulation) and
    /// returns their summed gradients and loss.
    pub fn forward_backward(&mut self, micro_batches: Vec<HostBatch>, plan: &StepPlan) -> Gradients<B> {
        let micros = micro_batches.len();
        // Compute-dtype gradients are summed (over micro-batches, or replicas) in the master
        // dtype; a lone one goes to the fused step as it is, which reads it as f32.
        let widen = self.compute_dtype.is_some() && micros > 1;
        let mut accumulator = GradientsAccumulator::<NsaLm<B>>::new();
        let mut loss_sum: Option<Tensor<B::InnerBackend, 1>> = None;
        let mut stats = None;
        let mut clock = HostClock::start();
        let fault = plan.fault.filter(|f| f.rank == self.rank).map(|f| f.kind);
        match fault {
            Some(FaultKind::Panic) => panic!("injected failure (test hook)"),
            Some(FaultKind::OutOfMemory) => panic!(
                "called `Result::unwrap()` on an `Err` value: BufferTooBig {{ size: {INJECTED_ALLOCATION}, backtrace: <disabled> }}"
            ),
            _ => {}
        }
        for (micro, batch) in micro_batches.into_iter().enumerate() {
            let batch = batch.to_device::<B>(&self.device);
            // The gradients are read off the tensors the forward ran on (the compute copy's under
            // mixed precision), keyed by the parameter ids it shares with the master weights.
            let model = self.training_model();
            let (logits, aux) = model.forward_with_aux(batch.inputs, batch.documents.as_ref());
            // The statistics are read off the inner tensors, and the autodiff ones dropped before
            // the backward: autodiff tensors left over from a step are freed in a random order
            // later, which changes the op stream Burn's fusion sees, and it re-plans the whole
            // step: a stall (docs/training.md, "No stalls from the op stream").
            if plan.with_stats && micro == 0 {
                stats = aux_stats(&aux.into_iter().map(NsaAux::inner).collect::<Vec<_>>());
            } else {
                drop(aux);
            }
            let mut loss = lm_loss(logits, batch.targets).div_scalar(micros as f64);
            if fault == Some(FaultKind::NonFinite) {
                loss = loss.mul_scalar(f64::NAN);
            }
            let detached = loss.clone().inner();
            loss_sum = Some(match loss_sum.take() {
                Some(s) => s + detached,
                None => detached,
            });
            clock.lap(&mut self.host.forward_ms);
            let mut grads = GradientsParams::from_grads(loss.backward(), &model);
            if widen {
                grads = to_param_dtype(&self.model, grads);
            }
            accumulator.accumulate(&self.model, grads);
            clock.lap(&mut self.host.backward_ms);
        }
        Gradients { grads: accumulator.grads(), loss: loss_sum.expect("at least one micro-batch"), stats }
    }

    /// Queues the optimiser step (global-norm clip, decoupled decay, AdamW) with `gradients`
    /// (this replica's, or every replica's mean) at learning rate `lr`.
    pub fn apply(&mut self, t: &TrainConfig, lr: f64, gradients: Gradients<B>) -> StepOutput<B> {
        let mut clock = HostClock::start();
        let settings = StepSettings { lr, weight_decay: t.weight_decay, max_norm: t.grad_clip };
        let compute = self.compute_dtype.map(|d| (self.training_model(), d));
        let stepped =
            self.optim.step(self.model.clone(), compute, gradients.grads, settings, &self.decay_ids, &self.device);
        (self.model, self.compute) = (stepped.model, stepped.compute);
        let norm = stepped.norm;
        clock.lap(&mut self.host.optimiser_ms);
        // The loss comes out in the compute dtype, the norm in the master dtype.
        let health = Tensor::cat(vec![gradients.loss.cast(norm.dtype()), norm], 0);
        StepOutput { health, stats: gradients.stats }
    }
}

/// Gate and selection statistics of one forward pass, averaged over layers, on the device:
/// `[gate_cmp, gate_slc, gate_win, gate_entropy, selected_blocks_per_query]`.
fn aux_stats<B: Backend>(aux: &[NsaAux<B>]) -> Option<Tensor<B, 1>> {
    // Plain (non-autodiff) tensors: see `Replica::forward_backward`.
    let per_layer: Vec<Tensor<B, 1>> = aux
        .iter()
        .map(|a| {
            let gates = a.gates.clone().cast(DType::F32); // [B, T, 3, H]
            let means = gates.clone().mean_dim(0).mean_dim(1).mean_dim(3).reshape([3]);
            // A position whose three gates all round to 0 in bf16 has no shares: 0, not 0 / 0.
            let shares = gates.clone() / gates.sum_dim(2).clamp_min(1e-12);
            let entropy = (shares.clone() * shares.clamp_min(1e-12).log()).sum_dim(2).mean().neg();
            let selected = a.blocks.clone().greater_equal_elem(0).float().cast(DType::F32).sum_dim(3).mean();
            Tensor::cat(vec![means, entropy, selected], 0)
        })
        .collect();
    let n = per_layer.len();
    (n > 0).then(|| Tensor::stack::<2>(per_layer, 0).mean_dim(0).reshape([5]))
}

#[cfg(test)]
mod tests {
    use burn::backend::Flex;
    use burn::tensor::{Int, Tensor, TensorData};
    use nsa_core::NsaAux;

    use super::aux_stats;

    #[test]
    fn gates_that_are_all_zero_have_an_entropy_of_zero() {
        let device = Default::default();
        // Position 0: gates (0.5, 0.5, 0): ln 2. Position 1: all three 0, as bf16 can round them.
        let gates =
            Tensor::<Flex, 4>::from_data(TensorData::new(vec![0.5f32, 0.5, 0.0, 0.0, 0.0, 0.0], [1, 2, 3, 1]), &device);
        let blocks = Tensor::<Flex, 4, Int>::from_data(TensorData::new(vec![0i64, -1], [1, 2, 1, 1]), &device);
        let stats: Vec<f32> = aux_stats(&[NsaAux { gates, blocks }]).unwrap().into_data().to_vec().unwrap();
        let entropy = stats[3];
        assert!((entropy - std::f32::consts::LN_2 / 2.0).abs() < 1e-6, "{stats:?}");
    }
}
