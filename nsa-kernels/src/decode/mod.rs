//! A decode step's attention, as a backend extension ([`DecodeAttentionBackend`]): one new
//! query per sequence against its NSA cache, the three branches and the block selection.
//!
//! In tensor ops a step is about a hundred ops per layer (masks, gathers, three softmaxes, the
//! top-n), and at decode sizes each op's host cost, not its GPU time, is the step's time. On
//! `CubeBackend` the whole of it is one kernel ([`crate::kernel::decode`]); other backends have
//! none (`None`), and the caller runs its tensor ops, which the kernel is held to.

mod autodiff;
#[cfg(feature = "cube")]
mod cube;
#[cfg(feature = "fusion")]
mod fusion;
mod linear;
#[cfg(feature = "cube")]
mod linear_launch;
#[cfg(feature = "cube")]
mod write;

pub use linear::{decode_linear, StepInput, StepLinear};

use burn::tensor::backend::Backend;
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{Int, Tensor, TensorPrimitive};

use crate::sparse::{Selection, SparseAttentionBackend};

/// What a decode step's attention reads. Caches are heads first, as the cache holds them.
pub struct DecodeStep<B: Backend> {
    /// The new tokens' rotated queries, `[B, 1, H_q, d_k]`.
    pub q: FloatTensor<B>,
    /// Keys and values of the compressed blocks, `[B, H_kv, N, d]` (the first
    /// `(t + 1 - l) / d + 1` valid at position `t`).
    pub compressed: [FloatTensor<B>; 2],
    /// The selected branch's keys and values of every position, `[B, H_kv, L, d]` (`0..=t`
    /// valid).
    pub selected: [FloatTensor<B>; 2],
    /// The window's ring, `[B, H_kv, R, d]` (slot `p % R` holds position `p`).
    pub window: [FloatTensor<B>; 2],
    /// Each sequence's position `t` (the new token's), `[B]`.
    pub positions: IntTensor<B>,
    pub selection: Selection,
}

/// A decode step's branch outputs and selection.
pub struct DecodeBranches<B: Backend> {
    /// Compressed, selected and window outputs, `[B, 1, H_q, d_v]` each.
    pub outputs: [FloatTensor<B>; 3],
    /// The selected blocks, `[B, 1, H_kv, n]` (ascending, `-1` in unused slots).
    pub blocks: IntTensor<B>,
}

/// The heads of a layer's decode projection: `H` query heads and `kv_sets` key/value sets
/// (three, or one shared by the branches) of `H_kv` heads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepLayout {
    pub heads: usize,
    pub kv_heads: usize,
    pub d_k: usize,
    pub d_v: usize,
    pub kv_sets: usize,
}

/// What a decode step hands from its layer's projection to the caches and the attention
/// ([`crate::kernel::decode::write`] has the columns' order).
pub struct DecodeWrite<B: Backend> {
    /// The layer's projection of the new tokens, `[B, W]`, without bias.
    pub projected: FloatTensor<B>,
    /// The gates' bias, `[3 H]`.
    pub gate_bias: FloatTensor<B>,
    /// The rotation at each sequence's position: cosines and sines `[B, d_k]`.
    pub rotation: [FloatTensor<B>; 2],
    /// Each sequence's position `t`, `[B]`.
    pub positions: IntTensor<B>,
    /// The compression tail's ring, the selected branch's store and the window's ring (keys,
    /// values), `[B, H_kv, S, d]`, slot `t % S` taking position `t`.
    pub caches: [[FloatTensor<B>; 2]; 3],
    pub layout: StepLayout,
}

/// The rotated queries `[B, 1, H, d_k]`, the gates `[B, 1, 3, H]` and the caches with the new
/// keys and values.
pub struct DecodeWritten<B: Backend> {
    pub queries: FloatTensor<B>,
    pub gates: FloatTensor<B>,
    pub caches: [[FloatTensor<B>; 2]; 3],
}

/// A backend that may run a decode step's attention as a kernel (on top of the sparse op, whose
/// prefill fills the cache).
pub trait DecodeAttentionBackend: SparseAttentionBackend {
    /// Whether [`Self::decode_attention`] returns `Some`.
    fn has_decode_kernel() -> bool {
        false
    }

    /// The step's three branches and selected blocks, as the spec computes them for one query
    /// at each sequence's position; `None` where the backend has no kernel.
    fn decode_attention(_step: DecodeStep<Self>) -> Option<DecodeBranches<Self>> {
        None
    }

    /// The step's hand-over from its projection to its caches, written in place where the
    /// caches are not shared; `None` where the backend has no kernel.
    fn decode_write(_step: DecodeWrite<Self>) -> Option<DecodeWritten<Self>> {
        None
    }

    /// A step's linear layer with its input function and residual add ([`StepLinear`]). The
    /// default is the tensor ops.
    fn decode_linear(step: StepLinear<Self>) -> FloatTensor<Self> {
        linear::reference::<Self>(step)
    }
}

/// The cache's keys and values of one branch, `[B, H_kv, S, d]` each.
pub type BranchCache<'a, B> = (&'a Tensor<B, 4>, &'a Tensor<B, 4>);

/// The three branch outputs `[B, 1, H_q, d_v]` and the selected blocks `[B, 1, H_kv, n]`.
pub type StepOutputs<B> = ([Tensor<B, 4>; 3], Tensor<B, 4, Int>);

/// [`DecodeAttentionBackend::decode_attention`] on tensors, or `None` without a kernel.
pub fn decode_attention<B: DecodeAttentionBackend>(
    q: Tensor<B, 4>,
    [compressed, selected, window]: [BranchCache<'_, B>; 3],
    positions: Tensor<B, 1, Int>,
    selection: Selection,
) -> Option<StepOutputs<B>> {
    if !B::has_decode_kernel() {
        return None;
    }
    let pair = |(k, v): BranchCache<'_, B>| [k.clone(), v.clone()].map(|x| x.into_primitive().tensor());
    let step = DecodeStep {
        q: q.into_primitive().tensor(),
        compressed: pair(compressed),
        selected: pair(selected),
        window: pair(window),
        positions: positions.into_primitive(),
        selection,
    };
    let DecodeBranches { outputs, blocks } = B::decode_attention(step)?;
    Some((outputs.map(|o| Tensor::from_primitive(TensorPrimitive::Float(o))), Tensor::from_primitive(blocks)))
}

/// [`DecodeWritten`] as tensors.
pub struct WrittenStep<B: Backend> {
    pub queries: Tensor<B, 4>,
    pub gates: Tensor<B, 4>,
    /// The tail, selected and window caches: keys, values.
    pub caches: [[Tensor<B, 4>; 2]; 3],
}

/// [`DecodeAttentionBackend::decode_write`] on tensors. Only for a backend that declares a
/// kernel ([`DecodeAttentionBackend::has_decode_kernel`]): the caches move in.
pub fn decode_write<B: DecodeAttentionBackend>(
    projected: Tensor<B, 2>,
    gate_bias: Tensor<B, 1>,
    rotation: [Tensor<B, 2>; 2],
    positions: Tensor<B, 1, Int>,
    caches: [[Tensor<B, 4>; 2]; 3],
    layout: StepLayout,
) -> WrittenStep<B> {
    let step = DecodeWrite {
        projected: projected.into_primitive().tensor(),
        gate_bias: gate_bias.into_primitive().tensor(),
        rotation: rotation.map(|x| x.into_primitive().tensor()),
        positions: positions.into_primitive(),
        caches: caches.map(|pair| pair.map(|x| x.into_primitive().tensor())),
        layout,
    };
    let written = B::decode_write(step).expect("decode_write runs on a backend that declares a decode kernel");
    let float = |x| Tensor::from_primitive(TensorPrimitive::Float(x));
    WrittenStep {
        queries: float(written.queries),
        gates: float(written.gates),
        caches: written.caches.map(|pair| pair.map(float)),
    }
}
