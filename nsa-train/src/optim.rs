//! The training run's optimiser: global-norm clipping, decoupled weight decay and AdamW over
//! every parameter in one fused step ([`nsa_kernels::FusedAdamWBackend`]), with the compute copy
//! of the weights (bf16 under mixed precision) written in the same pass.
//!
//! Its state is kept, and checkpointed, in Burn's own `AdamW` record layout (one
//! `AdaptorRecord` per parameter id), so checkpoints written before it load unchanged.

use std::collections::{HashMap, HashSet};

use burn::tensor::Device;

use burn::module::{AutodiffModule, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::optim::record::AdaptorRecord;
use burn::optim::{AdamW, AdamWState, AdaptiveMomentumState, GradientsParams};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{FloatDType, Tensor, TensorPrimitive};
use nsa_kernels::{AdamWHyper, AdamWSlot, AdamWUpdate, FusedAdamWBackend};

/// The optimiser state of a run: Burn's `AdamW` record, keyed by parameter id.
pub type AdamRecord<B> = hashbrown::HashMap<ParamId, AdaptorRecord<AdamW, B>>;

/// What [`FusedAdamW::step`] needs beside the model and gradients.
#[derive(Clone, Copy, Debug)]
pub struct StepSettings {
    pub lr: f64,
    pub weight_decay: f64,
    pub max_norm: f64,
}

/// AdamW (with clipping and decay) as one fused step per optimiser step.
#[derive(Clone)]
pub struct FusedAdamW<B: AutodiffBackend> {
    pub beta_1: f32,
    pub beta_2: f32,
    pub epsilon: f32,
    records: AdamRecord<B>,
}

/// The model and its compute copy after a step, and the gradients' norm before clipping.
pub struct Stepped<M, B: AutodiffBackend> {
    pub model: M,
    pub compute: Option<M>,
    pub norm: Tensor<B::InnerBackend, 1>,
}

impl<B: AutodiffBackend> FusedAdamW<B>
where
    B::InnerBackend: FusedAdamWBackend,
{
    pub fn new(beta_1: f32, beta_2: f32, epsilon: f32) -> Self {
        Self { beta_1, beta_2, epsilon, records: AdamRecord::default() }
    }

    pub fn to_record(&self) -> AdamRecord<B> {
        self.records.clone()
    }

    pub fn load_record(mut self, records: AdamRecord<B>) -> Self {
        self.records = records;
        self
    }

    /// One optimiser step on `model` (the master weights) with `grads`: clipped to a global
    /// norm of `settings.max_norm`, weight decay on `decay_ids`, AdamW on every parameter with a
    /// gradient. With `compute`, the compute copy's weights are replaced by the new ones cast to
    /// `compute_dtype`, keeping its parameter ids.
    pub fn step<M: AutodiffModule<B>>(
        &mut self,
        model: M,
        compute: Option<(M, FloatDType)>,
        mut grads: GradientsParams,
        settings: StepSettings,
        decay_ids: &HashSet<ParamId>,
        device: &Device<B::InnerBackend>,
    ) -> Stepped<M, B> {
        let mut gather = Gather::<B> {
            grads: &mut grads,
            records: &mut self.records,
            decay_ids,
            device,
            slots: Vec::new(),
            ids: Vec::new(),
        };
        model.visit(&mut gather);
        let (slots, ids) = (gather.slots, gather.ids);
        let hyper = AdamWHyper {
            lr: settings.lr,
            beta_1: self.beta_1,
            beta_2: self.beta_2,
            epsilon: self.epsilon,
            weight_decay: settings.weight_decay,
            max_norm: settings.max_norm,
        };
        let times: Vec<usize> = slots.iter().map(|s| s.time).collect();
        let dtype = compute.as_ref().map(|(_, d)| *d);
        let (updates, norm) = B::InnerBackend::adamw_step(slots, hyper, dtype, device);
        let mut updates: HashMap<ParamId, (usize, AdamWUpdate<B::InnerBackend>)> =
            ids.into_iter().zip(times.into_iter().zip(updates)).collect();
        let mut copies = HashMap::new();
        let model = model.map(&mut Apply { updates: &mut updates, records: &mut self.records, copies: &mut copies });
        let compute = compute.map(|(c, _)| c.map(&mut Replace { tensors: &mut copies }));
        let norm = Tensor::from_primitive(TensorPrimitive::Float(norm));
        Stepped { model, compute, norm }
    }
}

/// The module's parameters that have a gradient, as the fused step's slots (module order).
struct Gather<'a, B: AutodiffBackend> {
    grads: &'a mut GradientsParams,
    records: &'a mut AdamRecord<B>,
    decay_ids: &'a HashSet<ParamId>,
    device: &'a Device<B::InnerBackend>,
    slots: Vec<AdamWSlot<B::InnerBackend>>,
    ids: Vec<ParamId>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Gather<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let Some(grad) = self.grads.remove::<B::InnerBackend, D>(param.id) else {
            return;
        };
        let weights = param.val().inner();
        let (time, moment_1, moment_2) = match self.records.remove(&param.id) {
            Some(record) => {
                let state: AdamWState<B::InnerBackend, D> = record.into_state();
                let m = state.momentum;
                // A state loaded or forked on another device moves with its parameter.
                let here = |t: Tensor<B::InnerBackend, D>| match t.device() == *self.device {
                    true => t,
                    false => t.to_device(self.device),
                };
                (m.time + 1, here(m.moment_1), here(m.moment_2))
            }
            None => (1, weights.zeros_like(), weights.zeros_like()),
        };
        self.slots.push(AdamWSlot {
            param: weights.into_primitive().tensor(),
            grad: grad.into_primitive().tensor(),
            moment_1: moment_1.into_primitive().tensor(),
            moment_2: moment_2.into_primitive().tensor(),
            time,
            decay: self.decay_ids.contains(&param.id),
        });
        self.ids.push(param.id);
    }
}

/// Puts each stepped parameter's new weights into the module and its moments into the record;
/// the compute copies are set aside for [`Replace`].
struct Apply<'a, B: AutodiffBackend> {
    updates: &'a mut HashMap<ParamId, (usize, AdamWUpdate<B::InnerBackend>)>,
    records: &'a mut AdamRecord<B>,
    copies: &'a mut HashMap<ParamId, TensorPrimitive<B::InnerBackend>>,
}

fn tensor<B: Backend, const D: usize>(t: burn::tensor::ops::FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(t))
}

impl<B: AutodiffBackend> ModuleMapper<B> for Apply<'_, B> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let Some((time, update)) = self.updates.remove(&param.id) else {
            return param;
        };
        let momentum = AdaptiveMomentumState::new(time, tensor(update.moment_1), tensor(update.moment_2));
        self.records.insert(param.id, AdaptorRecord::from_state::<D>(AdamWState::new(momentum)));
        if let Some(c) = update.compute {
            self.copies.insert(param.id, TensorPrimitive::Float(c));
        }
        let weights = update.param;
        param.map(|t| {
            let require_grad = t.is_require_grad();
            Tensor::from_inner(tensor(weights)).set_require_grad(require_grad)
        })
    }
}

/// Replaces parameters by the given tensors (a fresh leaf each), by id.
struct Replace<'a, B: Backend> {
    tensors: &'a mut HashMap<ParamId, TensorPrimitive<B>>,
}

impl<B: AutodiffBackend> ModuleMapper<B> for Replace<'_, B::InnerBackend> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let Some(new) = self.tensors.remove(&param.id) else {
            return param;
        };
        param.map(|t| {
            let require_grad = t.is_require_grad();
            Tensor::from_inner(Tensor::from_primitive(new)).set_require_grad(require_grad)
        })
    }
}

/// `module` with every float parameter replaced by a fresh leaf holding its weights cast to
/// `dtype` (ids kept): the compute copy a mixed-precision forward runs on. Its gradients are its
/// own, in `dtype`, read by the fused step for the master weights of the same ids.
pub fn compute_copy<B: AutodiffBackend, M: AutodiffModule<B>>(module: M, dtype: FloatDType) -> M {
    module.map(&mut CastLeaves(dtype))
}

struct CastLeaves(FloatDType);

impl<B: AutodiffBackend> ModuleMapper<B> for CastLeaves {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let dtype = self.0;
        param.map(|t| {
            let require_grad = t.is_require_grad();
            Tensor::from_inner(t.inner().cast(dtype)).set_require_grad(require_grad)
        })
    }
}
