//! [`super::top_n`]'s forced blocks and top-n for one query per plane, with the argmax of each
//! round exchanged by plane shuffles instead of shared memory and cube barriers: a plane's 32
//! lanes are one query's, so no other plane waits on its rounds. For devices whose planes are
//! exactly [`LANES`] wide (the tensor-core kernel's CUDA).

use cubecl::prelude::*;

use super::top_n::{force_blocks, lane_best, TAKEN};
use crate::tile_sizes::SELECTION_LANES as LANES;

/// Query row `r`'s selection into `chosen[r * n..]` (unordered, `taken[r]` of them), as
/// `super::top_n::take_best`: the forced blocks `first` (its document's first, else 0),
/// `current - 1` and `current`, then up to `n` in all of the eligible blocks
/// (`first <= j <= current`) with the highest scores, ties to the lower index. Lane `lane`
/// scans and marks blocks `lane, lane + LANES, ..` only, and every lane ends each round with
/// the same winner, so the plane needs no barrier until lane 0's list is read ([`sync_plane`]
/// before [`super::top_n::write_list`]).
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn take_best_in_plane(
    scores: &mut SharedMemory<f32>,
    chosen: &mut SharedMemory<u32>,
    taken: &mut SharedMemory<u32>,
    first: usize,
    current: usize,
    r: usize,
    lane: usize,
    #[comptime] blocks: usize,
    #[comptime] n: usize,
) {
    let row = r * blocks;
    let mut count = force_blocks(scores, chosen, first, current, r, lane, blocks, n);
    // The first block is always forced, so at most `n - 1` blocks are chosen by score.
    for _round in 0..comptime!(n - 1) {
        let (lane_score, lane_block) = lane_best(scores, row, first, current, lane, LANES);
        let mut best = lane_score;
        let mut best_j = lane_block;
        // Butterfly: after the five exchanges every lane holds the plane's best.
        #[unroll]
        for step in 0..5u32 {
            let mask = comptime!(16u32 >> step);
            let other = plane_shuffle_xor(best, mask);
            let other_j = plane_shuffle_xor(best_j, mask);
            if other > best || (other == best && other_j < best_j) {
                best = other;
                best_j = other_j;
            }
        }
        if count < n && best > TAKEN {
            if lane == 0 {
                chosen[r * n + count] = best_j;
            }
            if lane == best_j as usize % LANES {
                scores[row + best_j as usize] = TAKEN;
            }
            count += 1;
        }
    }
    if lane == 0 {
        taken[r] = count as u32;
    }
    sync_plane();
}
