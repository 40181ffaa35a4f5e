//! Key-major selected attention forward on the manual MMA (CUDA tensor cores, f16/bf16), in two
//! passes: per-block partial results, then one merge per query row.
//!
//! The query-major forward ([`super::mma_select`]) loads a query's `n` blocks for every query:
//! at 64k on the production shape that is about 34 GB of K/V through L2, and with `g = 6` its
//! 16-row tiles hold 6 real rows. Here a cube takes one segment of one selected block's query
//! list (the backward's key cubes, [`super::key::KeyCube`], [`super::inverse`]): it stages the
//! block's K and V once, and its planes walk the listed rows `(t, h)` 16 at a time, every tile
//! full. Each row's softmax over the block stays in registers ([`super::flash_forward`]'s
//! layout): the plane writes the block's normalised output and log-sum-exp to the row's slot
//! for that block (`slots` of the inverted index). No cube ever sees a row's other blocks, so
//! [`merge_selection_partials`] combines the `n` slots of each row afterwards: weights
//! `exp(lse_i - lse)`, where `lse` is the log-sum-exp of the slots' `lse_i`.

use cubecl::prelude::*;

use super::flash_forward::{RowStats, TileBarriers};
use super::forward::MASKED;
use super::fragments::{
    accumulate_with_rows, mma, products_with_rows, row_fragments, scale_rows, store_rows_whole, zero_pairs, Pair,
    MMA_M, MMA_N,
};
use super::key::KeyCube;
use super::mma_forward::VECTOR;
use super::rows::{offset3, stage_vector_rows, NEG_LARGE};
use super::walk::{issue_gradient_rows, issue_query_rows};
use crate::tiling::storage_stride;

/// `q [B, T, H_q, d_k]`, `k`, `v` and a selection's inverted index -> for every listed row and
/// block, `part_out [B, T, H_q, n * d_v]` (the row's attention over that block alone, in the
/// storage type) and `part_lse [B, T, H_q, n]` (f32; `NEG_LARGE` when the block is wholly after
/// the query), at the block's slot. Slots of unused entries are left unwritten. Cube
/// `(32, planes)` units; `keys` is the block size (a multiple of 16), `d_k`, `d_v` multiples of
/// 16.
#[cube(launch, launch_unchecked, fast_math = FastMath::all())]
#[allow(clippy::too_many_arguments)]
pub fn selection_partials_flash<F: Float, N: Size, P: Size>(
    q: &Tensor<Vector<F, N>>,
    k: &Tensor<Vector<F, N>>,
    v: &Tensor<Vector<F, N>>,
    offsets: &Tensor<u32>,
    counts: &Tensor<u32>,
    entries: &Tensor<u32>,
    slots: &Tensor<u32>,
    segment_base: &Tensor<u32>,
    segment_block: &Tensor<u32>,
    segment_total: &Tensor<u32>,
    part_out: &mut Tensor<Vector<F, P>>,
    part_lse: &mut Tensor<f32>,
    scale: f32,
    segment: u32,
    #[comptime] d_k: usize,
    #[comptime] d_v: usize,
    #[comptime] keys: usize,
    #[comptime] planes: usize,
    #[comptime] narrow: bool,
    #[comptime] g: usize,
    #[define(F)] _dtype: StorageType,
) {
    let cube = KeyCube::new::<Vector<F, N>>(
        q,
        k,
        offsets,
        counts,
        entries,
        segment_base,
        segment_block,
        segment_total,
        keys,
        segment as usize,
        false,
        keys,
        g,
    );
    if !cube.exists {
        terminate!();
    }
    let def = mma::<F>();
    let lane = UNIT_POS_X as usize;
    let plane = UNIT_POS_Y as usize;
    let ks = comptime!(storage_stride(d_k));
    let vs = comptime!(storage_stride(d_v));
    // The block's K rows, its V rows, then two buffers of `q_rows` listed q rows: the next
    // chunk's copies fly while the planes compute the current one, 16 rows each.
    let q_rows = comptime!(planes * MMA_M);
    let v_at = comptime!(keys * ks);
    let base = comptime!(keys * (ks + vs));
    let chunk = comptime!(q_rows * ks);
    let mut staged = SharedMemory::<Vector<F, N>>::new_aligned(comptime!((base + 2 * chunk) / VECTOR), 16usize);
    let (b, hk, count) = (cube.b, cube.hk, cube.s_end - cube.s0);
    let (unit, units) = (UNIT_POS as usize, CUBE_DIM as usize);
    stage_vector_rows::<F, N>(k, &mut staged, 0usize, b, cube.s0, count, hk, keys, d_k, ks, VECTOR, unit, units);
    stage_vector_rows::<F, N>(v, &mut staged, v_at, b, cube.s0, count, hk, keys, d_v, vs, VECTOR, unit, units);
    let mut positions = SharedMemory::<u32>::new(comptime!(2 * q_rows));
    let mut block_slots = SharedMemory::<u32>::new(comptime!(if narrow { 2 * q_rows } else { 1 }));
    let barriers = TileBarriers::new();

    let mut first = 0usize;
    let mut count = min(cube.n_rows, q_rows);
    let mut slot = 0usize;
    if count > 0 {
        issue_query_rows::<F, N>(
            q,
            entries,
            slots,
            &cube,
            &mut staged,
            &mut positions,
            &mut block_slots,
            &barriers,
            first,
            count,
            slot,
            base,
            narrow,
            q_rows,
            d_k,
            planes,
        );
    }
    while first < cube.n_rows {
        let next_first = first + count;
        let next_count =
            select(next_first < cube.n_rows, min(cube.n_rows - min(next_first, cube.n_rows), q_rows), 0usize);
        let next_slot = 1 - slot;
        if next_first < cube.n_rows {
            issue_query_rows::<F, N>(
                q,
                entries,
                slots,
                &cube,
                &mut staged,
                &mut positions,
                &mut block_slots,
                &barriers,
                next_first,
                next_count,
                next_slot,
                base,
                narrow,
                q_rows,
                d_k,
                planes,
            );
        }
        // Also the block's K and V rows, the first time.
        barriers.wait(slot);
        let tile = plane * MMA_M;
        if tile < count {
            let q_frags = row_fragments::<F, N>(def, &staged, base + slot * chunk, tile, lane, d_k, ks);
            let rows = ListedRows::in_chunk(&positions, &cube, slot * q_rows, first, tile, count, lane);
            let mut scores = products_with_rows::<F, N>(def, &q_frags, &staged, 0usize, lane, d_k, ks, keys);
            mask_block(&mut scores, &rows, cube.s0, cube.s_end, lane, keys);
            let mut stats = RowStats::new();
            // A fresh accumulator: the correction factor has nothing to rescale.
            let _correction = stats.update(&mut scores, scale, keys);
            let mut acc = zero_pairs(comptime!(2 * d_v / MMA_N));
            accumulate_with_rows::<F, N>(def, &scores, &staged, v_at, lane, &mut acc, d_v, vs, keys);
            // Where the block stands in each row's query list: staged with the chunk at narrow
            // heads; read here at wide heads, whose registers are short (see `narrow`).
            let mut block_slot = Array::<usize>::new(2usize);
            #[unroll]
            for half in 0..2usize {
                let local = tile + lane / 4 + 8 * half;
                if comptime!(narrow) {
                    block_slot[half] = block_slots[slot * q_rows + local] as usize;
                } else {
                    let row = first + select(local < count, local, 0usize);
                    block_slot[half] = slots[cube.list_at + row / comptime!(cube.g)] as usize;
                }
            }
            store_partial::<F, P>(part_out, part_lse, &rows, &block_slot, &mut acc, &stats, b, lane, d_v, narrow);
        }
        // The chunk after next overwrites this buffer and its positions.
        sync_cube();
        first = next_first;
        count = next_count;
        slot = next_slot;
    }
}

/// The two walked rows a lane holds (`l / 4` and `l / 4 + 8` of its plane's tile): query
/// position, head, and whether the row exists.
#[derive(CubeType)]
pub struct ListedRows {
    pub t: Array<usize>,
    pub h: Array<usize>,
    pub real: Array<bool>,
}

#[cube]
impl ListedRows {
    /// The lane's rows of the plane's tile at row `tile` of the chunk of walked rows
    /// `first..first + count`, whose positions stand at `positions[at..]`.
    #[allow(clippy::too_many_arguments)]
    pub fn in_chunk(
        positions: &SharedMemory<u32>,
        cube: &KeyCube,
        at: usize,
        first: usize,
        tile: usize,
        count: usize,
        lane: usize,
    ) -> ListedRows {
        let mut t = Array::<usize>::new(2usize);
        let mut h = Array::<usize>::new(2usize);
        let mut real = Array::<bool>::new(2usize);
        #[unroll]
        for half in 0..2usize {
            let local = tile + lane / 4 + 8 * half;
            let is_real = local < count;
            let row = first + select(is_real, local, 0usize);
            t[half] = positions[at + local] as usize;
            h[half] = cube.head_of(row);
            real[half] = is_real;
        }
        ListedRows { t, h, real }
    }
}

/// Masks keys past the block's end (a ragged last block) or after the row's query (causal) to
/// `NEG_LARGE`, leaving the others raw ([`RowStats::update`] or the caller's exponential
/// scales them). The lane holds keys `8j + 2 (l % 4) + e` of the block.
#[cube]
fn mask_block(
    scores: &mut Array<Pair<f32>>,
    rows: &ListedRows,
    s0: usize,
    s_end: usize,
    lane: usize,
    #[comptime] keys: usize,
) {
    let column = 2 * (lane % 4);
    #[unroll]
    for j in 0..keys / MMA_N {
        #[unroll]
        for half in 0..2usize {
            let mut s = scores[2 * j + half];
            #[unroll]
            for e in 0..2usize {
                let key = s0 + j * MMA_N + column + e;
                let valid = key < s_end && key <= rows.t[half];
                s[e] = select(valid, s[e], f32::new(NEG_LARGE));
            }
            scores[2 * j + half] = s;
        }
    }
}

/// Writes the lane's two rows' output over the block, divided by the rows' sums, to their slots
/// of `part_out` (`block_slot[half]`: where the block stands in the row's query list), and (one
/// lane of the quad) the rows' log-sum-exp over the block. With `whole_rows` (`part_out` in
/// 16-byte vectors) the rows go out whole ([`store_rows_whole`]), else 2 elements per lane and
/// tile.
#[cube]
#[allow(clippy::too_many_arguments)]
fn store_partial<F: Float, P: Size>(
    part_out: &mut Tensor<Vector<F, P>>,
    part_lse: &mut Tensor<f32>,
    rows: &ListedRows,
    block_slot: &Array<usize>,
    acc: &mut Array<Pair<f32>>,
    stats: &RowStats,
    b: usize,
    lane: usize,
    #[comptime] d_v: usize,
    #[comptime] whole_rows: bool,
) {
    // `part_out` and `part_lse` are contiguous: a row's slot is row `partial` of `part_lse`
    // (`[B, T, H_q, n]`), and of `part_out` seen as rows of `d_v`.
    let (t_len, h_q, n) = (part_lse.shape(1), part_lse.shape(2), part_lse.shape(3));
    let mut inv = Array::<f32>::new(2usize);
    let mut row_at = Array::<usize>::new(2usize);
    #[unroll]
    for half in 0..2usize {
        let sum = stats.row_sum(half);
        inv[half] = 0.0f32;
        let mut block_lse = f32::new(NEG_LARGE);
        if sum > 0.0f32 {
            inv[half] = 1.0f32 / sum;
            block_lse = stats.max[half] + sum.ln();
        }
        let partial = ((b * t_len + rows.t[half]) * h_q + rows.h[half]) * n + block_slot[half];
        row_at[half] = partial * comptime!(if whole_rows { d_v / VECTOR } else { d_v });
        if rows.real[half] && lane % 4 == 0 {
            part_lse[partial] = block_lse;
        }
    }
    scale_rows(acc, &inv, comptime!(d_v / MMA_N));
    if comptime!(whole_rows) {
        store_rows_whole::<F, P>(part_out, &row_at, &rows.real, acc, lane, d_v);
    } else {
        store_row_pieces::<F, P>(part_out, &row_at, &rows.real, acc, lane, d_v);
    }
}

/// [`store_rows_whole`]'s rows as each lane holds them: 2 elements per tile (`dst` unvectorised,
/// `P` = 1).
#[cube]
fn store_row_pieces<F: Float, P: Size>(
    dst: &mut Tensor<Vector<F, P>>,
    row_at: &Array<usize>,
    write: &Array<bool>,
    tiles: &Array<Pair<f32>>,
    lane: usize,
    #[comptime] d: usize,
) {
    #[unroll]
    for half in 0..2usize {
        if write[half] {
            let row = row_at[half] + 2 * (lane % 4);
            #[unroll]
            for j in 0..d / MMA_N {
                let o = tiles[2 * j + half];
                #[unroll]
                for e in 0..2usize {
                    dst[row + j * MMA_N + e] = Vector::<F, P>::new(F::cast_from(o[e]));
                }
            }
        }
    }
}

/// A selection's dQ, key-major as [`selection_partials_flash`]: a cube stages one block's K
/// and V, and each plane takes the block's listed rows 16 at a time with their q and dO rows:
/// `s = q K^T`, `p = exp(s scale - lse)` (the forward's final log-sum-exp), `dp = dO V^T`,
/// `ds = p (dp - delta)`, and the row's share of dQ over the block, `scale * ds K`, added to the
/// f32 `grad_q` by atomics (each row's other blocks are other cubes'). Everything stays in
/// registers; `delta = dO . O` comes from `row_delta`.
#[cube(launch, launch_unchecked, fast_math = FastMath::all())]
#[allow(clippy::too_many_arguments)]
pub fn selection_dq_flash<F: Float, N: Size, A: Size>(
    q: &Tensor<Vector<F, N>>,
    k: &Tensor<Vector<F, N>>,
    v: &Tensor<Vector<F, N>>,
    grad_out: &Tensor<Vector<F, N>>,
    lse: &Tensor<f32>,
    delta: &Tensor<f32>,
    offsets: &Tensor<u32>,
    counts: &Tensor<u32>,
    entries: &Tensor<u32>,
    segment_base: &Tensor<u32>,
    segment_block: &Tensor<u32>,
    segment_total: &Tensor<u32>,
    grad_q: &mut Tensor<Atomic<Vector<f32, A>>>,
    scale: f32,
    segment: u32,
    #[comptime] d_k: usize,
    #[comptime] d_v: usize,
    #[comptime] keys: usize,
    #[comptime] planes: usize,
    #[comptime] atomic_width: usize,
    #[comptime] g: usize,
    #[define(F)] _dtype: StorageType,
) {
    let cube = KeyCube::new::<Vector<F, N>>(
        q,
        k,
        offsets,
        counts,
        entries,
        segment_base,
        segment_block,
        segment_total,
        keys,
        segment as usize,
        false,
        keys,
        g,
    );
    if !cube.exists {
        terminate!();
    }
    let def = mma::<F>();
    let lane = UNIT_POS_X as usize;
    let plane = UNIT_POS_Y as usize;
    let ks = comptime!(storage_stride(d_k));
    let vs = comptime!(storage_stride(d_v));
    // The block's K rows, its V rows, then two buffers of `q_rows` listed q rows and as many dO
    // rows, as the forward's.
    let q_rows = comptime!(planes * MMA_M);
    let v_at = comptime!(keys * ks);
    let base = comptime!(keys * (ks + vs));
    let chunk = comptime!(q_rows * (ks + vs));
    let do_at = comptime!(q_rows * ks);
    let mut staged = SharedMemory::<Vector<F, N>>::new_aligned(comptime!((base + 2 * chunk) / VECTOR), 16usize);
    let (b, hk, count) = (cube.b, cube.hk, cube.s_end - cube.s0);
    let (unit, units) = (UNIT_POS as usize, CUBE_DIM as usize);
    stage_vector_rows::<F, N>(k, &mut staged, 0usize, b, cube.s0, count, hk, keys, d_k, ks, VECTOR, unit, units);
    stage_vector_rows::<F, N>(v, &mut staged, v_at, b, cube.s0, count, hk, keys, d_v, vs, VECTOR, unit, units);
    let mut positions = SharedMemory::<u32>::new(comptime!(2 * q_rows));
    let mut stats = SharedMemory::<f32>::new(comptime!(4 * q_rows));
    let barriers = TileBarriers::new();

    let mut first = 0usize;
    let mut count = min(cube.n_rows, q_rows);
    let mut slot = 0usize;
    if count > 0 {
        issue_gradient_rows::<F, N>(
            q,
            grad_out,
            lse,
            delta,
            entries,
            &cube,
            &mut staged,
            &mut positions,
            &mut stats,
            &barriers,
            first,
            count,
            slot,
            base,
            false,
            q_rows,
            d_k,
            d_v,
            planes,
        );
    }
    while first < cube.n_rows {
        let next_first = first + count;
        let next_count =
            select(next_first < cube.n_rows, min(cube.n_rows - min(next_first, cube.n_rows), q_rows), 0usize);
        let next_slot = 1 - slot;
        if next_first < cube.n_rows {
            issue_gradient_rows::<F, N>(
                q,
                grad_out,
                lse,
                delta,
                entries,
                &cube,
                &mut staged,
                &mut positions,
                &mut stats,
                &barriers,
                next_first,
                next_count,
                next_slot,
                base,
                false,
                q_rows,
                d_k,
                d_v,
                planes,
            );
        }
        // Also the block's K and V rows, the first time.
        barriers.wait(slot);
        let tile = plane * MMA_M;
        if tile < count {
            let at = base + slot * chunk;
            let rows = ListedRows::in_chunk(&positions, &cube, slot * q_rows, first, tile, count, lane);
            let mut row_lse = Array::<f32>::new(2usize);
            let mut row_delta = Array::<f32>::new(2usize);
            #[unroll]
            for half in 0..2usize {
                let local = slot * comptime!(2 * q_rows) + tile + lane / 4 + 8 * half;
                row_lse[half] = stats[local];
                row_delta[half] = stats[local + q_rows];
            }

            let q_frags = row_fragments::<F, N>(def, &staged, at, tile, lane, d_k, ks);
            let mut p = products_with_rows::<F, N>(def, &q_frags, &staged, 0usize, lane, d_k, ks, keys);
            mask_block(&mut p, &rows, cube.s0, cube.s_end, lane, keys);
            row_probabilities(&mut p, &row_lse, scale, keys);
            let do_frags = row_fragments::<F, N>(def, &staged, at + do_at, tile, lane, d_v, vs);
            let dp = products_with_rows::<F, N>(def, &do_frags, &staged, v_at, lane, d_v, vs, keys);
            row_score_gradients(&mut p, &dp, &row_delta, keys);
            let mut dq = zero_pairs(comptime!(2 * d_k / MMA_N));
            accumulate_with_rows::<F, N>(def, &p, &staged, 0usize, lane, &mut dq, d_k, ks, keys);
            add_rows::<A>(grad_q, &rows, &dq, b, scale, 0usize, lane, d_k, atomic_width);
        }
        // The chunk after next overwrites this buffer and its statistics.
        sync_cube();
        first = next_first;
        count = next_count;
        slot = next_slot;
    }
}

/// Masked raw scores (masked: `NEG_LARGE`) become `exp(s scale - lse)` per row: a masked score
/// gives `exp(-huge) = 0` (a row's `lse` is finite), so it needs no test of its own.
#[cube]
fn row_probabilities(s: &mut Array<Pair<f32>>, row_lse: &Array<f32>, scale: f32, #[comptime] keys: usize) {
    #[unroll]
    for j in 0..keys / MMA_N {
        #[unroll]
        for half in 0..2usize {
            let mut x = s[2 * j + half];
            #[unroll]
            for e in 0..2usize {
                x[e] = fma(x[e], scale, -row_lse[half]).exp();
            }
            s[2 * j + half] = x;
        }
    }
}

/// `p` becomes `ds = p (dp - delta)` in place, `delta` per row.
#[cube]
fn row_score_gradients(
    p: &mut Array<Pair<f32>>,
    dp: &Array<Pair<f32>>,
    row_delta: &Array<f32>,
    #[comptime] keys: usize,
) {
    #[unroll]
    for j in 0..keys / MMA_N {
        #[unroll]
        for half in 0..2usize {
            p[2 * j + half] = p[2 * j + half] * (dp[2 * j + half] - Pair::<f32>::new(row_delta[half]));
        }
    }
}

/// Adds the lane's two rows of `tiles` (over `d` columns), times `factor`, to rows `(b, t, h)`
/// of the f32 `dst` by atomics (real rows only), `width` columns per atomic (4 where the device
/// adds 16-byte vectors atomically, sm90: a quarter of the atomics). Neighbouring lanes first
/// swap halves, so that each holds four consecutive columns of one row: the even lane of a pair
/// row `l / 4`, the odd lane row `l / 4 + 8`.
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn add_rows<A: Size>(
    dst: &mut Tensor<Atomic<Vector<f32, A>>>,
    rows: &ListedRows,
    tiles: &Array<Pair<f32>>,
    b: usize,
    factor: f32,
    first_col: usize,
    lane: usize,
    #[comptime] d: usize,
    #[comptime] width: usize,
) {
    let quad = lane % 4;
    let even = quad % 2 == 0;
    let half = select(even, 0usize, 1usize);
    let base =
        offset3::<Atomic<Vector<f32, A>>>(dst, b, rows.t[half], rows.h[half]) + first_col + 2 * (quad - quad % 2);
    #[unroll]
    for j in 0..d / MMA_N {
        let low = tiles[2 * j];
        let high = tiles[2 * j + 1];
        // The even lane gives away its second row, the odd lane its first.
        let mut given = Array::<f32>::new(2usize);
        #[unroll]
        for e in 0..2usize {
            given[e] = plane_shuffle_xor(select(even, high[e], low[e]), 1u32);
        }
        let mut four = Array::<f32>::new(4usize);
        #[unroll]
        for e in 0..2usize {
            four[e] = select(even, low[e], given[e]);
            four[2 + e] = select(even, given[e], high[e]);
        }
        if rows.real[half] {
            #[unroll]
            for part in 0..comptime!(4 / width) {
                let mut value = Vector::<f32, A>::new(0.0f32);
                #[unroll]
                for e in 0..width {
                    value[e] = four[part * width + e] * factor;
                }
                let at = (base + j * MMA_N + part * width) / width;
                dst[at].fetch_add(value);
            }
        }
    }
}

/// `part_out [B, T, H_q, n * d_v]`, `part_lse [B, T, H_q, n]` and `blocks [B, T, H_kv, n]` ->
/// `out [B, T, H_q, d_v]`, `lse [B, T, H_q]`: each row's slots combined with weights
/// `exp(lse_i - lse)`. Slots whose block is unused (negative) or wholly after the query
/// (`lse_i` masked) weigh nothing; a row with none gets zeros and `NEG_LARGE`. One unit per
/// vector of `vector` output elements; all tensors but `blocks` contiguous.
#[cube(launch)]
pub fn merge_selection_partials<F: Float, I: Int, N: Size>(
    part_out: &Tensor<Vector<F, N>>,
    part_lse: &Tensor<f32>,
    blocks: &Tensor<I>,
    out: &mut Tensor<Vector<F, N>>,
    lse: &mut Tensor<f32>,
    #[comptime] d_v: usize,
    #[comptime] vector: usize,
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    let per_row = comptime!(d_v / vector);
    let (t_len, h_q, n) = (part_lse.shape(1), part_lse.shape(2), part_lse.shape(3));
    let rows = part_lse.shape(0) * t_len * h_q;
    let pos = ABSOLUTE_POS;
    if pos >= rows * per_row {
        terminate!();
    }
    let (row, c) = (pos / per_row, pos % per_row);
    let h = row % h_q;
    let t = (row / h_q) % t_len;
    let b = row / (h_q * t_len);
    let hk = h / (h_q / blocks.shape(2));
    let listed = b * blocks.stride(0) + t * blocks.stride(1) + hk * blocks.stride(2);

    // One pass, online (flash attention's rescaling): each used slot's weight against the
    // running maximum, the sum and the output rescaled when the maximum grows.
    let mut row_max = f32::new(NEG_LARGE);
    let mut sum = 0.0f32;
    let mut acc = Vector::<f32, N>::new(0.0f32);
    for i in 0..n {
        let block_lse = part_lse[row * n + i];
        if i32::cast_from(blocks[listed + i * blocks.stride(3)]) >= 0 && block_lse > MASKED {
            let new_max = max(row_max, block_lse);
            let rescale = (row_max - new_max).exp();
            let weight = (block_lse - new_max).exp();
            let part = Vector::<f32, N>::cast_from(part_out[(row * n + i) * per_row + c]);
            acc = acc * Vector::<f32, N>::new(rescale) + part * Vector::<f32, N>::new(weight);
            sum = sum * rescale + weight;
            row_max = new_max;
        }
    }
    let mut row_lse = f32::new(NEG_LARGE);
    if sum > 0.0f32 {
        row_lse = row_max + sum.ln();
        acc = acc * Vector::<f32, N>::new(1.0f32 / sum);
    }
    out[row * per_row + c] = Vector::<F, N>::cast_from(acc);
    if c == 0 {
        lse[row] = row_lse;
    }
}
