//! Full causal GQA attention in the same model, for A/B comparisons with NSA.

use burn::config::Config;
use burn::module::Module;
use burn::nn::Linear;
use burn::tensor::{backend::Backend, Tensor};

use super::projection::{apply, linear, tokens_first_heads, KvProjection, KvProjectionConfig};
use crate::config::NsaConfig;
use crate::rope::{Rope, RopeConfig};
use nsa_kernels::sparse::reference;
use nsa_kernels::{sparse_attention, Documents, Keys, SparseAttentionBackend};

#[derive(Module, Debug)]
pub struct DenseAttention<B: Backend> {
    pub query: Linear<B>,
    pub kv: KvProjection<B>,
    pub output: Linear<B>,
    pub rope: Rope<B>,
    #[module(skip)]
    pub config: NsaConfig,
}

/// Dense causal attention with the head shape of `layer`, for positions up to `max_len`:
/// projections drawn from `N(0, std)`, the output projection from `N(0, out_std)`.
#[derive(Config, Debug)]
pub struct DenseAttentionConfig {
    pub layer: NsaConfig,
    pub max_len: usize,
    #[config(default = 0.02)]
    pub std: f64,
    #[config(default = 0.02)]
    pub out_std: f64,
}

impl DenseAttentionConfig {
    pub fn init<B: Backend>(&self, device: &B::Device) -> DenseAttention<B> {
        let c = &self.layer;
        crate::materialize(DenseAttention {
            query: linear(c.dim, c.n_heads * c.d_k, self.std, device),
            kv: KvProjectionConfig::new(c.dim, c.n_kv_heads, c.d_k, c.d_v).with_std(self.std).init(device),
            output: linear(c.n_heads * c.d_v, c.dim, self.out_std, device),
            rope: RopeConfig::new(self.max_len, c.d_k).with_base(c.rope_base).init(device),
            config: c.clone(),
        })
    }
}

impl<B: SparseAttentionBackend> DenseAttention<B> {
    /// `x: [B, T, dim]` -> `[B, T, dim]`, each position attending its own document's with
    /// `documents`.
    pub fn forward(&self, x: Tensor<B, 3>, documents: Option<&Documents<B>>) -> Tensor<B, 3> {
        let c = &self.config;
        let [b, t, _] = x.dims();
        let q = self.rope.apply_tokens_first(tokens_first_heads(apply(&self.query, x.clone()), c.n_heads), documents);
        let (k, v) = self.kv.forward(x, &self.rope, documents);
        // Causal attention is a window as long as the row: NSA's fused window kernels (flash
        // attention, nothing `T x T` kept), or the reference with its probabilities materialised.
        let keys = Keys::window(t, documents);
        let (out, _) = match c.fused_kernels {
            true => sparse_attention(q, k, v, &keys),
            false => reference::forward(q, k, v, &keys),
        };
        apply(&self.output, out.reshape([b, t, c.n_heads * c.d_v]))
    }
}
