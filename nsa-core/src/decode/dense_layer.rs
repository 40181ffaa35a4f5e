//! Dense attention's prefill and decode step: every position's keys and values are cached.

use burn::tensor::Tensor;
use nsa_kernels::DecodeAttentionBackend;

use super::attend::attend;
use super::positions::DecodePositions;
use super::store::{KeyValues, TokenStore};
use crate::attention::projection::{apply, tokens_first_heads};
use crate::attention::DenseAttention;

impl<B: DecodeAttentionBackend> DenseAttention<B> {
    /// The forward of `x: [1, T, dim]` and its keys and values `[1, T, H_kv, d]` for the cache.
    pub fn prefill(&self, x: Tensor<B, 3>) -> (Tensor<B, 3>, KeyValues<B>) {
        let (keys, values) = self.kv.forward(x.clone(), &self.rope, None);
        (self.forward(x, None), KeyValues { keys, values })
    }

    /// One new token per sequence, `x: [B, 1, dim]` at the positions `at`: the output
    /// `[B, 1, dim]` and `cache` with the token's keys and values appended.
    pub fn decode(
        &self,
        x: Tensor<B, 3>,
        cache: TokenStore<B>,
        at: &DecodePositions<B>,
    ) -> (Tensor<B, 3>, TokenStore<B>) {
        let c = &self.config;
        let b = x.dims()[0];
        let q = at.rope.rotate(tokens_first_heads(apply(&self.query, x.clone()), c.n_heads));
        let q = q.reshape([b, c.n_kv_heads, c.n_heads / c.n_kv_heads, c.d_k]);
        let (k, v) = self.kv.forward_at(x, &at.rope);
        let store = cache.append(KeyValues { keys: k.swap_dims(1, 2), values: v.swap_dims(1, 2) }, &at.at);
        let visible = at.causal.clone().expect("decode positions built for a dense model");
        let (out, _) = attend(q, store.0.keys.clone(), store.0.values.clone(), visible);
        (apply(&self.output, out.reshape([b, 1, c.n_heads * c.d_v])), store)
    }
}
