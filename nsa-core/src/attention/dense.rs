//! Full causal GQA attention in the same model, for A/B comparisons with NSA.

use burn::module::Module;
use burn::nn::Linear;
use burn::tensor::{backend::Backend, Tensor};

use super::masks::sliding_window;
use super::projection::{apply, linear, merge_heads, split_heads, KvProjection};
use super::softmax::masked_attention;
use crate::config::NsaConfig;
use crate::rope::Rope;
use nsa_kernels::GemmBackend;

#[derive(Module, Debug)]
pub struct DenseAttention<B: Backend> {
    pub query: Linear<B>,
    pub kv: KvProjection<B>,
    pub output: Linear<B>,
    pub rope: Rope<B>,
    #[module(skip)]
    pub config: NsaConfig,
}

impl NsaConfig {
    /// Dense causal attention with the head shape of this config.
    pub fn init_dense<B: Backend>(
        &self,
        max_len: usize,
        std: f64,
        out_std: f64,
        device: &B::Device,
    ) -> DenseAttention<B> {
        crate::materialize(DenseAttention {
            query: linear(self.dim, self.n_heads * self.d_k, std, device),
            kv: KvProjection::new(self.dim, self.n_kv_heads, self.d_k, self.d_v, std, device),
            output: linear(self.n_heads * self.d_v, self.dim, out_std, device),
            rope: Rope::new(max_len, self.d_k, self.rope_base, device),
            config: self.clone(),
        })
    }
}

impl<B: GemmBackend> DenseAttention<B> {
    /// `x: [B, T, dim]` -> `[B, T, dim]`.
    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let c = &self.config;
        let [b, t, _] = x.dims();
        let q = self.rope.apply(split_heads(apply(&self.query, x.clone()), c.n_heads));
        let q = q.reshape([b, c.n_kv_heads, c.group_size(), t, c.d_k]);
        let (k, v) = self.kv.forward(x, &self.rope);
        let (k, v) = (k.swap_dims(1, 2), v.swap_dims(1, 2));
        let causal = sliding_window::<B>(t, t, &q.device()).reshape([1, 1, 1, t, t]);
        let (out, _) = masked_attention(q, k, v, causal);
        apply(&self.output, merge_heads(out.reshape([b, c.n_heads, t, c.d_v])))
    }
}
