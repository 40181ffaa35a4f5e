//! A selection's dQ where the key kernel does not fold it in (wide heads): key-major, on the
//! cubes of the inverted index, added to an f32 dQ by atomics.

use cubecl::cmma::MmaDefinition;
use cubecl::prelude::*;

use super::partials::mask_block;
use crate::kernel::primitives::atomic_rows::add_rows;
use crate::kernel::primitives::chunk_copies::GradientRows;
use crate::kernel::primitives::fragments::{
    accumulate_with_rows, mma, products_with_rows, row_fragments, zero_pairs, Pair, MMA_M, MMA_N,
};
use crate::kernel::primitives::key_cube::{BlockLists, KeyCube, ListedRows};
use crate::kernel::primitives::layout::VECTOR;
use crate::kernel::primitives::staging::stage_vector_rows;
use crate::kernel::primitives::walk::{walk_pipelined, ChunkCompute};
use crate::tile_sizes::storage_stride;

/// A selection's dQ, key-major as [`selection_partials_flash`]: a cube stages one block's K
/// and V, and each plane takes the block's listed rows 16 at a time with their q and dO rows:
/// `s = q K^T`, `p = exp(s scale - lse)` (the forward's final log-sum-exp), `dp = dO V^T`,
/// `ds = p (dp - delta)`, and the row's share of dQ over the block, `scale * ds K`, added to the
/// f32 `grad_q` by atomics (each row's other blocks are other cubes'). Everything stays in
/// registers; `delta = dO . O` comes from `row_delta`.
#[cube(launch, launch_unchecked, fast_math = FastMath::all())]
// `clone()` of a handle: see `chunk_copies`.
#[allow(clippy::too_many_arguments, clippy::clone_on_copy)]
pub fn selection_dq_flash<F: Float, N: Size, A: Size>(
    q: &Tensor<Vector<F, N>>,
    k: &Tensor<Vector<F, N>>,
    v: &Tensor<Vector<F, N>>,
    grad_out: &Tensor<Vector<F, N>>,
    lse: &Tensor<f32>,
    delta: &Tensor<f32>,
    lists: &BlockLists,
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
    let cube = KeyCube::new::<Vector<F, N>>(q, k, lists, keys, segment as usize, false, keys, g);
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
    let mut staged = SharedMemory::<Vector<F, N>>::new_aligned(comptime!((base + 2 * chunk) / VECTOR), 16usize);
    let (b, hk, count) = (cube.b, cube.hk, cube.s_end - cube.s0);
    let (unit, units) = (UNIT_POS as usize, CUBE_DIM as usize);
    stage_vector_rows::<F, N>(k, &mut staged, 0usize, b, cube.s0, count, hk, keys, d_k, ks, VECTOR, unit, units);
    stage_vector_rows::<F, N>(v, &mut staged, v_at, b, cube.s0, count, hk, keys, d_v, vs, VECTOR, unit, units);
    let n_rows = cube.n_rows;
    let positions = SharedMemory::<u32>::new(comptime!(2 * q_rows));
    let stats = SharedMemory::<f32>::new(comptime!(4 * q_rows));
    let mut rows = GradientRows::<F, N>::new(
        q,
        grad_out,
        lse,
        delta,
        &lists.entries,
        &cube,
        &staged,
        &positions,
        &stats,
        base,
        false,
        q_rows,
        d_k,
        d_v,
        planes,
    );
    let mut grads = BlockQueryGradients::<F, N, A> {
        staged,
        positions,
        stats,
        grad_q: grad_q.clone(),
        cube,
        def,
        scale,
        plane,
        lane,
        d_k,
        d_v,
        keys,
        planes,
        atomic_width,
    };
    // The first wait also covers the block's K and V rows.
    walk_pipelined::<GradientRows<F, N>, BlockQueryGradients<F, N, A>>(&mut rows, &mut grads, 0usize, n_rows, q_rows);
}

/// dQ's compute per chunk of listed rows: each plane's 16 rows against the block, their
/// share of dQ added to `grad_q`.
#[derive(CubeType)]
struct BlockQueryGradients<F: Float, N: Size, A: Size> {
    staged: SharedMemory<Vector<F, N>>,
    positions: SharedMemory<u32>,
    stats: SharedMemory<f32>,
    grad_q: Tensor<Atomic<Vector<f32, A>>>,
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
    atomic_width: usize,
}

#[cube]
impl<F: Float, N: Size, A: Size> ChunkCompute for BlockQueryGradients<F, N, A> {
    fn compute(this: &mut Self, first: usize, count: usize, slot: usize) {
        let (d_k, d_v, keys, planes) = comptime!((this.d_k, this.d_v, this.keys, this.planes));
        let ks = comptime!(storage_stride(d_k));
        let vs = comptime!(storage_stride(d_v));
        let q_rows = comptime!(planes * MMA_M);
        let (def, scale, lane) = (this.def, this.scale, this.lane);
        let tile = this.plane * MMA_M;
        if tile < count {
            let at = comptime!(keys * (ks + vs)) + slot * comptime!(q_rows * (ks + vs));
            let rows = ListedRows::in_chunk(&this.positions, &this.cube, slot * q_rows, first, tile, count, lane);
            let mut row_lse = Array::<f32>::new(2usize);
            let mut row_delta = Array::<f32>::new(2usize);
            #[unroll]
            for half in 0..2usize {
                let local = slot * comptime!(2 * q_rows) + tile + lane / 4 + 8 * half;
                row_lse[half] = this.stats[local];
                row_delta[half] = this.stats[local + q_rows];
            }

            let q_frags = row_fragments::<F, N>(def, &this.staged, at, tile, lane, d_k, ks);
            let mut p = products_with_rows::<F, N>(def, &q_frags, &this.staged, 0usize, lane, d_k, ks, keys);
            mask_block(&mut p, &rows, this.cube.s0, this.cube.s_end, lane, keys);
            row_probabilities(&mut p, &row_lse, scale, keys);
            let do_at = at + comptime!(q_rows * ks);
            let do_frags = row_fragments::<F, N>(def, &this.staged, do_at, tile, lane, d_v, vs);
            let v_at = comptime!(keys * ks);
            let dp = products_with_rows::<F, N>(def, &do_frags, &this.staged, v_at, lane, d_v, vs, keys);
            row_score_gradients(&mut p, &dp, &row_delta, keys);
            let mut dq = zero_pairs(comptime!(2 * d_k / MMA_N));
            accumulate_with_rows::<F, N>(def, &p, &this.staged, 0usize, lane, &mut dq, d_k, ks, keys);
            let b = this.cube.b;
            add_rows::<A>(&mut this.grad_q, &rows, &dq, b, scale, 0usize, lane, d_k, comptime!(this.atomic_width));
        }
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
