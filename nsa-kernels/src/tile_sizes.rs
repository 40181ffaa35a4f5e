//! Sizes the host's plans ([`crate::sparse::tiling`]) and the kernels ([`crate::kernel`]) both
//! build on: tile edges, padded shared-memory strides and the selection's lanes. Kept apart from
//! both so that the kernels do not reach up into the planner.

/// The MMA tile edge.
pub const MMA_TILE: usize = 16;

/// Row stride (elements) of a tensor-core kernel's 16-bit shared tile of `d`-wide rows: padded
/// by 16 bytes. Unpadded 128- or 256-byte rows put the eight rows a fragment load reads at once
/// in the same banks, and per-row scalar access by 16 rows of a plane in one bank; the 16-byte
/// pad spreads both over all banks.
pub const fn storage_stride(d: usize) -> usize {
    d + 8
}

/// Row stride (elements) of a tensor-core kernel's f32 shared tile: padded by 16 bytes, as
/// [`storage_stride`].
pub const fn f32_stride(n: usize) -> usize {
    n + 4
}

/// Units per query of the block selection: one plane.
pub const SELECTION_LANES: usize = 32;
/// Compressed keys a lane scores per staged chunk: each staged query element it reads serves
/// that many keys (the products are bound by shared-memory loads).
pub const SELECTION_KEYS_PER_LANE: usize = 4;
/// Compressed keys staged per chunk.
pub const SELECTION_CHUNK: usize = SELECTION_LANES * SELECTION_KEYS_PER_LANE;
/// Row stride (f32) of the tensor-core kernel's probabilities: 8 words of padding, so that the
/// 8 rows of a plane's pair stores fall in different banks.
pub const SELECTION_PROB_STRIDE: usize = SELECTION_CHUNK + 8;

/// Cache rows one cube of a decode step attends: a branch's keys are split into tiles of this
/// many rows over many cubes (flash decoding), whose partial states a merge combines, so that
/// a step at batch 1 still fills the device.
pub const DECODE_TILE: usize = 64;
/// Units of a decode tile's cube, a multiple of [`DECODE_TILE`]: `DECODE_UNITS / DECODE_TILE`
/// units score each staged row, each for its share of the heads.
pub const DECODE_UNITS: usize = 128;
/// Heads' partial reductions of a decode tile: each of `g x DECODE_PARTS` units reduces
/// `DECODE_TILE / DECODE_PARTS` scores before one unit per head combines them.
pub const DECODE_PARTS: usize = 8;
