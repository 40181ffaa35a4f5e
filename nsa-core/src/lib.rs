//! Native Sparse Attention (arXiv 2502.11089) layer and language model, written against Burn's
//! generic `Backend`. `shared/docs/nsa-spec.md` is the function every path computes.

pub mod attention;
pub mod config;
pub mod model;
pub mod rope;
pub mod toml_config;

pub use attention::{Branch, DenseAttention, NsaAttention, NsaAux};
pub use config::{AttentionKind, ConfigError, NsaConfig, Phi};
pub use model::{MlpKind, NsaLm, NsaLmConfig};
