//! What decoding keeps per layer and sequence (spec, "Prefill, decode, varlen"), preallocated for
//! a maximum length chosen at the start, so no step reallocates or changes a shape.

use burn::tensor::backend::Backend;
use burn::tensor::DType;
use nsa_kernels::DecodeAttentionBackend;

use super::projection::StepProjection;
use super::store::{KeyValues, Slots, TokenStore};
use crate::attention::NsaAttention;
use crate::config::NsaConfig;

/// An NSA layer's cache for `B` sequences of up to `L` positions.
#[derive(Clone, Debug)]
pub struct NsaLayerCache<B: Backend> {
    /// The selected branch's raw keys and values, every position: `[B, H_kv, L, d]`.
    pub selected: TokenStore<B>,
    /// The window branch's last `min(w, L)` keys and values, a ring (position `p` in slot `p % R`).
    pub window: Slots<B>,
    /// The compressed branch's raw (rotated) keys and values of the last `l` positions, a ring:
    /// what the next compressed block is made of.
    pub tail: Slots<B>,
    /// The compressed keys and values emitted so far, block `i` in slot `i`: `[B, H_kv, N, d]`
    /// for the `N` blocks that exist at length `L`.
    pub compressed: Slots<B>,
    /// The layer's projections as one product, made with the cache.
    pub projection: StepProjection<B>,
}

impl<B: DecodeAttentionBackend> NsaLayerCache<B> {
    pub fn new(layer: &NsaAttention<B>, batch: usize, max_len: usize, dtype: DType, device: &B::Device) -> Self {
        let c = &layer.config;
        let kv = |slots: usize| KeyValues::zeros(batch, c.n_kv_heads, slots, [c.d_k, c.d_v], dtype, device);
        NsaLayerCache {
            selected: TokenStore(kv(max_len)),
            window: Slots(kv(c.w.min(max_len))),
            tail: Slots(kv(c.l)),
            // At least one slot, so a cache shorter than a block still has a (never visible) slot
            // to attend.
            compressed: Slots(kv(compressed_blocks(c, max_len).max(1))),
            projection: StepProjection::new(layer),
        }
    }
}

/// Compressed blocks that exist in a sequence of `t` tokens (spec: block `i` covers
/// `[i*d, i*d + l)` and exists once its last token does).
pub fn compressed_blocks(c: &NsaConfig, t: usize) -> usize {
    if t < c.l {
        0
    } else {
        (t - c.l) / c.d + 1
    }
}

/// One attention layer's cache.
// Few of these exist (one per layer), so the variants' size difference costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum LayerCache<B: Backend> {
    Nsa(NsaLayerCache<B>),
    /// Dense attention: every position's keys and values.
    Dense(TokenStore<B>),
}

/// The whole model's cache: one [`LayerCache`] per block and each sequence's length (the
/// position its next token takes).
#[derive(Clone, Debug)]
pub struct DecodeCache<B: Backend> {
    pub layers: Vec<LayerCache<B>>,
    pub lengths: Vec<usize>,
    pub max_len: usize,
}

impl<B: Backend> DecodeCache<B> {
    /// Sequences in the batch.
    pub fn batch(&self) -> usize {
        self.lengths.len()
    }
}
