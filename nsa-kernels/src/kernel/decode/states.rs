//! Softmax states `(maximum, sum of exponentials)` of a branch's tiles, combined across a
//! cube's units: the merges and the selection's log-sum-exps reduce over tiles in parallel,
//! since a unit walking all of a branch's tiles alone waits on one load per tile.

use cubecl::prelude::*;

use super::tile::partial_at;
use crate::kernel::primitives::rows::NEG_LARGE;

/// Two states as one, each sum rescaled to the larger maximum.
#[cube]
pub fn combine(m1: f32, s1: f32, m2: f32, s2: f32) -> (f32, f32) {
    let m = max(m1, m2);
    (m, s1 * (m1 - m).exp() + s2 * (m2 - m).exp())
}

/// Head `h`'s state over this unit's tiles `first + lane, first + lane + width, ..` (below
/// `first + count`) of `bh` in `partials` (`[B * H_kv, tiles, g, 2 + d_v]`, contiguous); the empty state
/// `(NEG_LARGE, 0)` when it has none.
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn lane_state(
    partials: &Array<f32>,
    tiles: usize,
    bh: usize,
    h: usize,
    first: usize,
    count: usize,
    lane: usize,
    #[comptime] width: usize,
    #[comptime] g: usize,
    #[comptime] d_v: usize,
) -> (f32, f32) {
    let mut m = f32::new(NEG_LARGE);
    let mut s = 0.0f32;
    let mut tile = lane;
    while tile < count {
        let at = partial_at(bh, first + tile, h, tiles, g, d_v);
        let (m2, s2) = combine(m, s, partials[at], partials[at + 1]);
        m = m2;
        s = s2;
        tile += width;
    }
    (m, s)
}

/// The combined state of each row of `width` consecutive units (`width` a power of two
/// dividing `units`, the cube's size), returned to every unit of the row, through `exchange`
/// (`2 units`). Called by every unit of the cube (it synchronises).
#[cube]
pub fn row_state(
    m: f32,
    s: f32,
    exchange: &mut SharedMemory<f32>,
    #[comptime] units: usize,
    #[comptime] width: usize,
) -> (f32, f32) {
    let unit = UNIT_POS as usize;
    let lane = unit % width;
    exchange[unit] = m;
    exchange[units + unit] = s;
    #[unroll]
    for i in 0..comptime!(width.trailing_zeros() as usize) {
        let step = comptime!(width >> (i + 1));
        sync_cube();
        if lane < step {
            let (m2, s2) =
                combine(exchange[unit], exchange[units + unit], exchange[unit + step], exchange[units + unit + step]);
            exchange[unit] = m2;
            exchange[units + unit] = s2;
        }
    }
    sync_cube();
    let row = unit - lane;
    let state = (exchange[row], exchange[units + row]);
    // The exchange is free again only when every unit has read its row.
    sync_cube();
    state
}
