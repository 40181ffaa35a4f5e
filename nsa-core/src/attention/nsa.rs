//! The NSA layer: exactly `shared/docs/nsa-spec.md`, as batched tensor code.
//!
//! The selected and window branches go through `nsa_kernels::sparse_attention`: fused CubeCL
//! kernels on CUDA and WGPU, masked dense attention (O(T^2) memory, `B * H_q * T^2` scores per
//! branch) on every other backend and when `fused_kernels` is off. The compressed branch is
//! masked dense attention over the `T x n_cmp` scores, and the top-n materialises
//! `B * H_kv * T * n_sel^2` booleans.

use burn::module::{Module, Param};
use burn::nn::{Initializer, Linear, LinearConfig};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Bool, Tensor};
use nsa_kernels::{reference, sparse_attention, Keys, SparseAttentionBackend};

use super::compress::Compressor;
use super::constants::cached;
use super::masks::compressed_visible;
use super::projection::{apply, linear, merge_heads, split_heads, KvProjection};
use super::selection::{group_scores, num_selection_blocks, select_top_n, selected_list};
use super::softmax::masked_attention;
use crate::config::NsaConfig;
use crate::rope::Rope;

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
    /// Selected blocks `[B, H_kv, T, ceil(T / l_sel)]`, shared by the heads of each group.
    pub selected: Tensor<B, 4, Bool>,
}

impl<B: AutodiffBackend> NsaAux<B> {
    /// The same tensors outside the autodiff graph.
    pub fn inner(self) -> NsaAux<B::InnerBackend> {
        NsaAux { gates: self.gates.inner(), selected: self.selected.inner() }
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

impl NsaConfig {
    /// The layer with projections drawn from `N(0, std)` and the output projection from
    /// `N(0, out_std)` (the model scales it down with depth). Positions up to `max_len`.
    pub fn init_nsa<B: Backend>(&self, max_len: usize, std: f64, out_std: f64, device: &B::Device) -> NsaAttention<B> {
        let c = self;
        let kv_sets = if c.shared_kv { 1 } else { 3 };
        let kv = (0..kv_sets).map(|_| KvProjection::new(c.dim, c.n_kv_heads, c.d_k, c.d_v, std, device)).collect();
        crate::materialize(NsaAttention {
            query: linear(c.dim, c.n_heads * c.d_k, std, device),
            kv,
            compressor: Compressor::new(c.phi, c.l, c.d, c.d_k, c.d_v, device),
            gate: gate_linear(c.dim, 3 * c.n_heads, c.gate_init, device),
            output: linear(c.n_heads * c.d_v, c.dim, out_std, device),
            rope: Rope::new(max_len, c.d_k, c.rope_base, device),
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
fn sigmoid<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    x.mul_scalar(0.5).tanh().add_scalar(1.0).mul_scalar(0.5)
}

impl<B: SparseAttentionBackend> NsaAttention<B> {
    /// `x: [B, T, dim]` -> `[B, T, dim]`.
    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        self.forward_with_aux(x).0
    }

    /// The output and what the layer selected and gated.
    pub fn forward_with_aux(&self, x: Tensor<B, 3>) -> (Tensor<B, 3>, NsaAux<B>) {
        let c = &self.config;
        let [b, t, _] = x.dims();
        let (h_kv, g) = (c.n_kv_heads, c.group_size());
        let q = self.rope.apply(split_heads(apply(&self.query, x.clone()), c.n_heads));
        let q = q.reshape([b, h_kv, g, t, c.d_k]);

        let (o_cmp, p_cmp) = self.compressed_branch(q.clone(), x.clone());
        let n_sel = num_selection_blocks(t, c.l_sel);
        let scores = match p_cmp {
            Some(p) => group_scores(p.detach(), n_sel, c.l, c.d, c.l_sel),
            None => Tensor::zeros([b, h_kv, t, n_sel], (&x.device(), x.dtype())),
        };
        let selected = select_top_n(scores, c.l_sel, c.n);
        let o_slc = self.selected_branch(q.clone(), x.clone(), selected.clone());
        let o_win = self.window_branch(q, x.clone());

        let gates = sigmoid(apply(&self.gate, x)).reshape([b, t, 3, c.n_heads]);
        let gate_of = |branch: Branch| {
            gates
                .clone()
                .narrow(2, branch as usize, 1)
                .reshape([b, t, h_kv, g])
                .permute([0, 2, 3, 1])
                .reshape([b, h_kv, g, t, 1])
        };
        let mixed =
            o_cmp * gate_of(Branch::Compressed) + o_slc * gate_of(Branch::Selected) + o_win * gate_of(Branch::Window);
        let out = apply(&self.output, merge_heads(mixed.reshape([b, c.n_heads, t, c.d_v])));
        (out, NsaAux { gates, selected })
    }

    fn kv(&self, branch: Branch) -> &KvProjection<B> {
        &self.kv[if self.config.shared_kv { 0 } else { branch as usize }]
    }

    /// Output `[B, H_kv, g, T, d_v]` and, when a compressed block exists, its probabilities
    /// `[B, H_kv, g, T, n_cmp]` (zero rows for queries that see no block yet).
    fn compressed_branch(&self, q: Tensor<B, 5>, x: Tensor<B, 3>) -> (Tensor<B, 5>, Option<Tensor<B, 5>>) {
        let c = &self.config;
        let [b, h_kv, g, t, _] = q.dims();
        let (k, v) = self.kv(Branch::Compressed).forward(x, &self.rope);
        let Some((k_cmp, v_cmp)) = self.compressor.forward(k, v) else {
            return (Tensor::zeros([b, h_kv, g, t, c.d_v], (&q.device(), q.dtype())), None);
        };
        let n_cmp = k_cmp.dims()[2];
        let device = q.device();
        let (allowed, keep) = cached::<B, _>("compressed", &[t, n_cmp, c.l, c.d], &device, || {
            let visible = compressed_visible::<B>(t, n_cmp, c.l, c.d, &device);
            // Queries with no visible block (t + 1 < l) attend block 0 so their softmax row is
            // finite, and are then zeroed: exactly zero output, and no gradient through them.
            let sees_none = visible.clone().bool_not().all_dim(1); // [T, 1]
            let first_block = super::masks::index_row::<B>(n_cmp, &device).equal_elem(0).expand([t, n_cmp]);
            let allowed = visible.bool_or(first_block.bool_and(sees_none.clone().expand([t, n_cmp])));
            (allowed.reshape([1, 1, 1, t, n_cmp]), sees_none.bool_not().reshape([1, 1, 1, t, 1]))
        });
        let (out, probs) = masked_attention(q, k_cmp, v_cmp, allowed);
        let keep = keep.float().cast(out.dtype());
        (out * keep.clone(), Some(probs * keep))
    }

    fn selected_branch(&self, q: Tensor<B, 5>, x: Tensor<B, 3>, selected: Tensor<B, 4, Bool>) -> Tensor<B, 5> {
        let blocks = selected_list(selected, self.config.n);
        self.sparse_branch(Branch::Selected, q, x, &Keys::selected(blocks, self.config.l_sel))
    }

    fn window_branch(&self, q: Tensor<B, 5>, x: Tensor<B, 3>) -> Tensor<B, 5> {
        self.sparse_branch(Branch::Window, q, x, &Keys::Window { w: self.config.w })
    }

    /// One branch through the sparse-attention op, whose layout is `[B, T, heads, d]`.
    fn sparse_branch(&self, branch: Branch, q: Tensor<B, 5>, x: Tensor<B, 3>, keys: &Keys<B>) -> Tensor<B, 5> {
        let [b, h_kv, g, t, d_k] = q.dims();
        let (k, v) = self.kv(branch).forward(x, &self.rope);
        let q = q.permute([0, 3, 1, 2, 4]).reshape([b, t, h_kv * g, d_k]);
        let (k, v) = (k.swap_dims(1, 2), v.swap_dims(1, 2));
        let (out, _lse) =
            if self.config.fused_kernels { sparse_attention(q, k, v, keys) } else { reference::forward(q, k, v, keys) };
        let d_v = out.dims()[3];
        out.reshape([b, t, h_kv, g, d_v]).permute([0, 2, 3, 1, 4])
    }
}
