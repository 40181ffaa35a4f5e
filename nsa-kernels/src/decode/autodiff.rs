//! `Autodiff<B>`: the inner backend's step, untracked (decoding is never differentiated).

use burn::backend::autodiff::{checkpoint::strategy::CheckpointStrategy, Autodiff};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::ops::FloatTensor;

use super::{DecodeAttentionBackend, DecodeBranches, DecodeStep};

impl<B: DecodeAttentionBackend, C: CheckpointStrategy> DecodeAttentionBackend for Autodiff<B, C> {
    fn has_decode_kernel() -> bool {
        B::has_decode_kernel()
    }

    fn decode_attention(step: DecodeStep<Self>) -> Option<DecodeBranches<Self>> {
        let inner = |pair: [FloatTensor<Self>; 2]| pair.map(|x| x.primitive);
        let step = DecodeStep {
            q: step.q.primitive,
            compressed: inner(step.compressed),
            selected: inner(step.selected),
            window: inner(step.window),
            positions: step.positions,
            selection: step.selection,
        };
        let DecodeBranches { outputs, blocks } = B::decode_attention(step)?;
        Some(DecodeBranches { outputs: outputs.map(<Self as AutodiffBackend>::from_inner), blocks })
    }
}
