//! One decode step per `(b, hk)` cube of `planes` planes of [`LANES`] units, at the sequence's
//! position `t` (a run-time value, so shapes never change from token to token):
//! 1. stage the group's `g` query rows (scaled, f32) in shared memory;
//! 2. the compressed branch over the blocks complete at `t` ([`attend_keys`], the planes'
//!    states merged by [`merge_planes`]), whose log-sum-exps feed
//! 3. the block selection: each key's mass `sum_h exp(q_h . k - lse_h)` (a chunk of
//!    `planes x LANES` keys at a time), then the training selection's own steps in the first
//!    plane: block scores with keys in ascending order ([`add_chunk_mass`]), forced blocks and
//!    top-n ([`take_top_n`]), the list ([`write_list`]);
//! 4. the selected branch over the chosen blocks' positions `<= t`;
//! 5. the window branch over the ring's filled slots.

use cubecl::prelude::*;

use super::attend::{attend_keys, key_scores, merge_planes, write_rows, DecodeRows};
use crate::kernel::compression::visible::visible_blocks;
use crate::kernel::primitives::rows::offset3;
use crate::kernel::selection::block_scores::add_chunk_mass;
use crate::kernel::selection::top_n::{force_blocks, lane_best, merge_best, write_list, TAKEN};
use crate::tile_sizes::SELECTION_LANES as LANES;

/// `q [B, 1, H_q, d_k]`; the cache's compressed blocks, selected-branch rows and window ring as
/// `[B, S, H_kv, d]` (any strides); the positions `[B]` -> the three branch outputs
/// `[B, 1, H_q, d_v]` and the block lists `[B, 1, H_kv, n]` (ascending, `-1` unused).
/// `blocks` (a multiple of [`LANES`]) holds every selection block of the cache.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn decode_step<F: Float, I: Int, V: Size>(
    q: &Tensor<F>,
    compressed_k: &Tensor<F>,
    compressed_v: &Tensor<F>,
    selected_k: &Tensor<F>,
    selected_v: &Tensor<F>,
    window_k: &Tensor<F>,
    window_v: &Tensor<F>,
    positions: &Tensor<I>,
    out_compressed: &mut Tensor<F>,
    out_selected: &mut Tensor<F>,
    out_window: &mut Tensor<F>,
    list: &mut Tensor<I>,
    scale: f32,
    #[comptime] length: usize,
    #[comptime] stride: usize,
    #[comptime] block_size: usize,
    #[comptime] g: usize,
    #[comptime] d_k: usize,
    #[comptime] d_v: usize,
    #[comptime] blocks: usize,
    #[comptime] n: usize,
    #[comptime] vector: usize,
    #[comptime] planes: usize,
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    let h_kv = compressed_k.shape(2);
    let cube = CUBE_POS;
    if cube >= q.shape(0) * h_kv {
        terminate!();
    }
    let (b, hk) = (cube / h_kv, cube % h_kv);
    let t = u32::cast_from(positions[b]) as usize;
    let lane = UNIT_POS_X as usize;
    let lead = UNIT_POS_Y == 0;

    let mut queries = SharedMemory::<Vector<f32, V>>::new(comptime!(g * d_k / vector));
    let mut scores = SharedMemory::<f32>::new(blocks);
    stage_query::<F, V>(q, &mut queries, &mut scores, b, hk, scale, g, d_k, blocks, vector);
    sync_cube();

    let mut chunk = SharedMemory::<f32>::new(comptime!(planes * g * LANES));
    let mut stats = SharedMemory::<f32>::new(comptime!(planes * g * 2));
    let mut outs = SharedMemory::<f32>::new(comptime!(planes * g * d_v));
    let mut chosen = SharedMemory::<u32>::new(n);
    let visible = visible_blocks(t, compressed_k.shape(1), length, stride);
    let mut rows = DecodeRows::new(g, d_v);
    attend_keys::<F, V>(
        &mut rows,
        &queries,
        compressed_k,
        compressed_v,
        &mut chunk,
        &chosen,
        b,
        hk,
        visible,
        t,
        false,
        block_size,
        g,
        d_k,
        d_v,
        vector,
        planes,
    );
    merge_planes(&mut rows, &mut stats, &mut outs, g, d_v, planes);
    write_rows::<F>(&rows, out_compressed, b, hk, g, d_v);

    add_block_scores::<F, V>(
        &queries,
        &rows,
        compressed_k,
        &mut scores,
        b,
        hk,
        visible,
        length,
        stride,
        block_size,
        g,
        d_k,
        blocks,
        vector,
        planes,
    );
    let mut taken = SharedMemory::<u32>::new(1usize);
    take_top_n(&mut scores, &mut chosen, &mut taken, t / block_size, blocks, n, planes);
    if lead {
        write_list::<I>(list, &chosen, &taken, offset3::<I>(list, b, 0, hk), 0, lane, n);
    }

    let mut rows = DecodeRows::new(g, d_v);
    let keys = taken[0] as usize * block_size;
    attend_keys::<F, V>(
        &mut rows, &queries, selected_k, selected_v, &mut chunk, &chosen, b, hk, keys, t, true, block_size, g, d_k,
        d_v, vector, planes,
    );
    merge_planes(&mut rows, &mut stats, &mut outs, g, d_v, planes);
    write_rows::<F>(&rows, out_selected, b, hk, g, d_v);

    let mut rows = DecodeRows::new(g, d_v);
    let filled = min(t + 1, window_k.shape(1));
    attend_keys::<F, V>(
        &mut rows, &queries, window_k, window_v, &mut chunk, &chosen, b, hk, filled, t, false, block_size, g, d_k, d_v,
        vector, planes,
    );
    merge_planes(&mut rows, &mut stats, &mut outs, g, d_v, planes);
    write_rows::<F>(&rows, out_window, b, hk, g, d_v);
}

/// Stages the `g` query rows of `(b, hk)` times `scale` (f32 vectors of `vector`) and zeroes
/// the block scores.
#[cube]
#[allow(clippy::too_many_arguments)]
fn stage_query<F: Float, V: Size>(
    q: &Tensor<F>,
    queries: &mut SharedMemory<Vector<f32, V>>,
    scores: &mut SharedMemory<f32>,
    b: usize,
    hk: usize,
    scale: f32,
    #[comptime] g: usize,
    #[comptime] d_k: usize,
    #[comptime] blocks: usize,
    #[comptime] vector: usize,
) {
    let per_row = comptime!(d_k / vector);
    let units = CUBE_DIM as usize;
    let mut idx = UNIT_POS as usize;
    while idx < g * per_row {
        let at = offset3::<F>(q, b, 0, hk * g + idx / per_row) + (idx % per_row) * vector;
        let mut value = Vector::<f32, V>::new(0.0f32);
        #[unroll]
        for e in 0..vector {
            value[e] = f32::cast_from(q[at + e]) * scale;
        }
        queries[idx] = value;
        idx += units;
    }
    idx = UNIT_POS as usize;
    while idx < blocks {
        scores[idx] = 0.0f32;
        idx += units;
    }
}

/// The spec's block scores of the query (Eq. 9 and 10, not divided by `length`) from the
/// `visible` compressed keys and the compressed branch's merged `rows` (their log-sum-exps):
/// every unit computes one key's mass per chunk, the first plane adds the chunk's masses to the
/// scores in ascending key order, as the training selection does.
#[cube]
#[allow(clippy::too_many_arguments)]
fn add_block_scores<F: Float, V: Size>(
    queries: &SharedMemory<Vector<f32, V>>,
    rows: &DecodeRows,
    compressed_k: &Tensor<F>,
    scores: &mut SharedMemory<f32>,
    b: usize,
    hk: usize,
    visible: usize,
    #[comptime] length: usize,
    #[comptime] stride: usize,
    #[comptime] block_size: usize,
    #[comptime] g: usize,
    #[comptime] d_k: usize,
    #[comptime] blocks: usize,
    #[comptime] vector: usize,
    #[comptime] planes: usize,
) {
    let lane = UNIT_POS_X as usize;
    let span = comptime!(planes * LANES);
    let mut mass = SharedMemory::<f32>::new(span);
    let mine = UNIT_POS_Y as usize * LANES + lane;
    let mut first = 0usize;
    while first < visible {
        let count = min(visible - first, span);
        let valid = mine < count;
        let s = key_scores::<F, V>(queries, compressed_k, b, hk, first + mine, valid, g, d_k, vector);
        let mut p = 0.0f32;
        #[unroll]
        for h in 0..g {
            p += (s[h] - rows.lse(h)).exp();
        }
        mass[mine] = select(valid, p, 0.0f32);
        sync_cube();
        if UNIT_POS_Y == 0 {
            add_chunk_mass(&mass, scores, 0, lane, first, count, length, stride, block_size, blocks);
        }
        sync_cube();
        first += count;
    }
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
        let count = force_blocks(scores, chosen, current, 0, lane, blocks, n);
        if lane == 0 {
            taken[0] = count as u32;
        }
    }
    sync_cube();
    // Block 0 is always forced, so at most `n - 1` blocks are chosen by score.
    for _round in 0..comptime!(n - 1) {
        let (best, best_j) = lane_best(scores, 0, current, lane);
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
