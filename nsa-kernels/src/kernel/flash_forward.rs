//! Window forward with scores, probabilities and the output in registers (flash attention 2's
//! layout), built on [`super::fragments`]' manual-MMA products (CUDA tensor cores, f16/bf16).
//!
//! A cube has `planes` planes of 32 lanes; plane `p` owns rows `16p..16p + 16` of the cube (row
//! `r` is query `t0 + r / g`, head `hk * g + r % g`, as [`super::query`] lays them out; padding
//! rows past `rows` are zero queries that write nothing). Lane `l` holds rows `l / 4` and
//! `l / 4 + 8` of its plane's tile, so a row's softmax statistics need only the 4 lanes of a
//! quad (two shuffles), and the probabilities are the `p . v` product's A operand as they
//! stand: scores never leave registers. The CMMA forward ([`super::mma_forward`]) wrote every
//! score tile to shared memory and read it back twice, and measured 4.6x flex_attention's time.

use cubecl::prelude::barrier::Barrier;
use cubecl::prelude::*;

use super::forward::MASKED;
use super::fragments::{
    accumulate_with_rows, mma, products_with_rows, row_fragments, scale_rows, store_rows_whole, store_tiles,
    zero_pairs, Pair, MMA_M, MMA_N,
};
use super::mma_forward::{max_usize, stage_query_rows, VECTOR};
use super::query::QueryCube;
use super::rows::{attends, copy_rows_async, offset3, NEG_LARGE};
use crate::tiling::storage_stride;

/// `q [B, T, H_q, d_k]`, `k [B, T, H_kv, d_k]`, `v [B, T, H_kv, d_v]` -> `out [B, T, H_q, d_v]`,
/// `lse [B, T, H_q]` (f32) for a causal window of `span` keys, as
/// [`super::forward::attention_forward`]. Cube `(32, planes)` units; `rows <= 16 * planes`
/// real rows; `d_k`, `d_v` and `key_tile` multiples of 16.
#[cube(launch, launch_unchecked, fast_math = FastMath::all())]
pub fn window_forward_flash<F: Float, N: Size>(
    q: &Tensor<Vector<F, N>>,
    k: &Tensor<Vector<F, N>>,
    v: &Tensor<Vector<F, N>>,
    out: &mut Tensor<Vector<F, N>>,
    lse: &mut Tensor<f32>,
    scale: f32,
    span: u32,
    #[comptime] d_k: usize,
    #[comptime] d_v: usize,
    #[comptime] rows: usize,
    #[comptime] planes: usize,
    #[comptime] key_tile: usize,
    #[define(F)] _dtype: StorageType,
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
    let lanes = LaneRows::new(&cube, plane, lane, g, rows, q.shape(1));

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

    // Output tiles `[16, 8]`: element `2j + half` is tile j's register for row `half`.
    let mut acc = zero_pairs(comptime!(2 * d_v / MMA_N));
    let mut stats = RowStats::new();

    // Scalars, not a struct's fields, for the tile being computed: the next tile's values are
    // computed into fresh variables, so nothing the compute reads changes under it.
    let mut first = walk_start(&cube, span);
    let mut count = min(cube.t_end - first, key_tile);
    let mut buffer_at = 0usize;
    let barriers = TileBarriers::new();
    issue_tile::<F, N>(k, v, &mut staged, &cube, first, count, 0usize, &barriers, d_k, d_v, key_tile, planes);
    while first < cube.t_end {
        let next_first = first + count;
        let next_count =
            select(next_first < cube.t_end, min(cube.t_end - min(next_first, cube.t_end), key_tile), 0usize);
        let next_at = buffer - buffer_at;
        if next_first < cube.t_end {
            issue_tile::<F, N>(
                k,
                v,
                &mut staged,
                &cube,
                next_first,
                next_count,
                next_at,
                &barriers,
                d_k,
                d_v,
                key_tile,
                planes,
            );
        }
        barriers.wait(buffer_at);
        let at = buffer_at;

        let mut scores = products_with_rows::<F, N>(def, &q_frags, &staged, at, lane, d_k, ks, key_tile);
        let needs_mask = tile_needs_mask(first, count, cube.t0, cube.t_end, span, key_tile);
        if needs_mask {
            mask_scores(&mut scores, &lanes, first, count, span, lane, key_tile);
        }
        let correction = stats.update(&mut scores, scale, key_tile);
        scale_rows(&mut acc, &correction, comptime!(d_v / MMA_N));
        accumulate_with_rows::<F, N>(def, &scores, &staged, at + key_tile * ks, lane, &mut acc, d_v, vs, key_tile);
        // The tile after next overwrites this buffer.
        sync_cube();
        first = next_first;
        count = next_count;
        buffer_at = next_at;
    }

    store_rows::<F, N>(out, lse, &lanes, &mut acc, &stats, cube.b, lane, d_v);
}

/// The two rows a lane holds: `l / 4` and `l / 4 + 8` of its plane's tile.
#[derive(CubeType)]
pub struct LaneRows {
    /// Query position (clamped into the sequence when inactive) and head of each row.
    pub t: Array<usize>,
    pub h: Array<usize>,
    /// The row is a real query.
    pub active: Array<bool>,
}

#[cube]
impl LaneRows {
    pub fn new(
        cube: &QueryCube,
        plane: usize,
        lane: usize,
        g: usize,
        #[comptime] rows: usize,
        t_len: usize,
    ) -> LaneRows {
        let mut t = Array::<usize>::new(2usize);
        let mut h = Array::<usize>::new(2usize);
        let mut active = Array::<bool>::new(2usize);
        #[unroll]
        for half in 0..2usize {
            let row = plane * MMA_M + lane / 4 + 8 * half;
            let pos = cube.t0 + row / g;
            let real = row < rows && pos < t_len;
            t[half] = select(real, pos, t_len - 1);
            h[half] = cube.hk * g + row % g;
            active[half] = real;
        }
        LaneRows { t, h, active }
    }
}

/// The first key of a query cube's walk: the start of its first query's window.
#[cube]
pub fn walk_start(cube: &QueryCube, span: usize) -> usize {
    let mut first = 0usize;
    if cube.t0 + 1 > span {
        first = cube.t0 + 1 - span;
    }
    first
}

/// Starts the copies of the key tile `first..first + count` (K rows at element `at`, V rows
/// after `key_tile` K rows) and commits them to the barrier of the buffer at `at` (0: the
/// first).
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn issue_tile<F: Float, N: Size>(
    k: &Tensor<Vector<F, N>>,
    v: &Tensor<Vector<F, N>>,
    staged: &mut SharedMemory<Vector<F, N>>,
    cube: &QueryCube,
    first: usize,
    count: usize,
    at: usize,
    barriers: &TileBarriers,
    #[comptime] d_k: usize,
    #[comptime] d_v: usize,
    #[comptime] key_tile: usize,
    #[comptime] planes: usize,
) {
    let ks = comptime!(storage_stride(d_k));
    let vs = comptime!(storage_stride(d_v));
    let units = comptime!(planes * 32);
    copy_rows_async::<F, N>(k, staged, at, cube.b, first, count, cube.hk, key_tile, d_k, ks, VECTOR, units);
    copy_rows_async::<F, N>(
        v,
        staged,
        at + key_tile * ks,
        cube.b,
        first,
        count,
        cube.hk,
        key_tile,
        d_v,
        vs,
        VECTOR,
        units,
    );
    barriers.commit(at);
}

/// One barrier per staging buffer: a unit commits its copies into a buffer to that buffer's
/// barrier, and every unit waits on it before reading the buffer.
#[derive(CubeType)]
pub struct TileBarriers {
    pub first: Shared<Barrier>,
    pub second: Shared<Barrier>,
}

#[cube]
impl TileBarriers {
    pub fn new() -> TileBarriers {
        TileBarriers {
            first: Barrier::shared(CUBE_DIM, UNIT_POS == 0),
            second: Barrier::shared(CUBE_DIM, UNIT_POS == 0),
        }
    }

    /// Commits this unit's copies into the buffer at element `at` (0: the first; a buffer's
    /// slot, 0 or 1, names it as well).
    pub fn commit(&self, at: usize) {
        if at == 0 {
            self.first.commit_copy_async();
        } else {
            self.second.commit_copy_async();
        }
    }

    /// Waits until every unit's copies into the buffer at element `at` (or of slot `at`, as
    /// [`Self::commit`]) have landed.
    pub fn wait(&self, at: usize) {
        if at == 0 {
            self.first.arrive_and_wait();
        } else {
            self.second.arrive_and_wait();
        }
    }
}

/// Running maximum and (this lane's share of the) sum of each of the lane's two rows; the
/// quad's shares are added once, at the end (the maxima are the quad's, so one correction
/// serves all four shares).
#[derive(CubeType)]
pub struct RowStats {
    pub max: Array<f32>,
    pub sum: Array<f32>,
}

#[cube]
impl RowStats {
    pub fn new() -> RowStats {
        let mut max = Array::<f32>::new(2usize);
        let mut sum = Array::<f32>::new(2usize);
        #[unroll]
        for half in 0..2usize {
            max[half] = f32::new(NEG_LARGE);
            sum[half] = 0.0f32;
        }
        RowStats { max, sum }
    }

    /// One key tile of the online softmax: turns the raw (unscaled) masked scores into
    /// probabilities `exp(s scale - max)` in place and returns the factor that rescales each
    /// row's accumulated output. The maximum is kept scaled (`scale > 0` keeps the order).
    ///
    /// Why raw scores: the scale folds into the exponential's argument (one fused multiply-add
    /// per score instead of a multiply and a subtraction), and a masked score needs no test of
    /// its own. A row that has no attended key yet (its maximum still masked) is shifted by 0
    /// instead of its maximum, so its masked scores give `exp(-huge) = 0` and never
    /// `exp(0) = 1`: one test per row rather than one per score.
    pub fn update(&mut self, scores: &mut Array<Pair<f32>>, scale: f32, #[comptime] key_tile: usize) -> Array<f32> {
        let mut correction = Array::<f32>::new(2usize);
        #[unroll]
        for half in 0..2usize {
            let mut tile_max = f32::new(NEG_LARGE);
            #[unroll]
            for j in 0..key_tile / MMA_N {
                let s = scores[2 * j + half];
                tile_max = max(tile_max, max(s[0], s[1]));
            }
            tile_max = max(tile_max, plane_shuffle_xor(tile_max, 1u32));
            tile_max = max(tile_max, plane_shuffle_xor(tile_max, 2u32));
            let new_max = max(self.max[half], tile_max * scale);
            let shift = select(new_max > MASKED * scale, new_max, 0.0f32);
            correction[half] = (self.max[half] - shift).exp();
            let mut tile_sum = 0.0f32;
            #[unroll]
            for j in 0..key_tile / MMA_N {
                let mut s = scores[2 * j + half];
                #[unroll]
                for e in 0..2usize {
                    s[e] = fma(s[e], scale, -shift).exp();
                    tile_sum += s[e];
                }
                scores[2 * j + half] = s;
            }
            self.max[half] = new_max;
            self.sum[half] = self.sum[half] * correction[half] + tile_sum;
        }
        correction
    }

    /// The quad's sum of row `half`.
    pub fn row_sum(&self, half: usize) -> f32 {
        let mut sum = self.sum[half];
        sum += plane_shuffle_xor(sum, 1u32);
        sum += plane_shuffle_xor(sum, 2u32);
        sum
    }
}

/// Masks keys past the tile's `count` or outside a row's window (keys `first..first + count` of
/// the tile; the lane holds keys `8j + 2 (l % 4) + e`) to `NEG_LARGE`, leaving the others as
/// they are. Padding rows (zero queries, never written) need no mask. Only tiles at the walk's
/// ends mask anything ([`tile_needs_mask`]).
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn mask_scores(
    scores: &mut Array<Pair<f32>>,
    lanes: &LaneRows,
    first: usize,
    count: usize,
    span: usize,
    lane: usize,
    #[comptime] key_tile: usize,
) {
    let column = 2 * (lane % 4);
    #[unroll]
    for j in 0..key_tile / MMA_N {
        #[unroll]
        for half in 0..2usize {
            let mut s = scores[2 * j + half];
            #[unroll]
            for e in 0..2usize {
                let key = j * MMA_N + column + e;
                let valid = key < count && attends(lanes.t[half], first + key, span, true);
                s[e] = select(valid, s[e], f32::new(NEG_LARGE));
            }
            scores[2 * j + half] = s;
        }
    }
}

/// [`mask_scores`], then every score times `scale` (masked ones stay below `MASKED`).
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn mask_and_scale(
    scores: &mut Array<Pair<f32>>,
    lanes: &LaneRows,
    first: usize,
    count: usize,
    span: usize,
    scale: f32,
    lane: usize,
    needs_mask: bool,
    #[comptime] key_tile: usize,
) {
    if needs_mask {
        mask_scores(scores, lanes, first, count, span, lane, key_tile);
    }
    let scale_pair = Pair::<f32>::new(scale);
    #[unroll]
    for i in 0..2 * key_tile / MMA_N {
        scores[i] = scores[i] * scale_pair;
    }
}

/// Whether the key tile `first..first + count` (of `key_tile`) holds a key that some query of
/// `t0..t_end` does not attend: a partial tile, a key past `t0`, or a key before the last
/// query's window. The same for the whole cube, so the branch does not diverge.
#[cube]
pub fn tile_needs_mask(
    first: usize,
    count: usize,
    t0: usize,
    t_end: usize,
    span: usize,
    #[comptime] key_tile: usize,
) -> bool {
    count < key_tile || first + key_tile > t0 + 1 || first + span < t_end
}

/// Writes the lane's two rows of the output, divided by the rows' sums, as whole 16-byte
/// vectors ([`store_rows_whole`]), and (one lane of the quad) the rows' log-sum-exp. Written 2
/// elements per store, the output's stores were 11% of the kernel's stall samples (H100,
/// production 64k, ncu): a cube alone on its SM ends in a queue of small stores.
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
