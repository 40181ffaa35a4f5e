//! Window forward with scores, probabilities and the output in registers (flash attention 2's
//! layout), built on [`crate::kernel::primitives::fragments`]' manual-MMA products (CUDA tensor cores, f16/bf16).
//!
//! A cube has `planes` planes of 32 lanes; plane `p` owns rows `16p..16p + 16` of the cube (row
//! `r` is query `t0 + r / g`, head `hk * g + r % g`, as [`QueryCube`] lays them out; padding
//! rows past `rows` are zero queries that write nothing). Lane `l` holds rows `l / 4` and
//! `l / 4 + 8` of its plane's tile, so a row's softmax statistics need only the 4 lanes of a
//! quad (two shuffles), and the probabilities are the `p . v` product's A operand as they
//! stand: scores never leave registers.

use cubecl::cmma::MmaDefinition;
use cubecl::prelude::*;

use crate::kernel::primitives::chunk_copies::KeyTiles;
use crate::kernel::primitives::fragments::{
    accumulate_with_rows, mma, products_with_rows, row_fragments, scale_rows, store_rows_whole, store_tiles,
    zero_pairs, Pair, MMA_M, MMA_N,
};
use crate::kernel::primitives::layout::{max_usize, VECTOR};
use crate::kernel::primitives::query_cube::{walk_start, LaneRows, QueryCube};
use crate::kernel::primitives::rows::{offset3, NEG_LARGE};
use crate::kernel::primitives::softmax::{mask_scores, tile_needs_mask, RowStats};
use crate::kernel::primitives::staging::stage_query_rows;
use crate::kernel::primitives::walk::{walk_pipelined, ChunkCompute};
use crate::tile_sizes::storage_stride;

/// `q [B, T, H_q, d_k]`, `k [B, T, H_kv, d_k]`, `v [B, T, H_kv, d_v]` -> `out [B, T, H_q, d_v]`,
/// `lse [B, T, H_q]` (f32) for a causal window of `span` keys, as
/// [`crate::kernel::portable::forward::attention_forward`]; with `documents`, each query's keys
/// start no earlier than its document (`starts [B, T]`, never read without). Cube `(32, planes)`
/// units; `rows <= 16 * planes` real rows; `d_k`, `d_v` and `key_tile` multiples of 16.
#[cube(launch, launch_unchecked, fast_math = FastMath::all())]
pub fn window_forward_flash<F: Float, I: Int, N: Size>(
    q: &Tensor<Vector<F, N>>,
    k: &Tensor<Vector<F, N>>,
    v: &Tensor<Vector<F, N>>,
    starts: &Tensor<I>,
    out: &mut Tensor<Vector<F, N>>,
    lse: &mut Tensor<f32>,
    scale: f32,
    span: u32,
    #[comptime] d_k: usize,
    #[comptime] d_v: usize,
    #[comptime] rows: usize,
    #[comptime] planes: usize,
    #[comptime] key_tile: usize,
    #[comptime] documents: bool,
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    let cube = QueryCube::new::<Vector<F, N>>(q, k, rows, 1usize);
    if !cube.exists {
        terminate!();
    }
    let def = mma::<F>();
    let span = span as usize;
    let lane = UNIT_POS_X as usize;
    let plane = UNIT_POS_Y as usize;
    let g = q.shape(2) / k.shape(2);
    let lanes = LaneRows::new::<I>(&cube, plane, lane, g, rows, q.shape(1), starts, documents);
    let (walk_first, last_start) = walk_start::<I>(&cube, span, starts, documents);

    // The query rows while their fragments load, then two buffers of K and V tiles: the next
    // tile's copies fly while the current one is computed.
    let ks = comptime!(storage_stride(d_k));
    let vs = comptime!(storage_stride(d_v));
    let buffer = comptime!(key_tile * (ks + vs));
    let mut staged = SharedMemory::<Vector<F, N>>::new_aligned(
        comptime!(max_usize(planes * MMA_M * ks, 2 * buffer) / VECTOR),
        16usize,
    );
    stage_query_rows::<F, N>(q, &mut staged, cube.b, cube.t0, cube.hk, g, rows, planes, d_k, ks);
    sync_cube();
    let q_frags = row_fragments::<F, N>(def, &staged, 0usize, plane * MMA_M, lane, d_k, ks);
    sync_cube();

    let mut tiles = KeyTiles::<F, N>::new(k, v, &staged, &cube, d_k, d_v, key_tile, planes);
    let mut softmax = OnlineSoftmax::<F, N> {
        staged,
        def,
        q_frags,
        lanes,
        // Output tiles `[16, 8]`: element `2j + half` is tile j's register for row `half`.
        acc: zero_pairs(comptime!(2 * d_v / MMA_N)),
        stats: RowStats::new(),
        t0: cube.t0,
        t_end: cube.t_end,
        last_start,
        scale,
        span,
        lane,
        d_k,
        d_v,
        key_tile,
    };
    walk_pipelined::<KeyTiles<F, N>, OnlineSoftmax<F, N>>(&mut tiles, &mut softmax, walk_first, cube.t_end, key_tile);
    store_rows::<F, N>(out, lse, &softmax.lanes, &mut softmax.acc, &softmax.stats, cube.b, lane, d_v);
}

/// The forward's compute per key tile: the plane's scores against the tile, one step of the
/// online softmax, and the probabilities times the tile's V rows added to the output.
#[derive(CubeType)]
struct OnlineSoftmax<F: Float, N: Size> {
    staged: SharedMemory<Vector<F, N>>,
    def: MmaDefinition<F, F, f32>,
    q_frags: Array<Pair<F>>,
    lanes: LaneRows,
    acc: Array<Pair<f32>>,
    stats: RowStats,
    t0: usize,
    t_end: usize,
    /// The document start of the cube's last query (0 without documents).
    last_start: usize,
    scale: f32,
    span: usize,
    lane: usize,
    #[cube(comptime)]
    d_k: usize,
    #[cube(comptime)]
    d_v: usize,
    #[cube(comptime)]
    key_tile: usize,
}

#[cube]
impl<F: Float, N: Size> ChunkCompute for OnlineSoftmax<F, N> {
    fn compute(this: &mut Self, first: usize, count: usize, slot: usize) {
        let (d_k, d_v, key_tile) = comptime!((this.d_k, this.d_v, this.key_tile));
        let ks = comptime!(storage_stride(d_k));
        let vs = comptime!(storage_stride(d_v));
        let at = slot * comptime!(key_tile * (ks + vs));
        let (def, lane, span) = (this.def, this.lane, this.span);
        let mut scores = products_with_rows::<F, N>(def, &this.q_frags, &this.staged, at, lane, d_k, ks, key_tile);
        let needs_mask = tile_needs_mask(first, count, this.t0, this.t_end, span, this.last_start, key_tile);
        if needs_mask {
            mask_scores(&mut scores, &this.lanes, first, count, span, lane, key_tile);
        }
        let correction = this.stats.update(&mut scores, this.scale, key_tile);
        scale_rows(&mut this.acc, &correction, comptime!(d_v / MMA_N));
        let v_at = at + comptime!(key_tile * ks);
        accumulate_with_rows::<F, N>(def, &scores, &this.staged, v_at, lane, &mut this.acc, d_v, vs, key_tile);
    }
}

/// Writes the lane's two rows of the output, divided by the rows' sums, as whole 16-byte
/// vectors ([`store_rows_whole`]), and (one lane of the quad) the rows' log-sum-exp: written 2
/// elements per store, a cube would end in a queue of small stores.
#[cube]
#[allow(clippy::too_many_arguments)]
fn store_rows<F: Float, N: Size>(
    out: &mut Tensor<Vector<F, N>>,
    lse: &mut Tensor<f32>,
    lanes: &LaneRows,
    acc: &mut Array<Pair<f32>>,
    stats: &RowStats,
    b: usize,
    lane: usize,
    #[comptime] d_v: usize,
) {
    let mut inv = Array::<f32>::new(2usize);
    #[unroll]
    for half in 0..2usize {
        let sum = stats.row_sum(half);
        inv[half] = 0.0f32;
        let mut row_lse = f32::new(NEG_LARGE);
        if sum > 0.0f32 {
            inv[half] = 1.0f32 / sum;
            row_lse = stats.max[half] + sum.ln();
        }
        if lanes.active[half] && lane % 4 == 0 {
            let at = offset3::<f32>(lse, b, lanes.t[half], lanes.h[half]);
            lse[at] = row_lse;
        }
    }
    scale_rows(acc, &inv, comptime!(d_v / MMA_N));
    let mut row_at = Array::<usize>::new(2usize);
    #[unroll]
    for half in 0..2usize {
        row_at[half] = offset3::<Vector<F, N>>(out, b, lanes.t[half], lanes.h[half]) / VECTOR;
    }
    store_rows_whole::<F, N>(out, &row_at, &lanes.active, acc, lane, d_v);
}

/// Writes the lane's two rows of result tiles over `d` columns, times `factor[half]`, to rows
/// `(b, t, h)` of `dst` (active rows only).
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn store_row_tiles<F: Float>(
    dst: &mut Tensor<F>,
    lanes: &LaneRows,
    tiles: &Array<Pair<f32>>,
    factor: &Array<f32>,
    b: usize,
    lane: usize,
    #[comptime] d: usize,
) {
    let mut base = Array::<usize>::new(2usize);
    #[unroll]
    for half in 0..2usize {
        base[half] = offset3::<F>(dst, b, lanes.t[half], lanes.h[half]);
    }
    store_tiles::<F>(dst, &base, &lanes.active, tiles, factor, lane, d);
}
