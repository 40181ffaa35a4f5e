//! Fused attention kernels for NSA's selected-block and sliding-window branches, as a Burn
//! backend extension ([`SparseAttentionBackend`]).
//!
//! One op, [`sparse_attention`], computes `softmax(q k^T / sqrt(d_k)) v` for every query row over
//! the keys a [`Keys`] names (a causal window, or a list of selected blocks), and returns the
//! per-row log-sum-exp with it. On `CubeBackend` (CUDA, WGPU) it runs the CubeCL kernels of
//! [`kernel`] forward and backward (the backward recomputes probabilities from the saved
//! log-sum-exp, as flash attention does: no `T x T` matrix exists at any point). Every other
//! backend runs [`reference`], masked dense attention in Burn tensor ops, which autodiff
//! differentiates by itself.

pub mod activation;
#[cfg(feature = "cube")]
mod buffers;
#[cfg(any(feature = "flex", feature = "ndarray"))]
mod cpu;
pub mod decode;
pub mod devices;
mod dtypes;
mod fingerprint;
pub mod gemm;
pub mod mix;
pub mod norm;

#[cfg(feature = "cube")]
pub mod kernel;
pub mod optim;
pub mod sparse;
pub mod tile_sizes;

pub use activation::{silu, silu_linear_matmul, ActivationBackend};
/// CubeCL's backend without Burn's fusion, for callers that name it (e.g. a decode step on CUDA,
/// where fusion's per-op work is host time).
#[cfg(feature = "cube")]
pub use burn_cubecl::CubeBackend;
pub use decode::{
    decode_attention, decode_linear, decode_write, DecodeAttentionBackend, StepInput, StepLayout, WrittenStep,
};
pub use dtypes::stats_dtype;
pub use fingerprint::KERNEL_FINGERPRINT;
pub use gemm::{linear_matmul, GemmBackend};
pub use mix::{gated_mix, gated_mix_reference, GatedMixBackend};
pub use norm::{rms_norm, RmsNormBackend};
pub use optim::{AdamWHyper, AdamWSlot, AdamWUpdate, FusedAdamWBackend};
pub use sparse::{
    select_blocks, sparse_attention, with_block_index, BlockIndex, Documents, Keys, Route, Selection,
    SparseAttentionBackend, SparseAttentionGrads, TokenKeys,
};
