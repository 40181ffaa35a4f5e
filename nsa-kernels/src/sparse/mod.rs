//! The sparse-attention op: `softmax(q k^T / sqrt(d_k)) v` for every query row over the keys a
//! [`Keys`] names (a causal window, a list of selected blocks, or the compressed blocks complete
//! at the row), with the row's log-sum-exp; and the block selection that feeds it.
//!
//! [`api`] is the extension trait, whose default methods are [`reference`] (masked dense
//! attention in tensor ops, what the CPU runs and the kernels are held to); [`autodiff`],
//! [`fusion`] and [`cube`] implement it for Burn's backends. On `CubeBackend` the key set is
//! routed once ([`Keys::route`]): compressed keys to [`compressed`], a window or selection to the
//! plan table ([`plan`], [`tiling`]) and its launchers ([`launch`]), which run the kernels of
//! [`crate::kernel`].

mod api;
mod autodiff;
#[cfg(feature = "cube")]
pub mod compressed;
#[cfg(feature = "cube")]
mod cube;
mod documents;
#[cfg(feature = "fusion")]
mod fusion;
mod keys;
#[cfg(feature = "cube")]
pub mod launch;
pub mod plan;
pub mod reference;
pub mod tiling;
#[cfg(feature = "cube")]
mod top_n;

pub use api::{
    select_blocks, sparse_attention, with_block_index, Selection, SparseAttentionBackend, SparseAttentionGrads,
};
pub use documents::Documents;
pub use keys::{BlockIndex, Keys, Route, TokenKeys};
