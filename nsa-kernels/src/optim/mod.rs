//! The optimiser step as a backend extension ([`FusedAdamWBackend`]): global-norm gradient
//! clipping, decoupled weight decay and AdamW over every parameter at once, with the compute
//! copy of each new weight (bf16 for mixed precision) written in the same pass.
//!
//! On `CubeBackend` it is two kernels per parameter and one for the norm (the sums of squares,
//! the clip factor, then each parameter's update reading that factor on the device), about 30
//! bytes of memory traffic per parameter; through Burn's fusion it is one custom operation.
//! Every other backend runs [`reference`], the same function in tensor ops.

#[cfg(feature = "cube")]
mod cube;
#[cfg(feature = "fusion")]
mod fusion;
#[cfg(feature = "cube")]
pub mod kernel;
pub mod reference;

use burn::tensor::ops::FloatTensor;
use burn::tensor::{backend::Backend, Device, FloatDType};

/// AdamW's settings and one step's learning rate and clip.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWHyper {
    pub lr: f64,
    pub beta_1: f32,
    pub beta_2: f32,
    pub epsilon: f32,
    /// Decoupled weight decay, for the slots that take it.
    pub weight_decay: f64,
    /// The global L2 norm the gradients are scaled down to (0 disables clipping).
    pub max_norm: f64,
}

/// One parameter's part of a step.
#[derive(Clone, Debug)]
pub struct AdamWSlot<B: Backend> {
    /// The master weights.
    pub param: FloatTensor<B>,
    /// Its gradient, in any float dtype (read as the parameter's).
    pub grad: FloatTensor<B>,
    /// The moments, in the parameter's dtype and shape (zeros before the first step).
    pub moment_1: FloatTensor<B>,
    pub moment_2: FloatTensor<B>,
    /// Which step of this parameter this is, from 1 (the bias corrections' exponent).
    pub time: usize,
    /// Whether the parameter takes weight decay.
    pub decay: bool,
}

/// One parameter's new state.
#[derive(Clone, Debug)]
pub struct AdamWUpdate<B: Backend> {
    pub param: FloatTensor<B>,
    pub moment_1: FloatTensor<B>,
    pub moment_2: FloatTensor<B>,
    /// The new weights in the compute dtype, when one was asked for.
    pub compute: Option<FloatTensor<B>>,
}

/// One slot's scalars, as `f32` the way the tensor-op path rounds them.
#[derive(Clone, Copy, Debug)]
pub struct SlotScalars {
    pub lr: f32,
    /// `1 - lr * weight_decay`, or 1.
    pub decay: f32,
    pub beta_1: f32,
    pub beta_2: f32,
    /// `1 - beta_1`, `1 - beta_2`.
    pub rest_1: f32,
    pub rest_2: f32,
    /// `1 - beta^time`.
    pub correction_1: f32,
    pub correction_2: f32,
    pub epsilon: f32,
}

impl AdamWHyper {
    pub fn scalars(&self, time: usize, decay: bool) -> SlotScalars {
        let time = time as i32;
        SlotScalars {
            lr: self.lr as f32,
            decay: if decay && self.weight_decay > 0.0 { (1.0 - self.lr * self.weight_decay) as f32 } else { 1.0 },
            beta_1: self.beta_1,
            beta_2: self.beta_2,
            rest_1: 1.0 - self.beta_1,
            rest_2: 1.0 - self.beta_2,
            correction_1: 1.0 - self.beta_1.powi(time),
            correction_2: 1.0 - self.beta_2.powi(time),
            epsilon: self.epsilon,
        }
    }
}

/// A backend that takes a whole optimiser step in one call. The default is [`reference`].
pub trait FusedAdamWBackend: Backend {
    /// Clips the slots' gradients to a global norm of `hyper.max_norm`, then applies decoupled
    /// weight decay and AdamW to each slot. Returns the new states, in the slots' order, and the
    /// gradients' global norm before clipping (`[1]`, f32 on the fused backends). With
    /// `compute`, each update carries its new weights cast to that dtype.
    fn adamw_step(
        slots: Vec<AdamWSlot<Self>>,
        hyper: AdamWHyper,
        compute: Option<FloatDType>,
        device: &Device<Self>,
    ) -> (Vec<AdamWUpdate<Self>>, FloatTensor<Self>) {
        reference::adamw_step::<Self>(slots, hyper, compute, device)
    }
}
