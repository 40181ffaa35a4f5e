//! The decode step's block selection, one cube per `(b, hk)`, between the tile kernels
//! ([`super::tiles`]): the compressed branch's log-sum-exp per head from its tiles' states,
//! its kept scores as each key's mass `sum_h exp(s_h - lse_h)`, the masses spread over the
//! selection blocks (Eq. 9, 10, keys in ascending order, as the training selection adds them),
//! and the forced blocks and the top-n ([`super::top_n`]) into the block list that
//! [`super::tiles::decode_selected_tiles`] reads.

use cubecl::prelude::*;

use super::states::{lane_state, row_state};
use super::tiles::tiles_of;
use super::top_n::cube_top_n;
use super::StepExtent;
use crate::kernel::compression::visible::visible_blocks;
use crate::kernel::selection::top_n::write_list;
use crate::tile_sizes::SELECTION_LANES as LANES;

/// The partials of [`super::tiles::decode_tiles`] (`[B * H_kv, tiles, g, 2 + d_v]`, the
/// compressed branch's first), its kept scores `[B * H_kv, N, g]` and the positions `[B]` ->
/// the block lists `[B, 1, H_kv, n]` (ascending, `-1` unused). Cube `(LANES, planes)`;
/// `keys >= N` and `blocks` (every selection block of the cache) size the shared masses and
/// scores. `plane_exchange`: the device's planes are exactly [`LANES`] wide, so the top-n's
/// rounds exchange by shuffles within each plane.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn decode_select<I: Int>(
    partials: &Array<f32>,
    scores: &Array<f32>,
    positions: &Array<I>,
    list: &mut Array<I>,
    extent: StepExtent,
    #[comptime] length: usize,
    #[comptime] stride: usize,
    #[comptime] block_size: usize,
    #[comptime] g: usize,
    #[comptime] d_v: usize,
    #[comptime] keys: usize,
    #[comptime] blocks: usize,
    #[comptime] n: usize,
    #[comptime] planes: usize,
    #[comptime] plane_exchange: bool,
    #[define(I)] _dtype: StorageType,
) {
    let bh = CUBE_POS;
    if bh >= extent.groups {
        terminate!();
    }
    let t = u32::cast_from(positions[bh / extent.h_kv]) as usize;
    let visible = visible_blocks(t, extent.n_compressed, length, stride);

    let mut lse = SharedMemory::<f32>::new(g);
    head_lses(partials, extent.tiles, &mut lse, bh, tiles_of(visible), g, d_v, planes);
    let mut mass = SharedMemory::<f32>::new(keys);
    key_masses(scores, &lse, &mut mass, bh * extent.n_compressed * g, visible, g);
    sync_cube();
    let mut block_scores = SharedMemory::<f32>::new(blocks);
    let mut j = UNIT_POS as usize;
    while j < blocks {
        block_scores[j] = block_score(&mass, j, visible, length, stride, block_size);
        j += CUBE_DIM as usize;
    }
    sync_cube();

    let mut chosen = SharedMemory::<u32>::new(n);
    let mut taken = SharedMemory::<u32>::new(1usize);
    cube_top_n(
        &mut block_scores,
        &mut chosen,
        &mut taken,
        t / block_size,
        blocks,
        n,
        comptime!(planes * LANES),
        plane_exchange,
    );
    if UNIT_POS_Y == 0 {
        write_list::<I, Array<I>>(list, &chosen, &taken, bh * n, 0, UNIT_POS_X as usize, n);
    }
}

/// Each head's log-sum-exp over the compressed branch's first `count` tiles of `bh` into
/// `lse` (meaningless for a branch with no key): a plane of [`LANES`] units per head, the
/// cube's planes taking the heads in rounds. Called by every unit (it synchronises).
#[cube]
#[allow(clippy::too_many_arguments)]
fn head_lses(
    partials: &Array<f32>,
    tiles: usize,
    lse: &mut SharedMemory<f32>,
    bh: usize,
    count: usize,
    #[comptime] g: usize,
    #[comptime] d_v: usize,
    #[comptime] planes: usize,
) {
    let units = comptime!(planes * LANES);
    let mut exchange = SharedMemory::<f32>::new(comptime!(2 * planes * LANES));
    let (lane, plane) = (UNIT_POS_X as usize, UNIT_POS_Y as usize);
    #[unroll]
    for round in 0..comptime!(g.div_ceil(planes)) {
        let h = min(round * planes + plane, comptime!(g - 1));
        let (m, s) = lane_state(partials, tiles, bh, h, 0, count, lane, LANES, g, d_v);
        let (top, sum) = row_state(m, s, &mut exchange, units, LANES);
        if lane == 0 && round * planes + plane < g {
            lse[h] = top + sum.ln();
        }
    }
    sync_cube();
}

/// `mass[i] = sum_h exp(scores[base + i g + h] - lse[h])` for the `visible` compressed keys
/// (the group's kept scores from `base`), each unit's keys four at a time so that their loads
/// issue together.
#[cube]
fn key_masses(
    scores: &Array<f32>,
    lse: &SharedMemory<f32>,
    mass: &mut SharedMemory<f32>,
    base: usize,
    visible: usize,
    #[comptime] g: usize,
) {
    let units = CUBE_DIM as usize;
    let last = max(visible, 1) - 1;
    let mut i = UNIT_POS as usize;
    while i < visible {
        let mut p = Array::<f32>::new(4usize);
        #[unroll]
        for k in 0..4usize {
            p[k] = 0.0f32;
            let key = min(i + k * units, last);
            #[unroll]
            for h in 0..g {
                p[k] += (scores[base + key * g + h] - lse[h]).exp();
            }
        }
        #[unroll]
        for k in 0..4usize {
            if i + k * units < visible {
                mass[i + k * units] = p[k];
            }
        }
        i += 4 * units;
    }
}

/// Selection block `j`'s score (Eq. 9, not divided by `length`): the masses of the visible
/// compressed keys meeting its `size` tokens, each times its overlap in tokens, added in
/// ascending key order.
#[cube]
fn block_score(
    mass: &SharedMemory<f32>,
    j: usize,
    visible: usize,
    #[comptime] length: usize,
    #[comptime] stride: usize,
    #[comptime] size: usize,
) -> f32 {
    let (start, end) = (j * size, (j + 1) * size);
    // Keys with `i * stride < end` and `i * stride + length > start`.
    let mut i = 0usize;
    if start + 1 > length {
        i = (start + 1 - length + stride - 1) / stride;
    }
    let i_end = min(visible, (end - 1) / stride + 1);
    let mut total = 0.0f32;
    while i < i_end {
        let overlap = min(i * stride + length, end) - max(i * stride, start);
        total += mass[i] * f32::cast_from(overlap as u32);
        i += 1;
    }
    total
}
