//! Native Sparse Attention (arXiv 2502.11089) layer and language model, written against Burn's
//! generic `Backend`. `shared/docs/nsa-spec.md` is the function every path computes.

pub mod attention;
pub mod config;
pub mod constants;
pub mod decode;
#[cfg(feature = "learner")]
pub mod learner;
pub mod loss;
pub mod model;
pub mod precision;
pub mod rope;
pub mod toml_config;

use burn::module::{Module, ModuleMapper};
use burn::tensor::backend::Backend;

/// The identity mapper: mapping a module through it draws every lazily initialised parameter.
struct Materialize;

impl<B: Backend> ModuleMapper<B> for Materialize {}

/// Draws every parameter now. Burn initialises parameters lazily, and a clone taken before the
/// first use initialises on its own, with different random values: a model cloned into an
/// optimiser step and a checkpoint would silently diverge. Every `init` here returns a
/// materialised module.
pub fn materialize<B: Backend, M: Module<B>>(module: M) -> M {
    module.map(&mut Materialize)
}

pub use attention::{Branch, DenseAttention, DenseAttentionConfig, NsaAttention, NsaAttentionConfig, NsaAux};
pub use config::{AttentionKind, ConfigError, NsaConfig, Phi};
pub use decode::{DecodeCache, DecodeOutput};
pub use loss::lm_loss;
pub use model::{MlpKind, NsaLm, NsaLmConfig};
pub use nsa_kernels::{DecodeAttentionBackend, Documents, SparseAttentionBackend};
pub use precision::cast_params;
