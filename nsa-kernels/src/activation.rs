//! SiLU whose backward keeps only its input, as a backend extension ([`ActivationBackend`]).
//!
//! Burn differentiates `silu(x) = x * sigmoid(x)` through its parts, so a forward keeps both `x`
//! and `sigmoid(x)` (the MLP's widest tensors) and its backward is several kernels. Here the
//! backward recomputes `sigmoid(x)` from the saved `x` in one fused expression:
//! `d silu / dx = s (1 + x (1 - s))`, `s = sigmoid(x)`.
//!
//! [`silu_linear_matmul`] goes one step further for the MLP's `down(silu(h))`: the product's
//! backward needs `silu(h)` as well, and keeping it beside `h` doubles what the MLP holds per
//! token. The fused op keeps `h` alone and recomputes `silu(h)` (one element-wise pass) in the
//! backward.

use burn::backend::autodiff::{
    checkpoint::{base::Checkpointer, strategy::CheckpointStrategy},
    grads::Gradients,
    ops::{Backward, Ops, OpsKind},
    Autodiff, NodeId,
};
use burn::tensor::ops::FloatTensor;
use burn::tensor::{activation, backend::Backend, Shape, Tensor, TensorMetadata, TensorPrimitive};

use crate::gemm::GemmBackend;

/// A backend with SiLU and its input gradient. The defaults are Burn's tensor ops, which a
/// fusion backend fuses; autodiff overrides `silu` to save only the input.
pub trait ActivationBackend: GemmBackend {
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

    /// `silu(h) w` for `h [M, K]`, `w [K, N]`. Autodiff overrides it to keep `h`, not `silu(h)`.
    fn silu_gemm(h: FloatTensor<Self>, w: FloatTensor<Self>) -> FloatTensor<Self> {
        Self::gemm(Self::silu(h), w, false, false)
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

/// `silu(h) w`, `h [..., K]`, `w [K, N]` -> `[..., N]`: the MLP's down projection of its
/// activation, whose backward keeps `h` and recomputes `silu(h)`.
pub fn silu_linear_matmul<B: ActivationBackend, const D: usize>(h: Tensor<B, D>, w: Tensor<B, 2>) -> Tensor<B, D> {
    let dims = h.dims();
    let rows = dims[..D - 1].iter().product::<usize>();
    let h = h.reshape([rows, dims[D - 1]]).into_primitive().tensor();
    let out = B::silu_gemm(h, w.clone().into_primitive().tensor());
    let mut out_dims = dims;
    out_dims[D - 1] = w.dims()[1];
    Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(out)).reshape(out_dims)
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

#[derive(Debug)]
struct SiluGemmBackward;

/// What `silu(h) w` keeps: `h` when either input takes a gradient (both gradients go through
/// `silu(h)`), `w` when `h` does.
#[derive(Debug, Clone)]
struct SiluGemmSaved {
    h: Option<NodeId>,
    w: Option<NodeId>,
}

impl<B: ActivationBackend> Backward<B, 2> for SiluGemmBackward {
    type State = SiluGemmSaved;

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, checkpointer: &mut Checkpointer) {
        let [node_h, node_w] = ops.parents;
        let grad = grads.consume::<B>(&ops.node);
        let h: Option<FloatTensor<B>> = ops.state.h.map(|h| checkpointer.retrieve_node_output(h));
        let w: Option<FloatTensor<B>> = ops.state.w.map(|w| checkpointer.retrieve_node_output(w));
        let h = h.expect("h is kept when anything takes a gradient");
        if let Some(node) = node_w {
            grads.register::<B>(node.id, B::gemm(B::silu(h.clone()), grad.clone(), true, false));
        }
        if let Some(node) = node_h {
            let w = w.expect("w is kept when h takes a gradient");
            grads.register::<B>(node.id, B::silu_backward(h, B::gemm(grad, w, false, true)));
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

    fn silu_gemm(h: FloatTensor<Self>, w: FloatTensor<Self>) -> FloatTensor<Self> {
        match SiluGemmBackward.prepare::<C>([h.node.clone(), w.node.clone()]).compute_bound().stateful() {
            OpsKind::Tracked(mut prep) => {
                let state =
                    SiluGemmSaved { h: Some(prep.checkpoint(&h)), w: h.is_tracked().then(|| prep.checkpoint(&w)) };
                prep.finish(state, B::silu_gemm(h.primitive, w.primitive))
            }
            OpsKind::UnTracked(prep) => prep.finish(B::silu_gemm(h.primitive, w.primitive)),
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
