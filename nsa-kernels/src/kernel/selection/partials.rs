//! Key-major selected attention forward on the manual MMA (CUDA tensor cores, f16/bf16), in two
//! passes: per-block partial results, then one merge per query row.
//!
//! A query-major forward would load a query's `n` blocks for that query alone, with `g` real rows
//! in each 16-row tile. Here a cube takes one segment of one selected block's query list (the
//! backward's key cubes, [`KeyCube`], [`super::index`]): it stages the block's K and V once, and
//! its planes walk the listed rows `(t, h)` 16 at a time, every tile full. Each row's softmax over
//! the block stays in registers ([`crate::kernel::window::forward`]'s layout): the plane writes the
//! block's normalised output and log-sum-exp to the row's slot for that block (`slots` of the
//! inverted index). No cube ever sees a row's other blocks, so
//! [`super::merge::merge_selection_partials`] combines the `n` slots of each row afterwards:
//! weights
//! `exp(lse_i - lse)`, where `lse` is the log-sum-exp of the slots' `lse_i`.

use cubecl::cmma::MmaDefinition;
use cubecl::prelude::*;

use crate::kernel::primitives::chunk_copies::ListedQueryRows;
use crate::kernel::primitives::fragments::{
    accumulate_with_rows, mma, products_with_rows, row_fragments, scale_rows, store_rows_whole, zero_pairs, Pair,
    MMA_M, MMA_N,
};
use crate::kernel::primitives::key_cube::{BlockLists, KeyCube, ListedRows};
use crate::kernel::primitives::layout::VECTOR;
use crate::kernel::primitives::rows::NEG_LARGE;
use crate::kernel::primitives::softmax::RowStats;
use crate::kernel::primitives::staging::stage_vector_rows;
use crate::kernel::primitives::walk::{walk_pipelined, ChunkCompute};
use crate::tile_sizes::storage_stride;

/// `q [B, T, H_q, d_k]`, `k`, `v` and a selection's inverted index -> for every listed row and
/// block, `part_out [B, T, H_q, n * d_v]` (the row's attention over that block alone, in the
/// storage type) and `part_lse [B, T, H_q, n]` (f32; `NEG_LARGE` when the block is wholly after
/// the query), at the block's slot. Slots of unused entries are left unwritten. Cube
/// `(32, planes)` units; `keys` is the block size (a multiple of 16), `d_k`, `d_v` multiples of
/// 16.
#[cube(launch, launch_unchecked, fast_math = FastMath::all())]
// `clone()` of a handle: see `chunk_copies`.
#[allow(clippy::too_many_arguments, clippy::clone_on_copy)]
pub fn selection_partials_flash<F: Float, N: Size, P: Size>(
    q: &Tensor<Vector<F, N>>,
    k: &Tensor<Vector<F, N>>,
    v: &Tensor<Vector<F, N>>,
    lists: &BlockLists,
    slots: &Tensor<u32>,
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
    let cube = KeyCube::new::<Vector<F, N>>(q, k, lists, keys, segment as usize, false, keys, g);
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
    let n_rows = cube.n_rows;
    let positions = SharedMemory::<u32>::new(comptime!(2 * q_rows));
    let block_slots = SharedMemory::<u32>::new(comptime!(if narrow { 2 * q_rows } else { 1 }));
    let mut rows = ListedQueryRows::<F, N>::new(
        q,
        &lists.entries,
        slots,
        &cube,
        &staged,
        &positions,
        &block_slots,
        base,
        narrow,
        q_rows,
        d_k,
        planes,
    );
    let mut partials = BlockPartials::<F, N, P> {
        staged,
        positions,
        block_slots,
        slots: slots.clone(),
        part_out: part_out.clone(),
        part_lse: part_lse.clone(),
        cube,
        def,
        scale,
        plane,
        lane,
        d_k,
        d_v,
        keys,
        planes,
        narrow,
    };
    // The first wait also covers the block's K and V rows.
    walk_pipelined::<ListedQueryRows<F, N>, BlockPartials<F, N, P>>(&mut rows, &mut partials, 0usize, n_rows, q_rows);
}

/// The forward's compute per chunk of listed rows: each plane's 16 rows' attention over the
/// block alone, written to the rows' slots for the block.
#[derive(CubeType)]
struct BlockPartials<F: Float, N: Size, P: Size> {
    staged: SharedMemory<Vector<F, N>>,
    positions: SharedMemory<u32>,
    block_slots: SharedMemory<u32>,
    slots: Tensor<u32>,
    part_out: Tensor<Vector<F, P>>,
    part_lse: Tensor<f32>,
    cube: KeyCube,
    def: MmaDefinition<F, F, f32>,
    scale: f32,
    plane: usize,
    lane: usize,
    #[cube(comptime)]
    d_k: usize,
    #[cube(comptime)]
    d_v: usize,
    #[cube(comptime)]
    keys: usize,
    #[cube(comptime)]
    planes: usize,
    #[cube(comptime)]
    narrow: bool,
}

#[cube]
impl<F: Float, N: Size, P: Size> ChunkCompute for BlockPartials<F, N, P> {
    fn compute(this: &mut Self, first: usize, count: usize, slot: usize) {
        let (d_k, d_v, keys, planes, narrow) = comptime!((this.d_k, this.d_v, this.keys, this.planes, this.narrow));
        let ks = comptime!(storage_stride(d_k));
        let vs = comptime!(storage_stride(d_v));
        let q_rows = comptime!(planes * MMA_M);
        let (def, lane) = (this.def, this.lane);
        let tile = this.plane * MMA_M;
        if tile < count {
            let at = comptime!(keys * (ks + vs)) + slot * comptime!(q_rows * ks);
            let q_frags = row_fragments::<F, N>(def, &this.staged, at, tile, lane, d_k, ks);
            let rows = ListedRows::in_chunk(&this.positions, &this.cube, slot * q_rows, first, tile, count, lane);
            let mut scores = products_with_rows::<F, N>(def, &q_frags, &this.staged, 0usize, lane, d_k, ks, keys);
            mask_block(&mut scores, &rows, this.cube.s0, this.cube.s_end, lane, keys);
            let mut stats = RowStats::new();
            // A fresh accumulator: the correction factor has nothing to rescale.
            let _correction = stats.update(&mut scores, this.scale, keys);
            let mut acc = zero_pairs(comptime!(2 * d_v / MMA_N));
            let v_at = comptime!(keys * ks);
            accumulate_with_rows::<F, N>(def, &scores, &this.staged, v_at, lane, &mut acc, d_v, vs, keys);
            // Where the block stands in each row's query list: staged with the chunk at narrow
            // heads; read here at wide heads, whose registers are short (see `narrow`).
            let mut block_slot = Array::<usize>::new(2usize);
            #[unroll]
            for half in 0..2usize {
                let local = tile + lane / 4 + 8 * half;
                if comptime!(narrow) {
                    block_slot[half] = this.block_slots[slot * q_rows + local] as usize;
                } else {
                    let row = first + select(local < count, local, 0usize);
                    block_slot[half] = this.slots[this.cube.list_at + row / comptime!(this.cube.g)] as usize;
                }
            }
            store_partial::<F, P>(
                &mut this.part_out,
                &mut this.part_lse,
                &rows,
                &block_slot,
                &mut acc,
                &stats,
                this.cube.b,
                lane,
                d_v,
                narrow,
            );
        }
    }
}

/// Masks keys past the block's end (a ragged last block) or after the row's query (causal) to
/// `NEG_LARGE`, leaving the others raw ([`RowStats::update`] or the caller's exponential
/// scales them). The lane holds keys `8j + 2 (l % 4) + e` of the block.
#[cube]
pub fn mask_block(
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
