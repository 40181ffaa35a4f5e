//! A decode step's projections as one product. At one token per sequence an op costs the host
//! about what it costs the device, so the layer's eight products (`W_q`, each branch's `W_k` and
//! `W_v`, the gates') are one, the weights laid side by side once, when a cache is made. On a
//! backend with a decode kernel, the rotations, the gates' sigmoid and the cache writes that
//! follow are one more launch ([`nsa_kernels::decode_write`]); elsewhere [`StepProjection::split`]
//! does them in tensor ops.

use burn::tensor::{backend::Backend, Tensor};
use nsa_kernels::{decode_linear, DecodeAttentionBackend, StepInput, StepLayout};

use super::store::KeyValues;
use crate::attention::{sigmoid, NsaAttention};
use crate::rope::RopeRows;

/// One NSA layer's decode projections: `[dim, width]` weights whose columns are the queries,
/// every key set, every value set and the gates, in that order (the queries and keys, which
/// are rotated, side by side), and the gates' bias.
#[derive(Clone, Debug)]
pub struct StepProjection<B: Backend> {
    weight: Tensor<B, 2>,
    gate_bias: Tensor<B, 1>,
    layout: StepLayout,
}

/// What a step's projection gives a layer, one token per sequence.
pub struct Projected<B: Backend> {
    /// Rotated queries `[B, 1, H_q, d_k]`.
    pub queries: Tensor<B, 4>,
    /// Rotated keys and values `[B, 1, H_kv, d]` of each branch, in gate order.
    pub branches: [KeyValues<B>; 3],
    /// Gate values `[B, 1, 3, H]`.
    pub gates: Tensor<B, 4>,
}

impl<B: DecodeAttentionBackend> StepProjection<B> {
    /// `layer`'s weights side by side, in the dtype the layer holds them.
    pub fn new(layer: &NsaAttention<B>) -> Self {
        let c = &layer.config;
        let layout =
            StepLayout { heads: c.n_heads, kv_heads: c.n_kv_heads, d_k: c.d_k, d_v: c.d_v, kv_sets: layer.kv.len() };
        let mut weights = vec![layer.query.weight.val()];
        weights.extend(layer.kv.iter().map(|kv| kv.key.weight.val()));
        weights.extend(layer.kv.iter().map(|kv| kv.value.weight.val()));
        weights.push(layer.gate.weight.val());
        let gate_bias = layer.gate.bias.as_ref().expect("the gates have a bias").val();
        StepProjection { weight: Tensor::cat(weights, 1), gate_bias, layout }
    }

    pub fn layout(&self) -> StepLayout {
        self.layout
    }

    /// The gates' bias `[3 H]`.
    pub fn gate_bias(&self) -> Tensor<B, 1> {
        self.gate_bias.clone()
    }

    /// The product of `f(x)`, `x: [B, 1, dim]`: `[B, width]`, without bias.
    pub fn product(&self, x: Tensor<B, 3>, input: StepInput<Tensor<B, 1>>) -> Tensor<B, 2> {
        let [b, _, dim] = x.dims();
        decode_linear(x.reshape([b, dim]), input, self.weight.clone(), None)
    }

    /// The product `y: [B, width]` split into the step's projections, rotated by `rope`.
    pub fn split(&self, y: Tensor<B, 2>, rope: &RopeRows<B>) -> Projected<B> {
        let StepLayout { heads: h, kv_heads: h_kv, d_k, d_v, kv_sets: sets } = self.layout;
        let b = y.dims()[0];
        let rotated_heads = h + sets * h_kv;
        let rotated = rope.rotate(y.clone().narrow(1, 0, rotated_heads * d_k).reshape([b, 1, rotated_heads, d_k]));
        let values_at = rotated_heads * d_k;
        let set = |i: usize| KeyValues {
            keys: rotated.clone().narrow(2, h + i * h_kv, h_kv),
            values: y.clone().narrow(1, values_at + i * h_kv * d_v, h_kv * d_v).reshape([b, 1, h_kv, d_v]),
        };
        let branches = match sets {
            1 => [set(0), set(0), set(0)],
            _ => [set(0), set(1), set(2)],
        };
        let gates_at = values_at + sets * h_kv * d_v;
        let logits = y.narrow(1, gates_at, 3 * h) + self.gate_bias.clone().unsqueeze();
        Projected { queries: rotated.narrow(2, 0, h), branches, gates: sigmoid(logits).reshape([b, 1, 3, h]) }
    }
}
