//! Flash decoding's merge: a branch's tile partials ([`super::tile`]) into one head's output
//! row. One cube per `(b * H_kv + hk, h, branch)`: its units first combine the tiles' states
//! ([`super::states`]), then split the tiles between them, each summing its tiles' columns
//! rescaled to the branch's maximum with its loads unrolled, and the parts meet in shared memory.

use cubecl::prelude::*;

use super::states::{lane_state, row_state};
use super::tile::partial_at;
use super::tiles::tiles_of;
use super::StepExtent;
use crate::kernel::compression::visible::visible_blocks;
use crate::tile_sizes::DECODE_TILE as TILE_ROWS;

/// Units of a merge's cube (a power of two).
pub const MERGE_UNITS: usize = 256;
/// Tiles a unit's loads cover at once.
const UNROLL: usize = 4;

/// The partials (`[B * H_kv, tiles_c + tiles_w + tiles_s, g, 2 + d_v]`: the compressed
/// branch's tiles, the window's, the selected blocks'; `tiles_c = ceil(n_compressed / TILE)`,
/// `tiles_w = ceil(ring / TILE)`) and the positions `[B]` -> the compressed, selected and
/// window outputs `[B, 1, H_q, d_v]` (zeros for a head that saw no key). Cubes `(B * H_kv * g,
/// 3)` of [`MERGE_UNITS`]; only the compressed keys visible at `t` and the ring's filled slots
/// are merged (their later tiles are not written), and every selected tile (an unused one is
/// empty).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn decode_merge<F: Float, I: Int>(
    partials: &Array<f32>,
    positions: &Array<I>,
    out_compressed: &mut Array<F>,
    out_selected: &mut Array<F>,
    out_window: &mut Array<F>,
    extent: StepExtent,
    #[comptime] n_compressed: usize,
    #[comptime] ring: usize,
    #[comptime] length: usize,
    #[comptime] stride: usize,
    #[comptime] g: usize,
    #[comptime] d_v: usize,
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    let (bh, h, branch) = (CUBE_POS_X as usize / g, CUBE_POS_X as usize % g, CUBE_POS_Y);
    if bh >= extent.groups {
        terminate!();
    }
    let t = u32::cast_from(positions[bh / extent.h_kv]) as usize;
    let (tiles_c, tiles_w) = (comptime!(n_compressed.div_ceil(TILE_ROWS)), comptime!(ring.div_ceil(TILE_ROWS)));
    // The branch's tiles, chosen without a branch around the merge (it synchronises).
    let mut first = 0usize;
    let mut count = tiles_of(visible_blocks(t, n_compressed, length, stride));
    if branch == 1 {
        first = comptime!(tiles_c + tiles_w);
        count = extent.tiles - first;
    }
    if branch == 2 {
        first = tiles_c;
        count = tiles_of(min(t + 1, ring));
    }
    let mut shared = SharedMemory::<f32>::new(comptime!(2 * MERGE_UNITS));
    let row = merge_row(partials, extent.tiles, &mut shared, bh, h, first, count, g, d_v);
    let unit = UNIT_POS as usize;
    if unit < d_v {
        // Every unit holds the row's columns `unit, unit + MERGE_UNITS, ..`.
        let mut c = unit;
        let mut i = 0usize;
        while c < d_v {
            let value = F::cast_from(row[i]);
            // Outputs `[B, 1, H_q, d_v]`: head `hk g + h` of sequence `b` is row `bh g + h`.
            let at = (bh * g + h) * d_v + c;
            if branch == 0 {
                out_compressed[at] = value;
            } else if branch == 1 {
                out_selected[at] = value;
            } else {
                out_window[at] = value;
            }
            c += MERGE_UNITS;
            i += 1;
        }
    }
}

/// Head `h`'s output over tiles `first..first + count` of `bh`: unit `u < d_v` gets columns
/// `u, u + MERGE_UNITS, ..` in the returned array (0 for a head that saw no key). Called by
/// every unit of the cube (it synchronises); `shared` holds two words a unit.
#[cube]
#[allow(clippy::too_many_arguments)]
fn merge_row(
    partials: &Array<f32>,
    tiles: usize,
    shared: &mut SharedMemory<f32>,
    bh: usize,
    h: usize,
    first: usize,
    count: usize,
    #[comptime] g: usize,
    #[comptime] d_v: usize,
) -> Array<f32> {
    let unit = UNIT_POS as usize;
    let (m, s) = lane_state(partials, tiles, bh, h, first, count, unit, MERGE_UNITS, g, d_v);
    let (top, sum) = row_state(m, s, shared, MERGE_UNITS, MERGE_UNITS);
    let inverse = select(sum > 0.0f32, 1.0f32 / sum, 0.0f32);

    // Units `(part, column)`: `parts` of them share a column, each over every `parts`-th tile.
    let cols = comptime!(std::cmp::min(d_v, MERGE_UNITS));
    let parts = comptime!(MERGE_UNITS / std::cmp::min(d_v, MERGE_UNITS));
    let col_rounds = comptime!(d_v.div_ceil(std::cmp::min(d_v, MERGE_UNITS)));
    let (column, part) = (unit % cols, unit / cols);
    let last = max(count, 1) - 1;
    let mut acc = Array::<f32>::new(col_rounds);
    #[unroll]
    for r in 0..col_rounds {
        acc[r] = 0.0f32;
    }
    let mut tile = part;
    while tile < count {
        // Clamped, not guarded, so that the loads issue together; a tile past `count` weighs 0.
        #[unroll]
        for k in 0..UNROLL {
            let at = partial_at(bh, first + min(tile + k * parts, last), h, tiles, g, d_v);
            let weight = select(tile + k * parts < count, (partials[at] - top).exp(), 0.0f32);
            #[unroll]
            for r in 0..col_rounds {
                acc[r] += weight * partials[at + 2 + min(column + r * cols, comptime!(d_v - 1))];
            }
        }
        tile += comptime!(UNROLL * (MERGE_UNITS / std::cmp::min(d_v, MERGE_UNITS)));
    }
    // The parts' sums meet in shared memory, a round of columns at a time.
    let mut row = Array::<f32>::new(col_rounds);
    #[unroll]
    for r in 0..col_rounds {
        shared[unit] = acc[r];
        sync_cube();
        let mut total = 0.0f32;
        if unit < cols {
            for p in 0..parts {
                total += shared[p * cols + unit];
            }
        }
        row[r] = total * inverse;
        sync_cube();
    }
    row
}
