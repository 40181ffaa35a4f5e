//! The NSA layer: exactly `shared/docs/nsa-spec.md`, as batched tensor code.
//!
//! The three branches go through `nsa_kernels::sparse_attention` (the compressed one with
//! `Keys::Compressed`): fused CubeCL kernels on CUDA and WGPU, masked dense attention (O(T^2)
//! memory, `B * H_q * T^2` scores per branch) on every other backend and when `fused_kernels`
//! is off. The selection (scores and top-n) is `nsa_kernels::select_blocks`' one kernel where
//! the backend has it, which writes only the block lists; else the scores in tensor ops and a
//! tensor-op rank that materialises `B * H_kv * T * n_sel^2` booleans.

use burn::config::Config;
use burn::module::{Module, Param};
use burn::nn::{Initializer, Linear, LinearConfig};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Int, Tensor};
use nsa_kernels::sparse::reference;
use nsa_kernels::{
    gated_mix, gated_mix_reference, select_blocks, sparse_attention, Documents, Keys, Selection, SparseAttentionBackend,
};

use super::compress::{Compressor, CompressorConfig};
use super::projection::{apply, linear, tokens_first_heads, KvProjection, KvProjectionConfig};
use super::selection::{num_selection_blocks, select_top_n, selected_list};
use crate::config::NsaConfig;
use crate::rope::{Rope, RopeConfig};

/// The three branches, in gate order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Branch {
    Compressed = 0,
    Selected = 1,
    Window = 2,
}

/// What one forward pass computed besides its output, for tests and training metrics.
#[derive(Debug, Clone)]
pub struct NsaAux<B: Backend> {
    /// Gate values `[B, T, 3, H_q]`, branch order [`Branch`].
    pub gates: Tensor<B, 4>,
    /// Selected blocks `[B, T, H_kv, n]` (ascending, `-1` in unused slots), shared by the
    /// heads of each group.
    pub blocks: Tensor<B, 4, Int>,
}

impl<B: AutodiffBackend> NsaAux<B> {
    /// The same tensors outside the autodiff graph.
    pub fn inner(self) -> NsaAux<B::InnerBackend> {
        NsaAux { gates: self.gates.inner(), blocks: self.blocks.inner() }
    }
}

#[derive(Module, Debug)]
pub struct NsaAttention<B: Backend> {
    /// `W_q`, shared by the three branches.
    pub query: Linear<B>,
    /// Per-branch K/V (`[cmp, slc, win]`), or one shared K/V when `shared_kv`.
    pub kv: Vec<KvProjection<B>>,
    pub compressor: Compressor<B>,
    /// `dim -> 3 * H_q`, one sigmoid gate per branch and query head.
    pub gate: Linear<B>,
    /// `W_o`.
    pub output: Linear<B>,
    pub rope: Rope<B>,
    #[module(skip)]
    pub config: NsaConfig,
}

/// The NSA layer of `layer`'s shape, for positions up to `max_len`: projections drawn from
/// `N(0, std)` and the output projection from `N(0, out_std)` (the model scales it down with
/// depth).
#[derive(Config, Debug)]
pub struct NsaAttentionConfig {
    pub layer: NsaConfig,
    pub max_len: usize,
    #[config(default = 0.02)]
    pub std: f64,
    #[config(default = 0.02)]
    pub out_std: f64,
}

impl NsaAttentionConfig {
    pub fn init<B: Backend>(&self, device: &B::Device) -> NsaAttention<B> {
        let c = &self.layer;
        let kv_sets = if c.shared_kv { 1 } else { 3 };
        let kv = KvProjectionConfig::new(c.dim, c.n_kv_heads, c.d_k, c.d_v).with_std(self.std);
        crate::materialize(NsaAttention {
            query: linear(c.dim, c.n_heads * c.d_k, self.std, device),
            kv: (0..kv_sets).map(|_| kv.init(device)).collect(),
            compressor: CompressorConfig::new(c.phi, c.l, c.d, c.d_k, c.d_v).with_hidden(c.phi_hidden).init(device),
            gate: gate_linear(c.dim, 3 * c.n_heads, c.gate_init, device),
            output: linear(c.n_heads * c.d_v, c.dim, self.out_std, device),
            rope: RopeConfig::new(self.max_len, c.d_k).with_base(c.rope_base).init(device),
            config: c.clone(),
        })
    }
}

/// Zero weights and a bias of `logit(init)`: every gate starts at exactly `init`.
fn gate_linear<B: Backend>(d_in: usize, d_out: usize, init: f64, device: &B::Device) -> Linear<B> {
    let mut gate = LinearConfig::new(d_in, d_out).with_initializer(Initializer::Zeros).init(device);
    let logit = (init / (1.0 - init)).ln();
    gate.bias = Some(Param::from_tensor(Tensor::full([d_out], logit, device)));
    gate
}

/// `sigmoid(x) = (1 + tanh(x / 2)) / 2`: stable for any `x` and computed in the storage dtype
/// (Burn's own sigmoid rounds through f32, which would cap the float64 reference checks).
pub(crate) fn sigmoid<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    x.mul_scalar(0.5).tanh().add_scalar(1.0).mul_scalar(0.5)
}

impl<B: SparseAttentionBackend> NsaAttention<B> {
    /// `x: [B, T, dim]` -> `[B, T, dim]`.
    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        self.forward_with_aux(x, None).0
    }

    /// The output and what the layer selected and gated. With `documents`, each row is packed
    /// documents and every position is computed as if its document were alone, from its start.
    ///
    /// Every per-head tensor is `[B, T, H, d]` (tokens before heads), the layout the
    /// projections write and the attention ops read, so no branch copies a tensor to reorder it.
    pub fn forward_with_aux(&self, x: Tensor<B, 3>, documents: Option<&Documents<B>>) -> (Tensor<B, 3>, NsaAux<B>) {
        let q = self.queries(x.clone(), documents);
        let (o_cmp, compressed) = self.compressed_branch(q.clone(), x.clone(), documents);
        let blocks = self.select(q.clone(), compressed, &x, documents);
        let o_slc = self.selected_branch(q.clone(), x.clone(), blocks.clone(), documents);
        let o_win = self.window_branch(q, x.clone(), documents);
        let (out, gates) = self.mix(x, [o_cmp, o_slc, o_win]);
        (out, NsaAux { gates, blocks })
    }

    /// Rotated queries `[B, T, H_q, d_k]` for `x: [B, T, dim]`.
    pub fn queries(&self, x: Tensor<B, 3>, documents: Option<&Documents<B>>) -> Tensor<B, 4> {
        self.rope.apply_tokens_first(tokens_first_heads(apply(&self.query, x), self.config.n_heads), documents)
    }

    /// The compressed branch's output `[B, T, H_q, d_v]` and, when a compressed block exists,
    /// what the selection scores are computed from: the compressed keys `[B, N, H_kv, d_k]` and
    /// the branch's log-sum-exp `[B, T, H_q]`. Queries that see no block yet output zeros.
    #[allow(clippy::type_complexity)]
    pub fn compressed_branch(
        &self,
        q: Tensor<B, 4>,
        x: Tensor<B, 3>,
        documents: Option<&Documents<B>>,
    ) -> (Tensor<B, 4>, Option<(Tensor<B, 4>, Tensor<B, 3>)>) {
        let c = &self.config;
        let (k, v) = self.kv(Branch::Compressed).forward(x, &self.rope, documents);
        let Some((k_cmp, v_cmp)) = self.compressor.forward(k, v) else {
            let [b, t, h_q, _] = q.dims();
            return (Tensor::zeros([b, t, h_q, c.d_v], (&q.device(), q.dtype())), None);
        };
        let (out, lse) = self.attend(q, k_cmp.clone(), v_cmp, &Keys::compressed(c.l, c.d, documents));
        (out, Some((k_cmp, lse)))
    }

    /// The selected blocks `[B, T, H_kv, n]` (ascending, `-1` in unused slots) for
    /// `x: [B, T, dim]`, ranked by the scores of the compressed branch's probabilities (`None`
    /// before the first compressed block: only the forced blocks and the lowest-index ties).
    pub fn select(
        &self,
        q: Tensor<B, 4>,
        compressed: Option<(Tensor<B, 4>, Tensor<B, 3>)>,
        x: &Tensor<B, 3>,
        documents: Option<&Documents<B>>,
    ) -> Tensor<B, 4, Int> {
        let c = &self.config;
        let [b, t, _] = x.dims();
        let scores = match compressed {
            Some((k, lse)) => {
                let (q, k, lse) = (q.detach(), k.detach(), lse.detach());
                let selection = Selection { length: c.l, stride: c.d, block_size: c.l_sel, n: c.n };
                // The backend's one-pass kernel where it has one, else the same rule in tensor ops.
                if c.fused_kernels {
                    if let Some(list) = select_blocks(q.clone(), k.clone(), lse.clone(), selection, documents) {
                        return list;
                    }
                }
                reference::block_scores(q, k, lse, selection, documents)
            }
            None => Tensor::zeros([b, c.n_kv_heads, t, num_selection_blocks(t, c.l_sel)], (&x.device(), x.dtype())),
        };
        selected_list(select_top_n(scores, c.l_sel, c.n, documents), c.n)
    }

    /// The selected branch over block lists `[B, T, H_kv, n]`.
    pub fn selected_branch(
        &self,
        q: Tensor<B, 4>,
        x: Tensor<B, 3>,
        blocks: Tensor<B, 4, Int>,
        documents: Option<&Documents<B>>,
    ) -> Tensor<B, 4> {
        self.sparse_branch(Branch::Selected, q, x, &Keys::selected(blocks, self.config.l_sel), documents)
    }

    pub fn window_branch(&self, q: Tensor<B, 4>, x: Tensor<B, 3>, documents: Option<&Documents<B>>) -> Tensor<B, 4> {
        self.sparse_branch(Branch::Window, q, x, &Keys::window(self.config.w, documents), documents)
    }

    /// The gated sum of the branch outputs `[B, T, H_q, d_v]` through `W_o`, and the gates
    /// `[B, T, 3, H_q]`.
    pub fn mix(&self, x: Tensor<B, 3>, branches: [Tensor<B, 4>; 3]) -> (Tensor<B, 3>, Tensor<B, 4>) {
        let c = &self.config;
        let [b, t, _] = x.dims();
        let gates = sigmoid(apply(&self.gate, x)).reshape([b, t, 3, c.n_heads]);
        (self.gated_sum(branches, gates.clone()), gates)
    }

    /// The branch outputs `[B, T, H_q, d_v]` summed under `gates` `[B, T, 3, H_q]`, through `W_o`.
    pub fn gated_sum(&self, branches: [Tensor<B, 4>; 3], gates: Tensor<B, 4>) -> Tensor<B, 3> {
        apply(&self.output, self.heads_mixed(branches, gates))
    }

    /// The gated mix of the branches `[B, T, H, d_v]` by `gates [B, T, 3, H]`, heads merged:
    /// `[B, T, H d_v]`, the output projection's input.
    pub fn heads_mixed(&self, branches: [Tensor<B, 4>; 3], gates: Tensor<B, 4>) -> Tensor<B, 3> {
        let c = &self.config;
        let [b, t, _, _] = gates.dims();
        let mixed = match c.fused_kernels {
            true => gated_mix(branches, gates),
            false => gated_mix_reference(branches, gates),
        };
        mixed.reshape([b, t, c.n_heads * c.d_v])
    }

    pub(crate) fn kv(&self, branch: Branch) -> &KvProjection<B> {
        &self.kv[if self.config.shared_kv { 0 } else { branch as usize }]
    }

    /// One branch's keys and values through the attention op.
    fn sparse_branch(
        &self,
        branch: Branch,
        q: Tensor<B, 4>,
        x: Tensor<B, 3>,
        keys: &Keys<B>,
        documents: Option<&Documents<B>>,
    ) -> Tensor<B, 4> {
        let (k, v) = self.kv(branch).forward(x, &self.rope, documents);
        self.attend(q, k, v, keys).0
    }

    /// The fused kernels, or the reference path when `fused_kernels` is off.
    fn attend(
        &self,
        q: Tensor<B, 4>,
        k: Tensor<B, 4>,
        v: Tensor<B, 4>,
        keys: &Keys<B>,
    ) -> (Tensor<B, 4>, Tensor<B, 3>) {
        match self.config.fused_kernels {
            true => sparse_attention(q, k, v, keys),
            false => reference::forward(q, k, v, keys),
        }
    }
}
