//! The decode step of an NSA layer: the new token's projections written where the step reads
//! them ([`write`]), then one new query per sequence against its cache, split over many cubes
//! as flash decoding splits keys (a step at batch 1 would otherwise leave most of the device
//! idle):
//! 1. [`tiles::decode_tiles`]: the compressed branch's and the window's tiles ([`tile`]),
//!    keeping the compressed scores;
//! 2. [`select::decode_select`]: the compressed branch's log-sum-exps from its tiles' states
//!    ([`states`]), the block scores and the top-n ([`top_n`]);
//! 3. [`tiles::decode_selected_tiles`]: the chosen blocks' tiles;
//! 4. [`merge::decode_merge`]: every branch's tiles merged into its output, a cube per head and
//!    branch.
//!
//! A tile's or the selection's cube serves one `(sequence, KV head)`, whose `g` query heads
//! share every key row it stages.
//!
//! Every kernel takes its buffers as arrays (contiguous, the caches `[B, H_kv, slots, d]`) and
//! their extents as values ([`StepExtent`]): a tensor argument's shape and strides would be
//! uploaded with each launch, the largest part of what a launch costs the host, and a step is
//! about a hundred launches.
//!
//! [`linear::decode_linear`] runs the step's linear layers with what surrounds them (the norm
//! before, the activation, the residual add after) in one launch each.

pub mod linear;
pub mod merge;
pub mod select;
pub mod states;
pub mod tile;
pub mod tiles;
pub mod top_n;
pub mod write;

use cubecl::prelude::*;

/// The extents an attention step's kernels share, passed by value with each launch.
#[derive(CubeType, CubeLaunch, Clone, Copy)]
pub struct StepExtent {
    /// Groups `B * H_kv`: a tile's, the selection's and a merge's cubes each serve one.
    pub groups: usize,
    /// KV heads.
    pub h_kv: usize,
    /// Slots of the compressed cache (at least 1).
    pub n_compressed: usize,
    /// Slots of the window ring.
    pub ring: usize,
    /// Slots of the selected branch's store (the cache's maximum length).
    pub max_len: usize,
    /// Tiles of a group's partials: the compressed branch's, the window's, the selected blocks'.
    pub tiles: usize,
    /// Slots of a block list.
    pub n: usize,
}
