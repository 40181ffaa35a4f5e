//! Full causal GQA attention in the same model, for A/B comparisons with NSA.

use burn::module::Module;
use burn::nn::Linear;
use burn::tensor::{backend::Backend, Tensor};

use super::projection::{apply, linear, merge_heads, split_heads, KvProjection};
use crate::config::NsaConfig;
use crate::rope::Rope;
use nsa_kernels::{reference, GemmBackend, Keys};

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
        let [_, t, _] = x.dims();
        let q = self.rope.apply(split_heads(apply(&self.query, x.clone()), c.n_heads)).swap_dims(1, 2);
        let (k, v) = self.kv.forward(x, &self.rope);
        // Causal attention is a window as long as the sequence: the reference every kernel is
        // held to, with the probabilities materialised (`B * H * T^2`).
        let (out, _) = reference::forward(q, k, v, &Keys::Window { w: t });
        apply(&self.output, merge_heads(out.swap_dims(1, 2)))
    }
}
