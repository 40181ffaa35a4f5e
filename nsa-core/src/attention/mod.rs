//! Attention layers: NSA (three gated branches) and dense causal GQA.

pub mod compress;
pub mod dense;
pub mod masks;
pub mod nsa;
pub mod projection;
pub mod selection;

pub use dense::{DenseAttention, DenseAttentionConfig};
pub(crate) use nsa::sigmoid;
pub use nsa::{Branch, NsaAttention, NsaAttentionConfig, NsaAux};
