//! Generation with a cache (spec, "Prefill, decode, varlen"): a prefill runs a prompt through the
//! training forward and keeps, per layer and sequence, what later tokens read; each decode step
//! then takes one new token per sequence and reads the selected blocks, the window and the
//! compressed blocks from the cache instead of recomputing the context.
//!
//! A step's tensors have shapes fixed by the batch and the cache's maximum length (the
//! positions are device values, built once per step in [`DecodePositions`]), so on a GPU nothing
//! compiles or autotunes after the first token. Sequences of one batch may have different
//! lengths. On a backend with decode kernels (CubeCL's) a layer's step is a product, the
//! hand-over of its result into the cache ([`nsa_kernels::decode_write`]) and the attention
//! ([`nsa_kernels::decode_attention`]); elsewhere the same step runs in tensor ops, which the
//! kernels are held to.

pub mod attend;
pub mod cache;
pub mod dense_layer;
pub mod linear;
pub mod model;
pub mod nsa_layer;
pub mod positions;
pub mod projection;
pub mod store;

pub use cache::{DecodeCache, LayerCache, NsaLayerCache};
pub use model::DecodeOutput;
pub use nsa_layer::NsaFill;
pub use positions::{DecodePositions, NsaPositions};
pub use projection::StepProjection;
pub use store::{KeyValues, Slots, TokenStore};
