//! Which blocks each query selects, in one pass from the compressed branch: the spec's scores
//! (Eq. 9's overlap weights, Eq. 10's sum over a group's heads) and its top-n with forced
//! blocks, with no `T x N` or `T x n_sel` tensor in device memory: only the block lists are
//! written.
//!
//! A cube serves `rows` consecutive queries of one `(b, hk)`, one plane of [`LANES`] units per
//! query (`crate::sparse::tiling::SelectionTiling`), and keeps each query's block scores in shared memory
//! (at most `blocks` of them).
//! 1. [`add_chunk_mass`] ([`super::block_scores`]): the compressed keys visible to the cube's last query, [`CHUNK`] at a
//!    time, staged once for all its queries; lane `c` of a query's plane turns keys
//!    `c, c + LANES, ..` ([`KEYS_PER_LANE`] of them) into `p = sum_h exp(q_h . k scale - lse_h)`
//!    (0 where the key is not visible to that query), then the lane owning selection block `j`
//!    adds `p * overlap` of each key meeting it, keys in ascending order. The sum is the same
//!    sequence of additions wherever the chunk boundaries fall, so equal key sets give
//!    bit-equal scores and exact ties stay ties.
//! 2. [`take_best`]: the forced blocks (0 and the two local ones), then per round a plane-wide
//!    argmax (highest score, ties to the lower index) over the blocks not yet taken.
//! 3. [`write_list`]: the taken blocks in ascending order, `-1` in the unused slots.
//!
//! The scores are not divided by the block length `l`: a positive factor changes no ranking.

use cubecl::prelude::*;

use super::block_scores::{add_chunk_mass, group_mass, key_stride, stage_keys, stage_queries};
use super::selection_cube::SelectionCube;
use crate::kernel::compression::visible::visible_blocks;
use crate::kernel::primitives::rows::{document_start_if, offset3};
use crate::tile_sizes::{SELECTION_CHUNK as CHUNK, SELECTION_KEYS_PER_LANE as KEYS_PER_LANE, SELECTION_LANES as LANES};

/// A taken block's score (real scores are sums of probabilities, never negative).
pub(crate) const TAKEN: f32 = -1.0;

/// `q [B, T, H_q, d_k]`, compressed keys `k [B, N, H_kv, d_k]` (block `i` covering raw
/// tokens `[i * stride, i * stride + length)`), the compressed branch's `lse [B, T, H_q]` (f32)
/// -> `list [B, T, H_kv, n]`: the blocks of `block_size` tokens query `t` attends, ascending,
/// `-1` in unused slots. With `documents` nonzero, query `t` weighs and takes only blocks of its
/// document (`starts [B, T]`, a multiple of `block_size`): its first block is forced in block
/// 0's place. Cube `(LANES, rows)`; `blocks >= ceil(T / block_size)`. The staged
/// query and key rows are read `vector` f32 at a time (`vector` divides `d_k`): the products
/// are bound by shared-memory loads, each query element serving [`KEYS_PER_LANE`] keys.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn select_top_n<F: Float, I: Int, V: Size>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    lse: &Tensor<f32>,
    starts: &Tensor<I>,
    list: &mut Tensor<I>,
    scale: f32,
    documents: u32,
    #[comptime] length: usize,
    #[comptime] stride: usize,
    #[comptime] block_size: usize,
    #[comptime] g: usize,
    #[comptime] d_k: usize,
    #[comptime] rows: usize,
    #[comptime] blocks: usize,
    #[comptime] n: usize,
    #[comptime] vector: usize,
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    let cube = SelectionCube::new(q.shape(0), q.shape(1), k.shape(2), rows);
    if !cube.exists {
        terminate!();
    }
    let (b, hk, t0, t, r, lane) = (cube.b, cube.hk, cube.t0, cube.t, cube.r, cube.lane);

    let mut queries = SharedMemory::<Vector<f32, V>>::new(comptime!(rows * g * d_k / vector));
    let mut stats = SharedMemory::<f32>::new(rows * g);
    let mut scores = SharedMemory::<f32>::new(rows * blocks);
    stage_queries::<F, V>(
        q,
        lse,
        &mut queries,
        &mut stats,
        &mut scores,
        b,
        hk,
        t0,
        scale,
        g,
        d_k,
        rows,
        blocks,
        vector,
    );
    sync_cube();

    let mut keys = SharedMemory::<Vector<f32, V>>::new(comptime!(CHUNK * key_stride(d_k, vector)));
    let mut mass = SharedMemory::<f32>::new(rows * CHUNK);
    let n_keys = k.shape(1);
    let visible = visible_blocks(t, n_keys, length, stride);
    let walk_end = visible_blocks(cube.t_last, n_keys, length, stride);
    // The first compressed and selection blocks of the query's document.
    let start = document_start_if::<I>(starts, b, t, documents);
    let first_key = start.div_ceil(stride);
    let mut first = 0usize;
    while first < walk_end {
        let count = min(walk_end - first, CHUNK);
        stage_keys::<F, V>(k, &mut keys, b, first, count, hk, d_k, vector);
        sync_cube();
        let p = group_mass::<V>(&queries, &stats, &keys, r, lane, g, d_k, vector);
        #[unroll]
        for m in 0..KEYS_PER_LANE {
            let key = lane + m * LANES;
            let own = first + key < visible && first + key >= first_key;
            mass[r * CHUNK + key] = select(own, p[m], 0.0f32);
        }
        sync_cube();
        add_chunk_mass(&mass, &mut scores, r, lane, first, count, length, stride, block_size, blocks);
        sync_cube();
        first += count;
    }

    let mut chosen = SharedMemory::<u32>::new(rows * n);
    let mut taken = SharedMemory::<u32>::new(rows);
    let mut best_score = SharedMemory::<f32>::new(rows * LANES);
    let mut best_block = SharedMemory::<u32>::new(rows * LANES);
    take_best(
        &mut scores,
        &mut chosen,
        &mut taken,
        &mut best_score,
        &mut best_block,
        start / block_size,
        t / block_size,
        r,
        lane,
        blocks,
        n,
    );
    if cube.active {
        write_list::<I, Tensor<I>>(list, &chosen, &taken, offset3::<I>(list, b, t, hk), r, lane, n);
    }
}

/// Query row `r`'s selection into `chosen[r * n..]` (unordered, `taken[r]` of them): the forced
/// blocks `first` (its document's first, else 0), `current - 1` and `current`, then up to `n`
/// in all of the eligible blocks (`first <= j <= current`) with the highest scores, ties to the
/// lower index, one per round. Called by every unit of the cube (it synchronises).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn take_best(
    scores: &mut SharedMemory<f32>,
    chosen: &mut SharedMemory<u32>,
    taken: &mut SharedMemory<u32>,
    best_score: &mut SharedMemory<f32>,
    best_block: &mut SharedMemory<u32>,
    first: usize,
    current: usize,
    r: usize,
    lane: usize,
    #[comptime] blocks: usize,
    #[comptime] n: usize,
) {
    let row = r * blocks;
    let count = force_blocks(scores, chosen, first, current, r, lane, blocks, n);
    if lane == 0 {
        taken[r] = count as u32;
    }
    sync_cube();
    let at = r * LANES;
    // The first block is always forced, so at most `n - 1` blocks are chosen by score.
    for _round in 0..comptime!(n - 1) {
        let (best, best_j) = lane_best(scores, row, first, current, lane, LANES);
        best_score[at + lane] = best;
        best_block[at + lane] = best_j;
        // Halvings of the plane: `LANES` is 32.
        merge_best(best_score, best_block, at, lane, 16usize);
        merge_best(best_score, best_block, at, lane, 8usize);
        merge_best(best_score, best_block, at, lane, 4usize);
        merge_best(best_score, best_block, at, lane, 2usize);
        merge_best(best_score, best_block, at, lane, 1usize);
        sync_cube();
        if lane == 0 {
            let count = taken[r] as usize;
            if count < n && best_score[at] > TAKEN {
                let j = best_block[at];
                chosen[r * n + count] = j;
                scores[row + j as usize] = TAKEN;
                taken[r] = (count + 1) as u32;
            }
        }
        sync_cube();
    }
}

/// The best block of query row `r` (scores from `row`) among those lane `lane` scans
/// (`lane, lane + stride, ..` from `first` up to `current`) and none taken: its score and index,
/// `TAKEN` and 0 when none is left.
#[cube]
pub(crate) fn lane_best(
    scores: &SharedMemory<f32>,
    row: usize,
    first: usize,
    current: usize,
    lane: usize,
    #[comptime] stride: usize,
) -> (f32, u32) {
    let mut best = f32::new(TAKEN);
    let mut best_j = 0u32;
    let mut j = lane;
    while j <= current {
        let s = scores[row + j];
        // Ascending `j`: a strict comparison keeps the lower index of a tie.
        if s > best && j >= first {
            best = s;
            best_j = j as u32;
        }
        j += stride;
    }
    (best, best_j)
}

/// Puts the forced blocks `first` (the document's first, else 0), `current` and `current - 1`
/// (those after `first`) first in query row `r`'s list `chosen[r * n..]` and marks them taken
/// in its scores: lane 0 writes the list, and the lane that scans a block (`j % LANES`) marks
/// it, so a plane that synchronises only itself sees its own marks. Returns how many were
/// forced, the same on every lane.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn force_blocks(
    scores: &mut SharedMemory<f32>,
    chosen: &mut SharedMemory<u32>,
    first: usize,
    current: usize,
    r: usize,
    lane: usize,
    #[comptime] blocks: usize,
    #[comptime] n: usize,
) -> usize {
    let row = r * blocks;
    let mut count = 1usize;
    if lane == 0 {
        chosen[r * n] = first as u32;
    }
    if lane == first % LANES {
        scores[row + first] = TAKEN;
    }
    if current > first {
        if lane == 0 {
            chosen[r * n + count] = current as u32;
        }
        if lane == current % LANES {
            scores[row + current] = TAKEN;
        }
        count += 1;
    }
    if current >= first + 2 {
        if lane == 0 {
            chosen[r * n + count] = (current - 1) as u32;
        }
        if lane == (current - 1) % LANES {
            scores[row + current - 1] = TAKEN;
        }
        count += 1;
    }
    count
}

/// One halving of a plane's argmax: lane `lane < step` keeps the better of its candidate and
/// lane `lane + step`'s (higher score, ties to the lower block). Called by every unit of the
/// cube (it synchronises).
#[cube]
pub(crate) fn merge_best(
    best_score: &mut SharedMemory<f32>,
    best_block: &mut SharedMemory<u32>,
    at: usize,
    lane: usize,
    #[comptime] step: usize,
) {
    sync_cube();
    if lane < step {
        let (other, other_j) = (best_score[at + lane + step], best_block[at + lane + step]);
        let (mine, mine_j) = (best_score[at + lane], best_block[at + lane]);
        if other > mine || (other == mine && other_j < mine_j) {
            best_score[at + lane] = other;
            best_block[at + lane] = other_j;
        }
    }
}

/// Writes query row `r`'s chosen blocks in ascending order (each lane places its blocks by
/// their rank among the chosen) and `-1` in the unused slots, to `list[base..base + n]`.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn write_list<I: Int, L: ListMut<I>>(
    list: &mut L,
    chosen: &SharedMemory<u32>,
    taken: &SharedMemory<u32>,
    base: usize,
    r: usize,
    lane: usize,
    #[comptime] n: usize,
) {
    let count = taken[r] as usize;
    let mut slot = lane;
    while slot < n {
        if slot < count {
            let j = chosen[r * n + slot];
            let mut rank = 0usize;
            for m in 0..count {
                if chosen[r * n + m] < j {
                    rank += 1;
                }
            }
            list.write(base + rank, I::cast_from(j));
        } else {
            list.write(base + slot, I::new(-1));
        }
        slot += LANES;
    }
}
