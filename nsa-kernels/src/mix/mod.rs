//! The gated sum of NSA's three branch outputs, `sum_i g_i o_i`, as a backend extension
//! ([`GatedMixBackend`]).
//!
//! Written as tensor ops, the sum broadcasts each gate `[B, T, H, 1]` over its branch's head
//! dimension: Burn runs those products one element per unit, and differentiates them through
//! separate element-wise and reduction kernels. On `CubeBackend` the forward is one kernel and
//! the backward another, which writes the three branch gradients and the gates' gradient (each
//! gate's products summed over the head dimension) in one pass.

mod autodiff;
#[cfg(feature = "cube")]
mod cube;
#[cfg(feature = "fusion")]
mod fusion;
#[cfg(feature = "cube")]
pub mod kernel;

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorPrimitive};

/// A backend with the gated mix and its gradients. The defaults are the tensor ops of
/// [`gated_mix_reference`]; `CubeBackend` runs kernels; autodiff saves the four inputs.
pub trait GatedMixBackend: Backend {
    /// `branches` `[B, T, H, d]` each, `gates` `[B, T, 3, H]` -> `[B, T, H, d]`.
    fn gated_mix(branches: [FloatTensor<Self>; 3], gates: FloatTensor<Self>) -> FloatTensor<Self> {
        gated_mix_reference(branches.map(float::<Self>), float::<Self>(gates)).into_primitive().tensor()
    }

    /// The gradients of the branches and of the gates for the output's gradient `grad`.
    fn gated_mix_backward(
        branches: [FloatTensor<Self>; 3],
        gates: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> ([FloatTensor<Self>; 3], FloatTensor<Self>) {
        let (gates, grad) = (float::<Self>(gates), float::<Self>(grad));
        let [b, t, h, _] = grad.dims();
        let gate = |i: usize| gates.clone().narrow(2, i, 1).reshape([b, t, h, 1]);
        let branch_grads = [0, 1, 2].map(|i| (grad.clone() * gate(i)).into_primitive().tensor());
        let gate_grads: Vec<Tensor<Self, 4>> =
            branches.into_iter().map(|o| (float::<Self>(o) * grad.clone()).sum_dim(3).reshape([b, t, 1, h])).collect();
        (branch_grads, Tensor::cat(gate_grads, 2).into_primitive().tensor())
    }
}

fn float<B: Backend>(x: FloatTensor<B>) -> Tensor<B, 4> {
    Tensor::from_primitive(TensorPrimitive::Float(x))
}

/// `sum_i gates[:, :, i, h] * branches[i][:, :, h, :]` in tensor ops: what the kernels compute,
/// differentiated by autodiff like any other expression.
pub fn gated_mix_reference<B: Backend>(branches: [Tensor<B, 4>; 3], gates: Tensor<B, 4>) -> Tensor<B, 4> {
    let [b, t, h, _] = branches[0].dims();
    let gate = |i: usize| gates.clone().narrow(2, i, 1).reshape([b, t, h, 1]);
    let [o_0, o_1, o_2] = branches;
    o_0 * gate(0) + o_1 * gate(1) + o_2 * gate(2)
}

/// [`GatedMixBackend::gated_mix`] on tensors; `gates` is cast to the branches' dtype.
pub fn gated_mix<B: GatedMixBackend>(branches: [Tensor<B, 4>; 3], gates: Tensor<B, 4>) -> Tensor<B, 4> {
    let gates = gates.cast(branches[0].dtype());
    let branches = branches.map(|o| o.into_primitive().tensor());
    float(B::gated_mix(branches, gates.into_primitive().tensor()))
}
