//! One cube's share of a decode branch (flash decoding): the `g` query heads of a KV group
//! against one tile of at most [`TILE`] consecutive cache rows, reduced to a partial state per
//! head (the tile's largest score, its sum of exponentials and its unnormalised output) that
//! [`super::merge`] combines across tiles. Each step is a primitive the tile kernels
//! ([`super::tiles`]) compose; every one is called by all units of the cube.
//!
//! A partial is `2 + d_v` f32 per head: maximum, sum, then the output's columns
//! ([`partial_at`]). A tile with no rows leaves the empty state (`NEG_LARGE`, 0, zeros), which
//! merges as nothing.

use cubecl::prelude::*;

use crate::kernel::primitives::rows::NEG_LARGE;
use crate::tile_sizes::{DECODE_PARTS as PARTS, DECODE_TILE as TILE, DECODE_UNITS as UNITS};

/// The shared memory of a tile's cube.
#[derive(CubeType)]
pub struct TileShared {
    /// The `g` query rows, scaled, `g x d_k`.
    pub queries: SharedMemory<f32>,
    /// The tile's key rows (row stride `d_k + 1`, odd, so that consecutive rows start in
    /// different banks), then its value rows (stride `d_v`).
    pub rows: SharedMemory<f32>,
    /// Scores, then probabilities, `g x TILE`.
    pub probs: SharedMemory<f32>,
    /// Per head and part: maxima then sums (`2 x g x PARTS`), then per head the tile's maximum
    /// and sum (`2 x g`).
    pub stats: SharedMemory<f32>,
}

#[cube]
impl TileShared {
    pub fn new(#[comptime] g: usize, #[comptime] d_k: usize, #[comptime] d_v: usize) -> TileShared {
        TileShared {
            queries: SharedMemory::<f32>::new(comptime!(g * d_k)),
            rows: SharedMemory::<f32>::new(comptime!(TILE * std::cmp::max(d_k + 1, d_v))),
            probs: SharedMemory::<f32>::new(comptime!(g * TILE)),
            stats: SharedMemory::<f32>::new(comptime!(2 * g * PARTS + 2 * g)),
        }
    }
}

/// Offset of head `h`'s partial of tile `tile` of `bh = b * H_kv + hk` in a contiguous
/// `[B * H_kv, tiles, g, 2 + d_v]` buffer.
#[cube]
pub fn partial_at(
    bh: usize,
    tile: usize,
    h: usize,
    tiles: usize,
    #[comptime] g: usize,
    #[comptime] d_v: usize,
) -> usize {
    ((bh * tiles + tile) * g + h) * comptime!(d_v + 2)
}

/// Element offset of row `row` of group `bh = b * H_kv + hk` in a contiguous cache `[B, H_kv,
/// slots, d]`.
#[cube]
pub fn cache_row(bh: usize, row: usize, slots: usize, #[comptime] d: usize) -> usize {
    (bh * slots + row) * d
}

/// Stages the `g` query rows of group `bh = b * H_kv + hk` of `q [B, 1, H_q, d_k]`
/// (contiguous), times `scale`.
#[cube]
pub fn stage_queries<F: Float>(
    q: &Array<F>,
    shared: &mut TileShared,
    bh: usize,
    scale: f32,
    #[comptime] g: usize,
    #[comptime] d_k: usize,
) {
    let mut idx = UNIT_POS as usize;
    while idx < g * d_k {
        shared.queries[idx] = f32::cast_from(q[bh * comptime!(g * d_k) + idx]) * scale;
        idx += CUBE_DIM as usize;
    }
}

/// Stages `count <= TILE` rows of `src` from element `rows_at` (rows of `d` elements one after
/// the other, read as vectors of `vector` elements: [`cache_row`]) as f32 rows of `stride` in
/// `shared.rows`; rows past `count` are zero. Units read consecutive vectors of a row
/// (a plane's loads coalesce), and each unit's loads are unrolled so that they are all in flight
/// at once: a tile is a few 16-byte loads a unit.
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn stage_rows<F: Float, N: Size>(
    src: &Array<Vector<F, N>>,
    shared: &mut TileShared,
    rows_at: usize,
    count: usize,
    #[comptime] d: usize,
    #[comptime] stride: usize,
    #[comptime] vector: usize,
) {
    let unit = UNIT_POS as usize;
    let per_row = comptime!(d / vector);
    let base = rows_at / vector;
    #[unroll]
    for m in 0..comptime!((TILE * d / vector).div_ceil(UNITS)) {
        let idx = m * UNITS + unit;
        let (row, c) = (idx / per_row, idx % per_row);
        if idx < comptime!(TILE * d / vector) {
            let mut x = Vector::<f32, N>::new(0.0f32);
            if row < count {
                x = Vector::<f32, N>::cast_from(src[base + row * per_row + c]);
            }
            #[unroll]
            for e in 0..vector {
                shared.rows[row * stride + c * vector + e] = x[e];
            }
        }
    }
}

/// The scaled scores of the staged key rows, `probs[h * TILE + row]`, `NEG_LARGE` past
/// `count`; elements added in ascending order. A unit scores one row for every
/// `UNITS / TILE`-th head, reading each key element once for them.
#[cube]
pub fn tile_scores(shared: &mut TileShared, count: usize, #[comptime] g: usize, #[comptime] d_k: usize) {
    let step = comptime!(UNITS / TILE);
    let heads = comptime!(g.div_ceil(UNITS / TILE));
    let unit = UNIT_POS as usize;
    let (row, h0) = (unit % TILE, unit / TILE);
    let mut s = Array::<f32>::new(heads);
    #[unroll]
    for m in 0..heads {
        s[m] = 0.0f32;
    }
    for e in 0..d_k {
        let k = shared.rows[row * comptime!(d_k + 1) + e];
        #[unroll]
        for m in 0..heads {
            let h = min(h0 + m * step, comptime!(g - 1));
            s[m] += shared.queries[h * d_k + e] * k;
        }
    }
    #[unroll]
    for m in 0..heads {
        let h = h0 + m * step;
        if h < g {
            shared.probs[h * TILE + row] = select(row < count, s[m], f32::new(NEG_LARGE));
        }
    }
}

/// Turns the scores into `exp(s - max_h)` (0 past `count`) and leaves each head's maximum and
/// sum at `stats[2 g PARTS + 2 h ..]`: each of `g x PARTS` units reduces every `PARTS`-th
/// score of its head, one unit per head combines the parts.
#[cube]
pub fn tile_softmax(shared: &mut TileShared, count: usize, #[comptime] g: usize) {
    let unit = UNIT_POS as usize;
    let tail = comptime!(2 * g * PARTS);
    let mut idx = unit;
    while idx < g * PARTS {
        let (h, part) = (idx / PARTS, idx % PARTS);
        let mut top = f32::new(NEG_LARGE);
        let mut row = part;
        while row < count {
            top = max(top, shared.probs[h * TILE + row]);
            row += PARTS;
        }
        let mut sum = 0.0f32;
        row = part;
        while row < count {
            sum += (shared.probs[h * TILE + row] - top).exp();
            row += PARTS;
        }
        shared.stats[2 * idx] = top;
        shared.stats[2 * idx + 1] = sum;
        idx += CUBE_DIM as usize;
    }
    sync_cube();
    idx = unit;
    while idx < g {
        let mut top = f32::new(NEG_LARGE);
        #[unroll]
        for part in 0..PARTS {
            top = max(top, shared.stats[2 * (idx * PARTS + part)]);
        }
        let mut sum = 0.0f32;
        #[unroll]
        for part in 0..PARTS {
            let at = 2 * (idx * PARTS + part);
            sum += shared.stats[at + 1] * (shared.stats[at] - top).exp();
        }
        shared.stats[tail + 2 * idx] = top;
        shared.stats[tail + 2 * idx + 1] = sum;
        idx += CUBE_DIM as usize;
    }
    sync_cube();
    idx = unit;
    while idx < g * TILE {
        let (h, row) = (idx / TILE, idx % TILE);
        let p = (shared.probs[idx] - shared.stats[tail + 2 * h]).exp();
        shared.probs[idx] = select(row < count, p, 0.0f32);
        idx += CUBE_DIM as usize;
    }
}

/// Writes the tile's partial state to `partials[at..]` (heads `d_v + 2` apart): each head's
/// maximum and sum, and per column the probabilities times the staged value rows. A unit sums
/// columns `c, c + d_v', ..` (`d_v' = min(d_v, UNITS)`) for every `UNITS / d_v'`-th head,
/// reading each value once for them.
#[cube]
pub fn write_partial(
    shared: &TileShared,
    partials: &mut Array<f32>,
    at: usize,
    count: usize,
    #[comptime] g: usize,
    #[comptime] d_v: usize,
) {
    let width = comptime!(d_v + 2);
    let tail = comptime!(2 * g * PARTS);
    let col_units = comptime!(std::cmp::min(d_v, UNITS));
    let step = comptime!(UNITS / std::cmp::min(d_v, UNITS));
    let heads = comptime!(g.div_ceil(UNITS / std::cmp::min(d_v, UNITS)));
    let cols = comptime!(d_v.div_ceil(std::cmp::min(d_v, UNITS)));
    let unit = UNIT_POS as usize;
    let (c0, h0) = (unit % col_units, unit / col_units);
    let mut acc = Array::<f32>::new(comptime!(heads * cols));
    #[unroll]
    for i in 0..heads * cols {
        acc[i] = 0.0f32;
    }
    for row in 0..count {
        #[unroll]
        for c in 0..cols {
            let col = min(c0 + c * col_units, comptime!(d_v - 1));
            let v = shared.rows[row * d_v + col];
            #[unroll]
            for m in 0..heads {
                let h = min(h0 + m * step, comptime!(g - 1));
                acc[m * cols + c] += shared.probs[h * TILE + row] * v;
            }
        }
    }
    #[unroll]
    for m in 0..heads {
        let h = h0 + m * step;
        #[unroll]
        for c in 0..cols {
            let col = c0 + c * col_units;
            if h < g && col < d_v {
                partials[at + h * width + 2 + col] = acc[m * cols + c];
            }
        }
    }
    let mut idx = unit;
    while idx < g {
        partials[at + idx * width] = shared.stats[tail + 2 * idx];
        partials[at + idx * width + 1] = shared.stats[tail + 2 * idx + 1];
        idx += CUBE_DIM as usize;
    }
}

/// Stages `count` key rows from element `rows_at` ([`cache_row`]) and scores them against the
/// staged queries (the first half of a tile; [`finish_tile`] is the second).
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn score_tile<F: Float, N: Size>(
    keys: &Array<Vector<F, N>>,
    shared: &mut TileShared,
    rows_at: usize,
    count: usize,
    #[comptime] g: usize,
    #[comptime] d_k: usize,
    #[comptime] vector: usize,
) {
    stage_rows::<F, N>(keys, shared, rows_at, count, d_k, comptime!(d_k + 1), vector);
    sync_cube();
    tile_scores(shared, count, g, d_k);
    sync_cube();
}

/// Copies the tile's raw scaled scores to `scores[at + row * g + h]` (the compressed branch's,
/// which the block selection reads).
#[cube]
pub fn keep_scores(shared: &TileShared, scores: &mut Array<f32>, at: usize, count: usize, #[comptime] g: usize) {
    let mut idx = UNIT_POS as usize;
    while idx < g * count {
        let (row, h) = (idx / g, idx % g);
        scores[at + idx] = shared.probs[h * TILE + row];
        idx += CUBE_DIM as usize;
    }
}

/// The scored tile's partial state, with `count` value rows from element `rows_at`
/// ([`cache_row`]; staged over the keys, whose loads overlap the softmax), into `partials[at..]`.
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn finish_tile<F: Float, N: Size>(
    shared: &mut TileShared,
    values: &Array<Vector<F, N>>,
    partials: &mut Array<f32>,
    rows_at: usize,
    count: usize,
    at: usize,
    #[comptime] g: usize,
    #[comptime] d_v: usize,
    #[comptime] vector: usize,
) {
    stage_rows::<F, N>(values, shared, rows_at, count, d_v, d_v, vector);
    tile_softmax(shared, count, g);
    sync_cube();
    write_partial(shared, partials, at, count, g, d_v);
}
