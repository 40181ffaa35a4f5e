//! `Autodiff<B>`: the inner forward, and a backward from the four saved inputs.

use burn::backend::autodiff::{
    checkpoint::{base::Checkpointer, strategy::CheckpointStrategy},
    grads::Gradients,
    ops::{Backward, Ops, OpsKind},
    Autodiff, NodeId,
};
use burn::tensor::ops::FloatTensor;

use super::GatedMixBackend;

#[derive(Debug)]
struct GatedMixBackward;

impl<B: GatedMixBackend> Backward<B, 4> for GatedMixBackward {
    /// The branches' and the gates' nodes, in the op's input order.
    type State = [NodeId; 4];

    fn backward(self, ops: Ops<Self::State, 4>, grads: &mut Gradients, checkpointer: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let [o_0, o_1, o_2, gates] = ops.state.map(|id| checkpointer.retrieve_node_output::<FloatTensor<B>>(id));
        let ([d_0, d_1, d_2], d_gates) = B::gated_mix_backward([o_0, o_1, o_2], gates, grad);
        for (node, grad) in ops.parents.into_iter().zip([d_0, d_1, d_2, d_gates]) {
            if let Some(node) = node {
                grads.register::<B>(node.id, grad);
            }
        }
    }
}

impl<B: GatedMixBackend, C: CheckpointStrategy> GatedMixBackend for Autodiff<B, C> {
    fn gated_mix(branches: [FloatTensor<Self>; 3], gates: FloatTensor<Self>) -> FloatTensor<Self> {
        let [o_0, o_1, o_2] = branches;
        let nodes = [o_0.node.clone(), o_1.node.clone(), o_2.node.clone(), gates.node.clone()];
        match GatedMixBackward.prepare::<C>(nodes).compute_bound().stateful() {
            OpsKind::Tracked(mut prep) => {
                let state =
                    [prep.checkpoint(&o_0), prep.checkpoint(&o_1), prep.checkpoint(&o_2), prep.checkpoint(&gates)];
                prep.finish(state, B::gated_mix([o_0.primitive, o_1.primitive, o_2.primitive], gates.primitive))
            }
            OpsKind::UnTracked(prep) => {
                prep.finish(B::gated_mix([o_0.primitive, o_1.primitive, o_2.primitive], gates.primitive))
            }
        }
    }
}
