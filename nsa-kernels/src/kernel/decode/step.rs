//! One decode step per `(b, hk)` cube of one plane ([`LANES`] units), at the sequence's
//! position `t` (a run-time value, so shapes never change from token to token):
//! 1. stage the group's `g` query rows (scaled, f32) in shared memory;
//! 2. the compressed branch over the blocks complete at `t` ([`attend_keys`]), whose
//!    log-sum-exps feed
//! 3. the block selection, with the training kernel's own steps (the same sums in the same
//!    order, so the same ties): key masses ([`group_mass`]), block scores ([`add_chunk_mass`]),
//!    forced blocks and top-n ([`take_best`]), the list ([`write_list`]);
//! 4. the selected branch over the chosen blocks' positions `<= t`;
//! 5. the window branch over the ring's filled slots.

use cubecl::prelude::*;

use super::attend::{attend_keys, write_rows, DecodeRows};
use crate::kernel::compression::visible::visible_blocks;
use crate::kernel::primitives::rows::offset3;
use crate::kernel::selection::block_scores::{add_chunk_mass, group_mass, key_stride, stage_keys};
use crate::kernel::selection::top_n::{take_best, write_list};
use crate::sparse::tiling::{
    SELECTION_CHUNK as CHUNK, SELECTION_KEYS_PER_LANE as KEYS_PER_LANE, SELECTION_LANES as LANES,
};

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
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    let h_kv = compressed_k.shape(2);
    let cube = CUBE_POS;
    if cube >= q.shape(0) * h_kv {
        terminate!();
    }
    let (b, hk) = (cube / h_kv, cube % h_kv);
    let t = u32::cast_from(positions[b]) as usize;

    let mut queries = SharedMemory::<Vector<f32, V>>::new(comptime!(g * d_k / vector));
    let mut scores = SharedMemory::<f32>::new(blocks);
    stage_query::<F, V>(q, &mut queries, &mut scores, b, hk, scale, g, d_k, blocks, vector);
    sync_cube();

    let mut chunk = SharedMemory::<f32>::new(comptime!(g * LANES));
    let visible = visible_blocks(t, compressed_k.shape(1), length, stride);
    let mut rows = DecodeRows::new(g, d_v);
    attend_keys::<F, V>(
        &mut rows,
        &queries,
        compressed_k,
        compressed_v,
        &mut chunk,
        b,
        hk,
        0,
        visible,
        g,
        d_k,
        d_v,
        vector,
    );
    write_rows::<F>(&rows, out_compressed, b, hk, g, d_v);

    let mut lse = SharedMemory::<f32>::new(g);
    if UNIT_POS == 0 {
        #[unroll]
        for h in 0..g {
            lse[h] = rows.lse(h);
        }
    }
    sync_cube();
    add_block_scores::<F, V>(
        &queries,
        &lse,
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
    );

    let mut chosen = SharedMemory::<u32>::new(n);
    let mut taken = SharedMemory::<u32>::new(1usize);
    let mut best_score = SharedMemory::<f32>::new(LANES);
    let mut best_block = SharedMemory::<u32>::new(LANES);
    let lane = UNIT_POS_X as usize;
    take_best(
        &mut scores,
        &mut chosen,
        &mut taken,
        &mut best_score,
        &mut best_block,
        t / block_size,
        0,
        lane,
        blocks,
        n,
    );
    write_list::<I>(list, &chosen, &taken, offset3::<I>(list, b, 0, hk), 0, lane, n);

    let mut rows = DecodeRows::new(g, d_v);
    let count = taken[0] as usize;
    for slot in 0..count {
        let first = chosen[slot] as usize * block_size;
        let keys = min(block_size, t + 1 - first);
        attend_keys::<F, V>(
            &mut rows, &queries, selected_k, selected_v, &mut chunk, b, hk, first, keys, g, d_k, d_v, vector,
        );
    }
    write_rows::<F>(&rows, out_selected, b, hk, g, d_v);

    let mut rows = DecodeRows::new(g, d_v);
    let filled = min(t + 1, window_k.shape(1));
    attend_keys::<F, V>(&mut rows, &queries, window_k, window_v, &mut chunk, b, hk, 0, filled, g, d_k, d_v, vector);
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
    let mut idx = UNIT_POS as usize;
    while idx < g * per_row {
        let at = offset3::<F>(q, b, 0, hk * g + idx / per_row) + (idx % per_row) * vector;
        let mut value = Vector::<f32, V>::new(0.0f32);
        #[unroll]
        for e in 0..vector {
            value[e] = f32::cast_from(q[at + e]) * scale;
        }
        queries[idx] = value;
        idx += LANES;
    }
    idx = UNIT_POS as usize;
    while idx < blocks {
        scores[idx] = 0.0f32;
        idx += LANES;
    }
}

/// The spec's block scores of the query (Eq. 9 and 10, not divided by `length`) from the
/// `visible` compressed keys, a chunk at a time, as the training selection sums them.
#[cube]
#[allow(clippy::too_many_arguments)]
fn add_block_scores<F: Float, V: Size>(
    queries: &SharedMemory<Vector<f32, V>>,
    lse: &SharedMemory<f32>,
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
) {
    let lane = UNIT_POS_X as usize;
    let mut keys = SharedMemory::<Vector<f32, V>>::new(comptime!(CHUNK * key_stride(d_k, vector)));
    let mut mass = SharedMemory::<f32>::new(CHUNK);
    let mut first = 0usize;
    while first < visible {
        let count = min(visible - first, CHUNK);
        stage_keys::<F, V>(compressed_k, &mut keys, b, first, count, hk, d_k, vector);
        sync_cube();
        let p = group_mass::<V>(queries, lse, &keys, 0, lane, g, d_k, vector);
        #[unroll]
        for m in 0..KEYS_PER_LANE {
            let key = lane + m * LANES;
            mass[key] = select(first + key < visible, p[m], 0.0f32);
        }
        sync_cube();
        add_chunk_mass(&mass, scores, 0, lane, first, count, length, stride, block_size, blocks);
        sync_cube();
        first += count;
    }
}
