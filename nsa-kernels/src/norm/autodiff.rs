//! `Autodiff<B>`: the inner forward; the backward from the saved `x`, `gamma` and row statistics.

use burn::backend::autodiff::{
    checkpoint::{base::Checkpointer, strategy::CheckpointStrategy},
    grads::Gradients,
    ops::{Backward, Ops, OpsKind},
    Autodiff, NodeId,
};
use burn::tensor::ops::FloatTensor;

use super::RmsNormBackend;

#[derive(Debug)]
struct RmsNormBackward;

/// `x` and `gamma` through the checkpointer, and the forward's `1 / rms` per row.
#[derive(Debug, Clone)]
struct Saved<B: RmsNormBackend> {
    x: NodeId,
    gamma: NodeId,
    rstd: FloatTensor<B>,
}

impl<B: RmsNormBackend> Backward<B, 2> for RmsNormBackward {
    type State = Saved<B>;

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, checkpointer: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let Saved { x, gamma, rstd } = ops.state;
        let x: FloatTensor<B> = checkpointer.retrieve_node_output(x);
        let gamma: FloatTensor<B> = checkpointer.retrieve_node_output(gamma);
        let (grad_x, grad_gamma) = B::rms_norm_backward(x, gamma, rstd, grad);
        let [node_x, node_gamma] = ops.parents;
        for (node, grad) in [(node_x, grad_x), (node_gamma, grad_gamma)] {
            if let Some(node) = node {
                grads.register::<B>(node.id, grad);
            }
        }
    }
}

impl<B: RmsNormBackend, C: CheckpointStrategy> RmsNormBackend for Autodiff<B, C> {
    fn rms_norm(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        epsilon: f64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let untracked = <Self as burn::tensor::backend::AutodiffBackend>::from_inner;
        match RmsNormBackward.prepare::<C>([x.node.clone(), gamma.node.clone()]).compute_bound().stateful() {
            OpsKind::Tracked(mut prep) => {
                let (x_id, gamma_id) = (prep.checkpoint(&x), prep.checkpoint(&gamma));
                let (y, rstd) = B::rms_norm(x.primitive, gamma.primitive, epsilon);
                let state = Saved { x: x_id, gamma: gamma_id, rstd: rstd.clone() };
                (prep.finish(state, y), untracked(rstd))
            }
            OpsKind::UnTracked(prep) => {
                let (y, rstd) = B::rms_norm(x.primitive, gamma.primitive, epsilon);
                (prep.finish(y), untracked(rstd))
            }
        }
    }

    fn has_rms_norm_kernels() -> bool {
        B::has_rms_norm_kernels()
    }
}
