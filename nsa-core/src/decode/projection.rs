//! A decode step's projections as one product. At one token per sequence a product costs the
//! host about what it costs the device, so the layer's seven products (`W_q`, each branch's
//! `W_k` and `W_v`), four rotations and the gates' product and bias become one product, one
//! bias add and one rotation: the weights are laid side by side once, when a cache is made.

use burn::tensor::{backend::Backend, Tensor};
use nsa_kernels::{linear_matmul, GemmBackend};

use super::store::KeyValues;
use crate::attention::{sigmoid, NsaAttention};
use crate::config::NsaConfig;
use crate::rope::RopeRows;

/// One NSA layer's decode projections: `[dim, width]` weights whose columns are the queries,
/// every key set, every value set and the gates, in that order (the queries and keys, which
/// are rotated, side by side), and a `[width]` bias that is zero outside the gates.
#[derive(Clone, Debug)]
pub struct StepProjection<B: Backend> {
    weight: Tensor<B, 2>,
    bias: Tensor<B, 1>,
    /// Key/value sets: 3, or 1 when the branches share theirs.
    kv_sets: usize,
}

/// What a step's projection gives a layer, one token per sequence.
pub struct Projected<B: Backend> {
    /// Rotated queries `[B, 1, H_q, d_k]`.
    pub queries: Tensor<B, 4>,
    /// Rotated keys and values `[B, 1, H_kv, d]` of each branch, in gate order.
    pub branches: [KeyValues<B>; 3],
    /// Gate values `[B, 1, 3, H_q]`.
    pub gates: Tensor<B, 4>,
}

impl<B: GemmBackend> StepProjection<B> {
    /// `layer`'s weights side by side, in the dtype the layer holds them.
    pub fn new(layer: &NsaAttention<B>) -> Self {
        let kv_sets = layer.kv.len();
        let mut weights = vec![layer.query.weight.val()];
        weights.extend(layer.kv.iter().map(|kv| kv.key.weight.val()));
        weights.extend(layer.kv.iter().map(|kv| kv.value.weight.val()));
        weights.push(layer.gate.weight.val());
        let gate_bias = layer.gate.bias.as_ref().expect("the gates have a bias").val();
        let ungated = Tensor::zeros([Self::gates_at(&layer.config, kv_sets)], (&gate_bias.device(), gate_bias.dtype()));
        StepProjection { weight: Tensor::cat(weights, 1), bias: Tensor::cat(vec![ungated, gate_bias], 0), kv_sets }
    }

    /// The column where the gates start: after the queries and every key and value set.
    fn gates_at(c: &NsaConfig, kv_sets: usize) -> usize {
        c.n_heads * c.d_k + kv_sets * c.n_kv_heads * (c.d_k + c.d_v)
    }

    /// The projections of `x: [B, 1, dim]` for a layer of shape `c`, rotated by `rope`.
    pub fn forward(&self, x: Tensor<B, 3>, c: &NsaConfig, rope: &RopeRows<B>) -> Projected<B> {
        let b = x.dims()[0];
        let (h, h_kv, sets) = (c.n_heads, c.n_kv_heads, self.kv_sets);
        let y = linear_matmul(x, self.weight.clone()) + self.bias.clone().unsqueeze();
        let rotated_heads = h + sets * h_kv;
        let rotated = rope.rotate(y.clone().narrow(2, 0, rotated_heads * c.d_k).reshape([b, 1, rotated_heads, c.d_k]));
        let values_at = rotated_heads * c.d_k;
        let set = |i: usize| KeyValues {
            keys: rotated.clone().narrow(2, h + i * h_kv, h_kv),
            values: y.clone().narrow(2, values_at + i * h_kv * c.d_v, h_kv * c.d_v).reshape([b, 1, h_kv, c.d_v]),
        };
        let branches = match sets {
            1 => [set(0), set(0), set(0)],
            _ => [set(0), set(1), set(2)],
        };
        let gates = sigmoid(y.narrow(2, Self::gates_at(c, sets), 3 * h)).reshape([b, 1, 3, h]);
        Projected { queries: rotated.narrow(2, 0, h), branches, gates }
    }
}
