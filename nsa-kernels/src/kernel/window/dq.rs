//! dQ of a window with everything per row in registers: the cubes and lanes of
//! [`super::forward`], computing what the portable `attention_backward_query` does.
//!
//! A plane's q and dO rows are A fragments for the whole walk and its dQ is result tiles (a
//! backward has no rescaling). Per staged key tile: `s = q K^T` and `dp = dO V^T` as result
//! tiles, `ds = p (dp - delta)` with `p = exp(s scale - lse)` in place, then `dQ += ds K`, `ds`
//! rounded to the storage type as the product's A operand. `delta = dO . O` comes from
//! [`crate::kernel::row_delta::row_delta`], launched before.

use cubecl::cmma::MmaDefinition;
use cubecl::prelude::*;

use super::forward::store_row_tiles;
use crate::kernel::primitives::chunk_copies::KeyTiles;
use crate::kernel::primitives::fragments::{
    accumulate_with_rows, mma, products_with_rows, row_fragments, zero_pairs, Pair, MMA_M, MMA_N,
};
use crate::kernel::primitives::layout::{max_usize, MASKED, VECTOR};
use crate::kernel::primitives::query_cube::{walk_start, LaneRows, QueryCube};
use crate::kernel::primitives::rows::offset3;
use crate::kernel::primitives::softmax::{mask_and_scale, tile_needs_mask};
use crate::kernel::primitives::staging::stage_query_rows;
use crate::kernel::primitives::walk::{walk_pipelined, ChunkCompute};
use crate::tile_sizes::storage_stride;

/// `q`, `k`, `v`, `dO` as the forward's inputs and output, `lse` and `delta` `[B, T, H_q]`
/// (f32) -> `grad_q`, with the forward's document `starts` (`documents`). Cube `(32, planes)`
/// units, `rows <= 16 * planes` real rows.
#[cube(launch, launch_unchecked, fast_math = FastMath::all())]
#[allow(clippy::too_many_arguments)]
pub fn window_dq_flash<F: Float, I: Int, N: Size>(
    q: &Tensor<Vector<F, N>>,
    k: &Tensor<Vector<F, N>>,
    v: &Tensor<Vector<F, N>>,
    starts: &Tensor<I>,
    grad_out: &Tensor<Vector<F, N>>,
    lse: &Tensor<f32>,
    delta: &Tensor<f32>,
    grad_q: &mut Tensor<F>,
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
    let mut row_lse = Array::<f32>::new(2usize);
    let mut row_delta = Array::<f32>::new(2usize);
    #[unroll]
    for half in 0..2usize {
        let at = offset3::<f32>(lse, cube.b, lanes.t[half], lanes.h[half]);
        row_lse[half] = lse[at];
        row_delta[half] = delta[at];
    }

    // q rows, then dO rows, while their fragments load; then two buffers of K and V tiles
    // ([`KeyTiles`]).
    let ks = comptime!(storage_stride(d_k));
    let vs = comptime!(storage_stride(d_v));
    let buffer = comptime!(key_tile * (ks + vs));
    let mut staged = SharedMemory::<Vector<F, N>>::new_aligned(
        comptime!(max_usize(planes * MMA_M * max_usize(ks, vs), 2 * buffer) / VECTOR),
        16usize,
    );
    stage_query_rows::<F, N>(q, &mut staged, cube.b, cube.t0, cube.hk, g, rows, planes, d_k, ks);
    sync_cube();
    let q_frags = row_fragments::<F, N>(def, &staged, 0usize, plane * MMA_M, lane, d_k, ks);
    sync_cube();
    stage_query_rows::<F, N>(grad_out, &mut staged, cube.b, cube.t0, cube.hk, g, rows, planes, d_v, vs);
    sync_cube();
    let do_frags = row_fragments::<F, N>(def, &staged, 0usize, plane * MMA_M, lane, d_v, vs);
    sync_cube();

    let mut tiles = KeyTiles::<F, N>::new(k, v, &staged, &cube, d_k, d_v, key_tile, planes);
    let mut gradients = QueryGradients::<F, N> {
        staged,
        def,
        q_frags,
        do_frags,
        lanes,
        row_lse,
        row_delta,
        dq: zero_pairs(comptime!(2 * d_k / MMA_N)),
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
    walk_pipelined::<KeyTiles<F, N>, QueryGradients<F, N>>(
        &mut tiles,
        &mut gradients,
        walk_first,
        cube.t_end,
        key_tile,
    );

    let mut factor = Array::<f32>::new(2usize);
    factor[0] = scale;
    factor[1] = scale;
    store_row_tiles::<F>(grad_q, &gradients.lanes, &gradients.dq, &factor, cube.b, lane, d_k);
}

/// dQ's compute per key tile: the plane's scores and `dO V^T` against the tile, their score
/// gradients, and `ds K` added to dQ.
#[derive(CubeType)]
struct QueryGradients<F: Float, N: Size> {
    staged: SharedMemory<Vector<F, N>>,
    def: MmaDefinition<F, F, f32>,
    q_frags: Array<Pair<F>>,
    do_frags: Array<Pair<F>>,
    lanes: LaneRows,
    row_lse: Array<f32>,
    row_delta: Array<f32>,
    dq: Array<Pair<f32>>,
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
impl<F: Float, N: Size> ChunkCompute for QueryGradients<F, N> {
    fn compute(this: &mut Self, first: usize, count: usize, slot: usize) {
        let (d_k, d_v, key_tile) = comptime!((this.d_k, this.d_v, this.key_tile));
        let ks = comptime!(storage_stride(d_k));
        let vs = comptime!(storage_stride(d_v));
        let at = slot * comptime!(key_tile * (ks + vs));
        let (def, lane, span) = (this.def, this.lane, this.span);
        let mut ds = products_with_rows::<F, N>(def, &this.q_frags, &this.staged, at, lane, d_k, ks, key_tile);
        let v_at = at + comptime!(key_tile * ks);
        let dp = products_with_rows::<F, N>(def, &this.do_frags, &this.staged, v_at, lane, d_v, vs, key_tile);
        let needs_mask = tile_needs_mask(first, count, this.t0, this.t_end, span, this.last_start, key_tile);
        mask_and_scale(&mut ds, &this.lanes, first, count, span, this.scale, lane, needs_mask, key_tile);
        score_gradients(&mut ds, &dp, &this.row_lse, &this.row_delta, this.scale, key_tile);
        accumulate_with_rows::<F, N>(def, &ds, &this.staged, at, lane, &mut this.dq, d_k, ks, key_tile);
    }
}

/// Scaled, masked scores in `s` become `ds = p (dp - delta)` in place, `p = exp(s - lse)` (0
/// where masked), row `half` taking `lse[half]` and `delta[half]`. A masked score is
/// `NEG_LARGE * scale` here, so the test is against `MASKED * scale`: against `MASKED` alone it
/// would pass masked scores once `scale < 0.1` (`d_k > 100`), and a row with no key (the
/// compressed branch before its document's first block, `lse = NEG_LARGE`) would get
/// `exp(NEG_LARGE (scale - 1)) = inf`.
#[cube]
pub fn score_gradients(
    s: &mut Array<Pair<f32>>,
    dp: &Array<Pair<f32>>,
    lse: &Array<f32>,
    delta: &Array<f32>,
    scale: f32,
    #[comptime] n_cols: usize,
) {
    let masked = MASKED * scale;
    #[unroll]
    for j in 0..n_cols / MMA_N {
        #[unroll]
        for half in 0..2usize {
            let mut x = s[2 * j + half];
            let d = dp[2 * j + half];
            #[unroll]
            for e in 0..2usize {
                let p = select(x[e] > masked, (x[e] - lse[half]).exp(), 0.0f32);
                x[e] = p * (d[e] - delta[half]);
            }
            s[2 * j + half] = x;
        }
    }
}
