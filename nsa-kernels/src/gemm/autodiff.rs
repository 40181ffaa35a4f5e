//! `Autodiff<B>`: the product forward, and its two gradients as products again.

use burn::backend::autodiff::{
    checkpoint::{base::Checkpointer, strategy::CheckpointStrategy},
    grads::Gradients,
    ops::{Backward, Ops, OpsKind},
    Autodiff, NodeId,
};
use burn::tensor::ops::FloatTensor;

use super::GemmBackend;

#[derive(Debug)]
struct GemmBackward;

/// The inputs (through the checkpointer) and the transposes of `C = op(A) op(B)`. An input is
/// kept only when the other one takes a gradient: `x S` with a constant `S` (RoPE's swap) keeps
/// `S` alone, not the activation `x`.
#[derive(Debug, Clone)]
struct Saved {
    a: Option<NodeId>,
    b: Option<NodeId>,
    transpose_a: bool,
    transpose_b: bool,
}

impl<B: GemmBackend> Backward<B, 2> for GemmBackward {
    type State = Saved;

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, checkpointer: &mut Checkpointer) {
        let [node_a, node_b] = ops.parents;
        let grad = grads.consume::<B>(&ops.node);
        let Saved { a, b, transpose_a: ta, transpose_b: tb } = ops.state;
        let a: Option<FloatTensor<B>> = a.map(|a| checkpointer.retrieve_node_output(a));
        let b: Option<FloatTensor<B>> = b.map(|b| checkpointer.retrieve_node_output(b));
        // d op(A) = dC op(B)^T and d op(B) = op(A)^T dC, transposed back where op transposed.
        if let Some(node) = node_a {
            let b = b.expect("B is kept when A takes a gradient");
            let da = match ta {
                false => B::gemm(grad.clone(), b.clone(), false, !tb),
                true => B::gemm(b, grad.clone(), tb, true),
            };
            grads.register::<B>(node.id, da);
        }
        if let Some(node) = node_b {
            let a = a.expect("A is kept when B takes a gradient");
            let db = match tb {
                false => B::gemm(a, grad, !ta, false),
                true => B::gemm(grad, a, true, ta),
            };
            grads.register::<B>(node.id, db);
        }
    }
}

impl<B: GemmBackend, C: CheckpointStrategy> GemmBackend for Autodiff<B, C> {
    fn gemm(a: FloatTensor<Self>, b: FloatTensor<Self>, transpose_a: bool, transpose_b: bool) -> FloatTensor<Self> {
        match GemmBackward.prepare::<C>([a.node.clone(), b.node.clone()]).compute_bound().stateful() {
            OpsKind::Tracked(mut prep) => {
                let keep_a = b.is_tracked().then(|| prep.checkpoint(&a));
                let keep_b = a.is_tracked().then(|| prep.checkpoint(&b));
                let state = Saved { a: keep_a, b: keep_b, transpose_a, transpose_b };
                prep.finish(state, B::gemm(a.primitive, b.primitive, transpose_a, transpose_b))
            }
            OpsKind::UnTracked(prep) => prep.finish(B::gemm(a.primitive, b.primitive, transpose_a, transpose_b)),
        }
    }
}
