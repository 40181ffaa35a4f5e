//! The decode step's block selection, one cube per `(b, hk)`, between the tile kernels
//! ([`super::tiles`]): it merges the compressed branch's and the window's partials into their
//! outputs, turns the compressed branch's kept scores into each key's mass
//! `sum_h exp(s_h - lse_h)`, spreads the masses over the selection blocks (Eq. 9, 10, keys in
//! ascending order, as the training selection adds them), and takes the forced blocks and the
//! top-n into the block list that [`super::tiles::decode_selected_tiles`] reads.

use cubecl::prelude::*;

use super::merge::merge_tiles;
use super::tiles::tiles_of;
use crate::kernel::compression::visible::visible_blocks;
use crate::kernel::primitives::rows::offset3;
use crate::kernel::selection::plane_top_n::take_best_in_plane;
use crate::kernel::selection::top_n::{force_blocks, lane_best, merge_best, write_list, TAKEN};
use crate::tile_sizes::SELECTION_LANES as LANES;

/// The partials of [`super::tiles::decode_tiles`] (`[B * H_kv, tiles_c + tiles_w, g, 2 +
/// d_v]`), its kept scores `[B * H_kv, N, g]` and the positions `[B]` -> the compressed and
/// window outputs `[B, 1, H_q, d_v]` and the block lists `[B, 1, H_kv, n]` (ascending, `-1`
/// unused). Cube `(LANES, planes)`; `keys >= N` and `blocks` (every selection block of the
/// cache) size the shared masses and scores. `plane_exchange`: the device's planes are exactly
/// [`LANES`] wide, so the top-n's rounds exchange by shuffles in one plane.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn decode_select<F: Float, I: Int>(
    partials: &Tensor<f32>,
    scores: &Tensor<f32>,
    positions: &Tensor<I>,
    out_compressed: &mut Tensor<F>,
    out_window: &mut Tensor<F>,
    list: &mut Tensor<I>,
    #[comptime] length: usize,
    #[comptime] stride: usize,
    #[comptime] block_size: usize,
    #[comptime] ring: usize,
    #[comptime] g: usize,
    #[comptime] d_v: usize,
    #[comptime] keys: usize,
    #[comptime] blocks: usize,
    #[comptime] n: usize,
    #[comptime] planes: usize,
    #[comptime] plane_exchange: bool,
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    let bh = CUBE_POS;
    if bh >= partials.shape(0) {
        terminate!();
    }
    let h_kv = list.shape(2);
    let (b, hk) = (bh / h_kv, bh % h_kv);
    let t = u32::cast_from(positions[b]) as usize;
    let n_compressed = scores.shape(1);
    let tiles_c = tiles_of(n_compressed);
    let visible = visible_blocks(t, n_compressed, length, stride);
    let filled = min(t + 1, ring);

    let mut lse = SharedMemory::<f32>::new(comptime!(2 * g));
    merge_tiles::<F>(partials, out_compressed, &mut lse, 0, bh, b, hk, 0, tiles_of(visible), g, d_v);
    merge_tiles::<F>(partials, out_window, &mut lse, g, bh, b, hk, tiles_c, tiles_of(filled), g, d_v);
    sync_cube();

    let mut mass = SharedMemory::<f32>::new(keys);
    key_masses(scores, &lse, &mut mass, bh, visible, g);
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
    let current = t / block_size;
    let lane = UNIT_POS_X as usize;
    if plane_exchange {
        if UNIT_POS_Y == 0 {
            take_best_in_plane(&mut block_scores, &mut chosen, &mut taken, 0usize, current, 0, lane, blocks, n);
        }
    } else {
        take_top_n(&mut block_scores, &mut chosen, &mut taken, current, blocks, n, planes);
    }
    if UNIT_POS_Y == 0 {
        write_list::<I>(list, &chosen, &taken, offset3::<I>(list, b, 0, hk), 0, lane, n);
    }
}

/// `mass[i] = sum_h exp(scores[bh, i, h] - lse[h])` for the `visible` compressed keys.
#[cube]
fn key_masses(
    scores: &Tensor<f32>,
    lse: &SharedMemory<f32>,
    mass: &mut SharedMemory<f32>,
    bh: usize,
    visible: usize,
    #[comptime] g: usize,
) {
    let base = bh * scores.shape(1) * g;
    let mut i = UNIT_POS as usize;
    while i < visible {
        let mut p = 0.0f32;
        #[unroll]
        for h in 0..g {
            p += (scores[base + i * g + h] - lse[h]).exp();
        }
        mass[i] = p;
        i += CUBE_DIM as usize;
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

/// The query's selection into `chosen[..taken[0]]` (unordered): the forced blocks 0,
/// `current - 1` and `current`, then up to `n` in all of the eligible blocks with the highest
/// scores, ties to the lower index, one per round, as the training selection takes them. The
/// first plane decides; the others take part in its barriers, each halving its own exchange
/// row. Called by every unit of the cube (it synchronises).
#[cube]
fn take_top_n(
    scores: &mut SharedMemory<f32>,
    chosen: &mut SharedMemory<u32>,
    taken: &mut SharedMemory<u32>,
    current: usize,
    #[comptime] blocks: usize,
    #[comptime] n: usize,
    #[comptime] planes: usize,
) {
    let lane = UNIT_POS_X as usize;
    let lead = UNIT_POS_Y == 0;
    let mut best_score = SharedMemory::<f32>::new(comptime!(planes * LANES));
    let mut best_block = SharedMemory::<u32>::new(comptime!(planes * LANES));
    let at = UNIT_POS_Y as usize * LANES;
    if lead {
        let count = force_blocks(scores, chosen, 0usize, current, 0, lane, blocks, n);
        if lane == 0 {
            taken[0] = count as u32;
        }
    }
    sync_cube();
    // Block 0 is always forced, so at most `n - 1` blocks are chosen by score.
    for _round in 0..comptime!(n - 1) {
        let (best, best_j) = lane_best(scores, 0, 0usize, current, lane);
        best_score[at + lane] = best;
        best_block[at + lane] = best_j;
        merge_best(&mut best_score, &mut best_block, at, lane, 16usize);
        merge_best(&mut best_score, &mut best_block, at, lane, 8usize);
        merge_best(&mut best_score, &mut best_block, at, lane, 4usize);
        merge_best(&mut best_score, &mut best_block, at, lane, 2usize);
        merge_best(&mut best_score, &mut best_block, at, lane, 1usize);
        sync_cube();
        if lead && lane == 0 {
            let count = taken[0] as usize;
            if count < n && best_score[0] > TAKEN {
                let j = best_block[0];
                chosen[count] = j;
                scores[j as usize] = TAKEN;
                taken[0] = (count + 1) as u32;
            }
        }
        sync_cube();
    }
}
