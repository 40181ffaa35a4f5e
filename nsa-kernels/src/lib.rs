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
mod api;
mod autodiff;
pub mod devices;
mod fingerprint;
pub mod gemm;
mod keys;
pub mod mix;
#[cfg(feature = "ndarray")]
mod ndarray;
pub mod norm;
pub mod reference;

#[cfg(feature = "cube")]
pub mod compressed;
#[cfg(feature = "cube")]
mod cube;
#[cfg(feature = "fusion")]
mod fusion;
#[cfg(feature = "cube")]
pub mod kernel;
#[cfg(feature = "cube")]
pub mod launch;
pub mod optim;
pub mod plan;
pub mod tiling;
#[cfg(feature = "cube")]
mod top_n;

pub use activation::{silu, silu_linear_matmul, ActivationBackend};
pub use api::{
    select_blocks, sparse_attention, with_block_index, Selection, SparseAttentionBackend, SparseAttentionGrads,
};
pub use fingerprint::KERNEL_FINGERPRINT;
pub use gemm::{linear_matmul, GemmBackend};
pub use keys::{BlockIndex, Keys};
pub use mix::{gated_mix, gated_mix_reference, GatedMixBackend};
pub use norm::{rms_norm, RmsNormBackend};
pub use optim::{AdamWHyper, AdamWSlot, AdamWUpdate, FusedAdamWBackend};
