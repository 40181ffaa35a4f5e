//! `Autodiff<B>`: the inner backend's step, untracked (decoding is never differentiated).

use burn::backend::autodiff::{checkpoint::strategy::CheckpointStrategy, Autodiff};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::ops::FloatTensor;

use super::{DecodeAttentionBackend, DecodeBranches, DecodeStep, DecodeWrite, DecodeWritten};

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

    fn decode_write(step: DecodeWrite<Self>) -> Option<DecodeWritten<Self>> {
        let inner = |x: FloatTensor<Self>| x.primitive;
        let step = DecodeWrite {
            projected: inner(step.projected),
            gate_bias: inner(step.gate_bias),
            rotation: step.rotation.map(inner),
            positions: step.positions,
            caches: step.caches.map(|pair| pair.map(inner)),
            layout: step.layout,
        };
        let DecodeWritten { queries, gates, caches } = B::decode_write(step)?;
        let outer = <Self as AutodiffBackend>::from_inner;
        Some(DecodeWritten { queries: outer(queries), gates: outer(gates), caches: caches.map(|pair| pair.map(outer)) })
    }
}
