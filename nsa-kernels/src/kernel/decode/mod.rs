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
