//! The decode step's top-n over one query's block scores, by the whole cube: unit `u` owns
//! blocks `u, u + units, ..` and keeps its best untaken one in registers; each round the units'
//! bests meet (plane shuffles then one row per plane in shared memory, or a shared-memory tree
//! where planes are not [`LANES`] wide), and only the winner's owner rescans its blocks. The
//! result is the training selection's: the forced blocks, then the highest scores, ties to the
//! lower index ([`crate::kernel::selection::top_n`]).

use cubecl::prelude::*;

use crate::kernel::selection::top_n::{force_blocks, lane_best, TAKEN};
use crate::tile_sizes::SELECTION_LANES as LANES;

/// The better of two candidates: the higher score, ties to the lower block.
#[cube]
fn better(s1: f32, j1: u32, s2: f32, j2: u32) -> (f32, u32) {
    let second = s2 > s1 || (s2 == s1 && j2 < j1);
    (select(second, s2, s1), select(second, j2, j1))
}

/// The cube's best candidate, returned to every unit. `exchange` holds `2 units` words; `round`
/// alternates the halves the plane path writes, so that one barrier a round suffices. Called
/// by every unit (it synchronises).
#[cube]
fn cube_best(
    best: f32,
    best_j: u32,
    score_row: &mut SharedMemory<f32>,
    block_row: &mut SharedMemory<u32>,
    round: usize,
    #[comptime] units: usize,
    #[comptime] plane_exchange: bool,
) -> (f32, u32) {
    let unit = UNIT_POS as usize;
    let mut s = best;
    let mut j = best_j;
    if comptime!(plane_exchange) {
        let planes = comptime!(units / LANES);
        #[unroll]
        for step in 0..5u32 {
            let mask = comptime!(16u32 >> step);
            let (s2, j2) = better(s, j, plane_shuffle_xor(s, mask), plane_shuffle_xor(j, mask));
            s = s2;
            j = j2;
        }
        let half = (round % 2) * planes;
        if unit % LANES == 0 {
            score_row[half + unit / LANES] = s;
            block_row[half + unit / LANES] = j;
        }
        sync_cube();
        s = score_row[half];
        j = block_row[half];
        #[unroll]
        for p in 1..planes {
            let (s2, j2) = better(s, j, score_row[half + p], block_row[half + p]);
            s = s2;
            j = j2;
        }
    } else {
        score_row[unit] = s;
        block_row[unit] = j;
        #[unroll]
        for i in 0..comptime!(units.trailing_zeros() as usize) {
            let step = comptime!(units >> (i + 1));
            sync_cube();
            if unit < step {
                let (s2, j2) = better(score_row[unit], block_row[unit], score_row[unit + step], block_row[unit + step]);
                score_row[unit] = s2;
                block_row[unit] = j2;
            }
        }
        sync_cube();
        s = score_row[0];
        j = block_row[0];
        sync_cube();
    }
    (s, j)
}

/// The query's selection into `chosen[..taken[0]]` (unordered): the forced blocks 0,
/// `current` and `current - 1`, then up to `n` in all of the blocks up to `current` with the
/// highest `scores`, one per round. Called by every unit of the cube (`units` of them, a power
/// of two; it synchronises); marks the taken blocks in `scores`.
#[cube]
pub fn cube_top_n(
    scores: &mut SharedMemory<f32>,
    chosen: &mut SharedMemory<u32>,
    taken: &mut SharedMemory<u32>,
    current: usize,
    #[comptime] blocks: usize,
    #[comptime] n: usize,
    #[comptime] units: usize,
    #[comptime] plane_exchange: bool,
) {
    let unit = UNIT_POS as usize;
    // Every plane forces the same blocks (identical writes), so every unit knows the count.
    let mut count = force_blocks(scores, chosen, 0usize, current, 0usize, unit % LANES, blocks, n);
    sync_cube();
    let mut score_row = SharedMemory::<f32>::new(comptime!(2 * units));
    let mut block_row = SharedMemory::<u32>::new(comptime!(2 * units));
    let (first_best, first_j) = lane_best(scores, 0, 0, current, unit, units);
    let mut best = first_best;
    let mut best_j = first_j;
    // Block 0 is always forced, so at most `n - 1` blocks are chosen by score.
    for round in 0..comptime!(n - 1) {
        let (s, j) = cube_best(best, best_j, &mut score_row, &mut block_row, round, units, plane_exchange);
        if count < n && s > TAKEN {
            if unit == 0 {
                chosen[count] = j;
            }
            if j as usize % units == unit {
                scores[j as usize] = TAKEN;
                let (s2, j2) = lane_best(scores, 0, 0, current, unit, units);
                best = s2;
                best_j = j2;
            }
            count += 1;
        }
    }
    if unit == 0 {
        taken[0] = count as u32;
    }
    sync_cube();
}
