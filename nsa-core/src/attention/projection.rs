//! Linear projections into heads.

use burn::config::Config;
use burn::module::Module;
use burn::nn::{Initializer, Linear, LinearConfig};
use burn::tensor::{backend::Backend, Tensor};
use nsa_kernels::{linear_matmul, Documents, GemmBackend};

use crate::rope::{Rope, RopeRows};

/// A bias-free linear layer drawn from `N(0, std)`.
pub fn linear<B: Backend>(d_in: usize, d_out: usize, std: f64, device: &B::Device) -> Linear<B> {
    LinearConfig::new(d_in, d_out)
        .with_bias(false)
        .with_initializer(Initializer::Normal { mean: 0.0, std })
        .init(device)
}

/// `x W (+ b)`: a linear layer through the backend's product (cuBLASLt on CUDA), which Burn's
/// `Linear::forward` would send to Burn's matmul.
pub fn apply<B: GemmBackend, const D: usize>(layer: &Linear<B>, x: Tensor<B, D>) -> Tensor<B, D> {
    let out = linear_matmul(x, layer.weight.val());
    match &layer.bias {
        Some(bias) => out + bias.val().unsqueeze(),
        None => out,
    }
}

/// `[B, T, H*d]` -> `[B, H, T, d]`.
pub fn split_heads<B: Backend>(x: Tensor<B, 3>, heads: usize) -> Tensor<B, 4> {
    let [b, t, hd] = x.dims();
    x.reshape([b, t, heads, hd / heads]).swap_dims(1, 2)
}

/// `[B, T, H*d]` -> `[B, T, H, d]` (a view).
pub fn tokens_first_heads<B: Backend>(x: Tensor<B, 3>, heads: usize) -> Tensor<B, 4> {
    let [b, t, hd] = x.dims();
    x.reshape([b, t, heads, hd / heads])
}

/// `[B, H, T, d]` -> `[B, T, H*d]`.
pub fn merge_heads<B: Backend>(x: Tensor<B, 4>) -> Tensor<B, 3> {
    let [b, h, t, d] = x.dims();
    x.swap_dims(1, 2).reshape([b, t, h * d])
}

/// One branch's key and value projections (`W^c_k`, `W^c_v`).
#[derive(Module, Debug)]
pub struct KvProjection<B: Backend> {
    pub key: Linear<B>,
    pub value: Linear<B>,
    kv_heads: usize,
}

/// A branch's key and value projections from `dim` to `kv_heads` heads of `d_k` and `d_v`,
/// weights drawn from `N(0, std)`.
#[derive(Config, Debug)]
pub struct KvProjectionConfig {
    pub dim: usize,
    pub kv_heads: usize,
    pub d_k: usize,
    pub d_v: usize,
    #[config(default = 0.02)]
    pub std: f64,
}

impl KvProjectionConfig {
    pub fn init<B: Backend>(&self, device: &B::Device) -> KvProjection<B> {
        KvProjection {
            key: linear(self.dim, self.kv_heads * self.d_k, self.std, device),
            value: linear(self.dim, self.kv_heads * self.d_v, self.std, device),
            kv_heads: self.kv_heads,
        }
    }
}

impl<B: GemmBackend> KvProjection<B> {
    /// Keys rotated at their positions (in their documents, with `documents`) `[B, T, H_kv, d_k]`
    /// and values `[B, T, H_kv, d_v]` (tokens before heads: the layout the projection writes, so
    /// no copy is made).
    pub fn forward(
        &self,
        x: Tensor<B, 3>,
        rope: &Rope<B>,
        documents: Option<&Documents<B>>,
    ) -> (Tensor<B, 4>, Tensor<B, 4>) {
        let k = rope.apply_tokens_first(tokens_first_heads(apply(&self.key, x.clone()), self.kv_heads), documents);
        let v = tokens_first_heads(apply(&self.value, x), self.kv_heads);
        (k, v)
    }

    /// [`Self::forward`] for one token per sequence, `x: [B, 1, dim]`, rotated by `rope` (each
    /// row's position).
    pub fn forward_at(&self, x: Tensor<B, 3>, rope: &RopeRows<B>) -> (Tensor<B, 4>, Tensor<B, 4>) {
        let k = rope.rotate(tokens_first_heads(apply(&self.key, x.clone()), self.kv_heads));
        let v = tokens_first_heads(apply(&self.value, x), self.kv_heads);
        (k, v)
    }
}
