//! SiLU whose backward keeps only its input, as a backend extension ([`ActivationBackend`]).
//!
//! Burn differentiates `silu(x) = x * sigmoid(x)` through its parts, so a forward keeps both `x`
//! and `sigmoid(x)` (the MLP's widest tensors) and its backward is several kernels. Here the
//! backward recomputes `sigmoid(x)` from the saved `x` in one fused expression:
//! `d silu / dx = s (1 + x (1 - s))`, `s = sigmoid(x)`.

use burn::backend::autodiff::{
    checkpoint::{base::Checkpointer, strategy::CheckpointStrategy},
    grads::Gradients,
    ops::{Backward, Ops, OpsKind},
    Autodiff, NodeId,
};
use burn::tensor::ops::FloatTensor;
use burn::tensor::{activation, backend::Backend, Shape, Tensor, TensorMetadata, TensorPrimitive};

/// A backend with SiLU and its input gradient. The defaults are Burn's tensor ops, which a
/// fusion backend fuses; autodiff overrides `silu` to save only the input.
pub trait ActivationBackend: Backend {
    /// `x * sigmoid(x)`, as Burn's `activation::silu` computes it.
    fn silu(x: FloatTensor<Self>) -> FloatTensor<Self> {
        let (x, shape) = flat::<Self>(x);
        Self::float_reshape(activation::silu(x).into_primitive().tensor(), shape)
    }

    /// `grad * d silu(x) / dx`.
    fn silu_backward(x: FloatTensor<Self>, grad: FloatTensor<Self>) -> FloatTensor<Self> {
        let ((x, shape), (grad, _)) = (flat::<Self>(x), flat::<Self>(grad));
        let s = activation::sigmoid(x.clone());
        let slope = s.clone() * (x * s.neg().add_scalar(1.0)).add_scalar(1.0);
        Self::float_reshape((grad * slope).into_primitive().tensor(), shape)
    }
}

/// A primitive as a flat tensor, with its shape (element-wise work does not care about rank).
fn flat<B: Backend>(x: FloatTensor<B>) -> (Tensor<B, 1>, Shape) {
    let shape = x.shape();
    let n = shape.num_elements();
    (Tensor::from_primitive(TensorPrimitive::Float(B::float_reshape(x, Shape::new([n])))), shape)
}

/// [`ActivationBackend::silu`] on tensors.
pub fn silu<B: ActivationBackend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(B::silu(x.into_primitive().tensor())))
}

#[derive(Debug)]
struct SiluBackward;

impl<B: ActivationBackend> Backward<B, 1> for SiluBackward {
    type State = NodeId;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, checkpointer: &mut Checkpointer) {
        let [node] = ops.parents;
        let grad = grads.consume::<B>(&ops.node);
        let x: FloatTensor<B> = checkpointer.retrieve_node_output(ops.state);
        if let Some(node) = node {
            grads.register::<B>(node.id, B::silu_backward(x, grad));
        }
    }
}

impl<B: ActivationBackend, C: CheckpointStrategy> ActivationBackend for Autodiff<B, C> {
    fn silu(x: FloatTensor<Self>) -> FloatTensor<Self> {
        match SiluBackward.prepare::<C>([x.node.clone()]).compute_bound().stateful() {
            OpsKind::Tracked(mut prep) => {
                let state = prep.checkpoint(&x);
                prep.finish(state, B::silu(x.primitive))
            }
            OpsKind::UnTracked(prep) => prep.finish(B::silu(x.primitive)),
        }
    }
}

#[cfg(feature = "cube")]
impl<
        R: burn_cubecl::CubeRuntime,
        F: burn_cubecl::FloatElement,
        I: burn_cubecl::IntElement,
        BT: burn_cubecl::element::BoolElement,
    > ActivationBackend for burn_cubecl::CubeBackend<R, F, I, BT>
{
}

#[cfg(feature = "fusion")]
impl<B: burn_fusion::FusionBackend + ActivationBackend> ActivationBackend for burn_fusion::Fusion<B> {}
