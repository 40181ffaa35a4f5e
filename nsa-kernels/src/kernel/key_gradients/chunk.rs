//! One walked chunk of the key kernel: its share of dK and dV and, folded, of dQ.

use cubecl::cmma::MmaDefinition;
use cubecl::prelude::*;

use crate::kernel::primitives::atomic_rows::add_rows;
use crate::kernel::primitives::fragments::{
    accumulate_step, accumulate_with_rows, products_with_rows, store_pair_tiles, transposed_fragment, zero_pairs, Pair,
    MMA_K, MMA_M, MMA_N,
};
use crate::kernel::primitives::key_cube::{KeyCube, ListedRows};
use crate::kernel::primitives::rows::{attends, RowStarts};
use crate::tile_sizes::storage_stride;

/// One staged chunk's share of dK, dV (and, with `fold_dq`, its `ds^T` tiles in `ds_tile`), 16
/// walked rows at a time: `s^T`, `p^T`, `dV += p^T dO`, `dp^T`, `ds^T`, `dK += ds^T q`.
///
/// A lane holds one group's `p^T` and `dp^T` (8 registers each). Where dQ is folded (narrow
/// heads), the groups are unrolled so that the compiler can overlap one group's products with
/// the previous group's exponentials (the mask is decided per chunk, so a group's body has no
/// branch). Wide heads keep the loop: their dK and dV accumulators leave no registers for it.
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn chunk_gradients<F: Float, I: Int, N: Size>(
    def: MmaDefinition<F, F, f32>,
    k_frags: &Array<Pair<F>>,
    v_frags: &Array<Pair<F>>,
    staged: &SharedMemory<Vector<F, N>>,
    ds_tile: &mut SharedMemory<Pair<F>>,
    positions: &SharedMemory<u32>,
    stats: &SharedMemory<f32>,
    row_starts: &RowStarts<I>,
    dk: &mut Array<Pair<f32>>,
    dv: &mut Array<Pair<f32>>,
    at: usize,
    slot: usize,
    key: &Array<usize>,
    real: &Array<bool>,
    count: usize,
    span: usize,
    scale: f32,
    plane: usize,
    lane: usize,
    #[comptime] masked: bool,
    #[comptime] window: bool,
    #[comptime] fold_dq: bool,
    #[comptime] q_rows: usize,
    #[comptime] d_k: usize,
    #[comptime] d_v: usize,
) {
    let ks = comptime!(storage_stride(d_k));
    let vs = comptime!(storage_stride(d_v));
    let ds_stride = comptime!(storage_stride(q_rows) / 2);
    let do_at = at + comptime!(q_rows * ks);
    #[unroll(fold_dq)]
    for group in 0..comptime!(q_rows / MMA_K) {
        let first = group * MMA_K;
        let mut p = products_with_rows::<F, N>(def, k_frags, staged, at + first * ks, lane, d_k, ks, MMA_K);
        key_probabilities::<I>(
            &mut p, positions, stats, row_starts, slot, first, key, real, count, span, scale, lane, masked, window,
            q_rows,
        );
        let do_rows = do_at + first * vs;
        accumulate_with_rows::<F, N>(def, &p, staged, do_rows, lane, dv, d_v, vs, MMA_K);
        let dp = products_with_rows::<F, N>(def, v_frags, staged, do_rows, lane, d_v, vs, MMA_K);
        key_score_gradients(&mut p, &dp, stats, slot, first, lane, q_rows);
        if fold_dq {
            store_pair_tiles::<F>(ds_tile, &p, plane * MMA_M, first, lane, MMA_K, ds_stride);
        }
        accumulate_with_rows::<F, N>(def, &p, staged, at + first * ks, lane, dk, d_k, ks, MMA_K);
    }
}

/// Scores `s^T` (keys as rows, the chunk's walked rows `first..first + 16` as columns) become
/// `p^T = exp(s^T scale - lse)` in place; with `masked`, 0 where the column is past `count`,
/// its query does not attend the key (causal; in the window for a window; not before its
/// document's start, `row_starts`), or the key is past the cube's end. Chunks in the middle of
/// the walk attend every key of the cube and skip the mask (keys past a ragged end then hold
/// garbage rows of dK, dV, which are never written; their staged K rows are zero, so a folded
/// dQ gets nothing from them).
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn key_probabilities<I: Int>(
    s: &mut Array<Pair<f32>>,
    positions: &SharedMemory<u32>,
    stats: &SharedMemory<f32>,
    row_starts: &RowStarts<I>,
    slot: usize,
    first: usize,
    key: &Array<usize>,
    real: &Array<bool>,
    count: usize,
    span: usize,
    scale: f32,
    lane: usize,
    #[comptime] masked: bool,
    #[comptime] window: bool,
    #[comptime] q_rows: usize,
) {
    let column = first + 2 * (lane % 4);
    #[unroll]
    for j in 0..MMA_K / MMA_N {
        #[unroll]
        for e in 0..2usize {
            let col = j * MMA_N + column + e;
            let row_lse = stats[slot * comptime!(2 * q_rows) + col];
            if masked {
                let t = positions[slot * q_rows + col] as usize;
                let first_key = row_starts.of(t);
                #[unroll]
                for half in 0..2usize {
                    let mut x = s[2 * j + half];
                    let valid =
                        col < count && real[half] && attends(t, key[half], span, window) && key[half] >= first_key;
                    x[e] = select(valid, (x[e] * scale - row_lse).exp(), 0.0f32);
                    s[2 * j + half] = x;
                }
            } else {
                #[unroll]
                for half in 0..2usize {
                    let mut x = s[2 * j + half];
                    x[e] = (x[e] * scale - row_lse).exp();
                    s[2 * j + half] = x;
                }
            }
        }
    }
}

/// `p^T` in `p` (the chunk's columns `first..first + 16`) becomes `ds^T = p^T (dp^T - delta)`
/// in place, `delta` per column.
#[cube]
pub fn key_score_gradients(
    p: &mut Array<Pair<f32>>,
    dp: &Array<Pair<f32>>,
    stats: &SharedMemory<f32>,
    slot: usize,
    first: usize,
    lane: usize,
    #[comptime] q_rows: usize,
) {
    let column = first + 2 * (lane % 4);
    #[unroll]
    for j in 0..MMA_K / MMA_N {
        #[unroll]
        for e in 0..2usize {
            let row_delta = stats[slot * comptime!(2 * q_rows) + q_rows + j * MMA_N + column + e];
            #[unroll]
            for half in 0..2usize {
                let mut x = p[2 * j + half];
                x[e] = x[e] * (dp[2 * j + half][e] - row_delta);
                p[2 * j + half] = x;
            }
        }
    }
}

/// dQ folded into the key cube (flash attention 2's backward): the chunk's `q_rows / 16` row
/// tiles times `planes / (q_rows / 16)` column parts of `d_k`, one per plane. A plane computes
/// its part's share over the cube's keys, `scale * ds K` (`ds` read transposed from `ds_tile`,
/// K rows staged at element 0), and adds it to the f32 `grad_q` by atomics: each row's other
/// keys (a selection's other blocks, a window's other tiles) are other cubes'. This saves the
/// separate dQ pass's recomputed `s` and `dp`.
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn fold_query_gradient<F: Float, N: Size, A: Size>(
    def: MmaDefinition<F, F, f32>,
    ds_tile: &SharedMemory<Pair<F>>,
    staged: &SharedMemory<Vector<F, N>>,
    positions: &SharedMemory<u32>,
    grad_q: &mut Tensor<Atomic<Vector<f32, A>>>,
    cube: &KeyCube,
    slot: usize,
    first: usize,
    count: usize,
    scale: f32,
    plane: usize,
    lane: usize,
    #[comptime] d_k: usize,
    #[comptime] keys: usize,
    #[comptime] q_rows: usize,
    #[comptime] atomic_width: usize,
) {
    let ks = comptime!(storage_stride(d_k));
    let ds_stride = comptime!(storage_stride(q_rows) / 2);
    let row_tiles = comptime!(q_rows / MMA_M);
    let part = comptime!(d_k * row_tiles * MMA_M / keys);
    let tile = (plane % row_tiles) * MMA_M;
    let first_col = (plane / row_tiles) * part;
    if tile < count {
        let mut dq = zero_pairs(comptime!(2 * part / MMA_N));
        #[unroll]
        for kk in 0..keys / MMA_K {
            let a = transposed_fragment::<F>(def, ds_tile, tile, kk, lane, ds_stride);
            accumulate_step::<F, N>(def, &a, kk, staged, first_col, lane, &mut dq, part, ks);
        }
        let rows = ListedRows::in_chunk(positions, cube, slot * q_rows, first, tile, count, lane);
        add_rows::<A>(grad_q, &rows, &dq, cube.b, scale, first_col, lane, part, atomic_width);
    }
}
