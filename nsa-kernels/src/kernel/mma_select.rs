//! Selected attention on tensor cores (CMMA 16x16x16, f16/bf16 in, f32 accumulation), one query
//! per plane (the forward; a selection's dQ is folded into the key
//! cubes, [`super::mma_backward`]).
//!
//! Each query has its own blocks, so a cube-wide kernel (one query per cube, K/V staged once
//! for all its planes, [`super::mma_forward`]'s layout) shares nothing between its planes; it
//! measured 2.5x slower than the plain kernel. Here a plane owns one query's 16-row head tile
//! (`g = 6` fills 6 rows, `g = 16` all) and walks its blocks alone, with plane barriers only.
//!
//! Where its K and V fragments come from was measured (H100, 64k, docs/benchmarks.md): it loads
//! each 16x16 fragment straight from global memory (a block's rows of one KV head are
//! `stride(1)` apart, which wmma takes as the leading dimension). The last 16 keys of a ragged
//! sequence would read past the tensor, so that sub-tile is staged with zero rows ("spilled")
//! in the plane's shared tile. Staging every step with 16-byte loads instead measured 1.3x
//! slower here (its steps shrink to 32 keys to fit, and nothing hides the staging's latency).
//!
//! It reads its inputs as vectors of [`VECTOR`] elements (16 bytes), as all tensor-core kernels
//! do.
//!
//! The forward's softmax and `p . v` steps are [`super::mma_forward`]'s: scores through an f32
//! tile in shared memory, two units per row, the output accumulator in registers.

use cubecl::cmma::{self, Matrix, MatrixIdent, MatrixLayout};
use cubecl::prelude::*;

use super::mma_forward::{
    load_staged, max_usize, row_fragments, softmax_tile, tile_row_fragments, tile_span, zero_tile, ALIGN, TILE, VECTOR,
};
use super::rows::{block_range, offset3, stage_vector_rows, store_row_result, zero_slice, NEG_LARGE};
use crate::tiling::{f32_stride, storage_stride};

/// Where a selection plane sits: plane `UNIT_POS_Y` of cube `CUBE_POS` takes work item
/// `CUBE_POS * planes + UNIT_POS_Y`, numbered `(b, hk, head tile, t)` with `t` fastest (so a
/// cube's planes are neighbouring queries, which share blocks in trained models). Unit `x` of
/// the plane serves half `x % 2` of tile row `x / 2`, head `head0 + x / 2`.
#[derive(CubeType)]
pub struct SelectPlane {
    /// False for the surplus planes of a rounded-up launch grid.
    pub exists: bool,
    pub b: usize,
    pub hk: usize,
    pub t: usize,
    /// The tile's first head and its real rows (`min(16, g - 16 j)`).
    pub head0: usize,
    pub rows: usize,
    pub local: usize,
    pub half: usize,
    /// The unit's row is a real head (its results are written).
    pub active: bool,
    /// The unit's head; the tile's first for padding rows, so reads stay in bounds.
    pub h: usize,
}

#[cube]
impl SelectPlane {
    pub fn new<E: CubePrimitive>(q: &Tensor<E>, k: &Tensor<E>, #[comptime] planes: usize) -> SelectPlane {
        let (t_len, h_kv) = (q.shape(1), k.shape(2));
        let g = q.shape(2) / h_kv;
        let tiles = g.div_ceil(TILE);
        let item = CUBE_POS * planes + UNIT_POS_Y as usize;
        let t = item % t_len;
        let j = (item / t_len) % tiles;
        let hk = (item / (t_len * tiles)) % h_kv;
        let b = item / (t_len * tiles * h_kv);
        let head0 = hk * g + j * TILE;
        let rows = min(g - j * TILE, TILE);
        let local = UNIT_POS_X as usize / 2;
        let active = local < rows;
        let h = select(active, head0 + local, head0);
        SelectPlane { exists: b < q.shape(0), b, hk, t, head0, rows, local, half: UNIT_POS_X as usize % 2, active, h }
    }

    /// Stages the tile's 16 rows of `src [B, T, H_q, d]` at element `at` of `tile` (row stride
    /// `stride` elements); padding rows are zero. The plane's units cooperate.
    pub fn stage_query_rows<F: Float, N: Size>(
        &self,
        src: &Tensor<Vector<F, N>>,
        tile: &mut SharedMemory<Vector<F, N>>,
        at: usize,
        #[comptime] d: usize,
        #[comptime] stride: usize,
    ) {
        let per_row = comptime!(d / VECTOR);
        let mut idx = UNIT_POS_X as usize;
        while idx < TILE * per_row {
            let (r, c) = (idx / per_row, idx % per_row);
            let mut value = Vector::<F, N>::new(F::new(0.0));
            if r < self.rows {
                value = src[offset3::<Vector<F, N>>(src, self.b, self.t, self.head0 + r) / VECTOR + c];
            }
            tile[(at + r * stride) / VECTOR + c] = value;
            idx += CUBE_DIM_X as usize;
        }
    }

    /// Stages key rows `first..first + count` of `src [B, T, H_kv, d]` (K or V) at element `at`
    /// of `tile` as `rows` rows (row stride `stride`), rows past `count` zero; the plane's
    /// units cooperate.
    #[allow(clippy::too_many_arguments)]
    pub fn stage_key_rows<F: Float, N: Size>(
        &self,
        src: &Tensor<Vector<F, N>>,
        tile: &mut SharedMemory<Vector<F, N>>,
        at: usize,
        first: usize,
        count: usize,
        #[comptime] rows: usize,
        #[comptime] d: usize,
        #[comptime] stride: usize,
    ) {
        stage_vector_rows::<F, N>(
            src,
            tile,
            at,
            self.b,
            first,
            count,
            self.hk,
            rows,
            d,
            stride,
            VECTOR,
            UNIT_POS_X as usize,
            CUBE_DIM_X as usize,
        );
    }
}

/// The B fragment of key rows `first..first + 16`, columns `col..col + 16` of head `hk` of
/// `src` (K or V) in `layout` (column-major reads the transpose), from global memory, or from
/// the spill tile (its column `col` at element `spill_at`) when `spilled`.
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn key_fragment<F: Float, N: Size>(
    src: &Tensor<Vector<F, N>>,
    b: usize,
    hk: usize,
    first: usize,
    col: usize,
    staged: &SharedMemory<Vector<F, N>>,
    spill_at: usize,
    spilled: bool,
    layout: MatrixLayout,
    #[comptime] stride: usize,
) -> Matrix<F> {
    let frag = unsafe { Matrix::<F>::uninitialized(MatrixIdent::B, TILE, TILE, TILE, layout) };
    if spilled {
        load_staged::<F, N>(&frag, staged, spill_at, stride);
    } else {
        // Whole vectors: `ld`, the row offset and `col` are multiples of 16 elements.
        let ld = src.stride(1);
        let at = (offset3::<Vector<F, N>>(src, b, first, hk) + col) / VECTOR;
        cmma::load(&frag, &src.slice(at, at + ((TILE - 1) * ld + TILE) / VECTOR), ld as u32);
    }
    frag
}

/// The sub-tiles of 16 keys a step of `count` keys from `first` covers, and whether the last
/// one runs past the sequence (`t_len`) and must be spilled.
#[cube]
pub fn step_subtiles(first: usize, count: usize, t_len: usize) -> (usize, bool) {
    let subtiles = count.div_ceil(TILE);
    (subtiles, first + subtiles * TILE > t_len)
}

/// `q [B, T, H_q, d_k]`, `k [B, T, H_kv, d_k]`, `v [B, T, H_kv, d_v]`, `blocks [B, T, H_kv, n]`
/// -> `out [B, T, H_q, d_v]`, `lse [B, T, H_q]` (f32), as [`super::forward::attention_forward`]
/// for a selection, with `q`, `k`, `v` as vectors of [`VECTOR`]. Cube `(32, planes)` units;
/// `d_k`, `d_v`, `key_tile`, `pv_cols` multiples of 16, `pv_cols` dividing `d_v`; K, V strides
/// multiples of 16 elements in 32-byte aligned buffers (wmma's rule for the fragments read
/// from global memory).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn selection_forward_mma<F: Float, I: Int, N: Size>(
    q: &Tensor<Vector<F, N>>,
    k: &Tensor<Vector<F, N>>,
    v: &Tensor<Vector<F, N>>,
    blocks: &Tensor<I>,
    out: &mut Tensor<F>,
    lse: &mut Tensor<f32>,
    scale: f32,
    span: u32,
    #[comptime] d_k: usize,
    #[comptime] d_v: usize,
    #[comptime] planes: usize,
    #[comptime] key_tile: usize,
    #[comptime] pv_cols: usize,
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    let plane = SelectPlane::new::<Vector<F, N>>(q, k, planes);
    if !plane.exists {
        terminate!();
    }
    let span = span as usize;
    let (b, hk, t, local, half) = (plane.b, plane.hk, plane.t, plane.local, plane.half);
    let p_index = UNIT_POS_Y as usize;

    // Per plane: the query rows while their fragments load, then the spill tile (16 K rows,
    // then 16 V rows). Rows are padded against bank conflicts (`storage_stride`).
    let ks = comptime!(storage_stride(d_k));
    let vs = comptime!(storage_stride(d_v));
    let stage_len = comptime!(TILE * (ks + vs));
    let mut staged = SharedMemory::<Vector<F, N>>::new_aligned(comptime!(planes * stage_len / VECTOR), ALIGN);
    let k_spill = p_index * stage_len;
    let v_spill = k_spill + comptime!(TILE * ks);
    plane.stage_query_rows::<F, N>(q, &mut staged, k_spill, d_k, ks);
    sync_plane();
    let q_frags = tile_row_fragments::<F, N>(&staged, k_spill, d_k, ks);
    sync_plane();

    // Per plane: scores `[16, key_tile]`, later a `[16, pv_cols]` slice of `p . v`; and the
    // probabilities in the storage type.
    let sst = comptime!(f32_stride(key_tile));
    let pst = comptime!(storage_stride(key_tile));
    let pvs = comptime!(f32_stride(pv_cols));
    let region_len = comptime!(TILE * max_usize(f32_stride(key_tile), f32_stride(pv_cols)));
    let mut scores = SharedMemory::<f32>::new_aligned(comptime!(planes * region_len), ALIGN);
    let mut probs = SharedMemory::<F>::new_aligned(comptime!(planes * TILE * pst), ALIGN);
    let region = p_index * region_len;
    let p_region = p_index * TILE * pst;

    let mut acc = zero_slice(d_v, 2usize);
    let mut row_max = f32::new(NEG_LARGE);
    let mut sum = 0.0f32;
    let t_len = k.shape(1);
    let slots = offset3::<I>(blocks, b, t, hk);

    for r in 0..blocks.shape(3) {
        let (start, end) = block_range::<I>(blocks, slots, r, t, span);
        let mut first = start;
        while first < end {
            let count = min(end - first, key_tile);
            let (subtiles, spilled) = step_subtiles(first, count, t_len);
            if spilled {
                let last = first + (subtiles - 1) * TILE;
                let rows = t_len - last;
                plane.stage_key_rows::<F, N>(k, &mut staged, k_spill, last, rows, TILE, d_k, ks);
                plane.stage_key_rows::<F, N>(v, &mut staged, v_spill, last, rows, TILE, d_v, vs);
                sync_plane();
            }

            // Scores of the tile's 16 rows against the step's keys (K read column-major: k^T).
            #[unroll]
            for n in 0..key_tile / TILE {
                if n < subtiles {
                    let spill = spilled && n + 1 == subtiles;
                    let s = zero_tile();
                    #[unroll]
                    for kk in 0..d_k / TILE {
                        let kt = key_fragment::<F, N>(
                            k,
                            b,
                            hk,
                            first + n * TILE,
                            kk * TILE,
                            &staged,
                            k_spill + kk * TILE,
                            spill,
                            MatrixLayout::ColMajor,
                            ks,
                        );
                        cmma::execute::<F, F, f32, f32>(q_frags.index(kk), &kt, &s, &s);
                    }
                    let at = region + n * TILE;
                    cmma::store(
                        &mut scores.slice_mut(at, at + comptime!(tile_span(sst))),
                        &s,
                        sst as u32,
                        MatrixLayout::RowMajor,
                    );
                }
            }
            sync_plane();

            // Keys past `count` (uncomputed sub-tiles included) are masked; block_range
            // already clamped the block causally.
            let (new_max, new_sum, correction) = softmax_tile::<F>(
                &scores,
                region + local * sst,
                &mut probs,
                p_region + local * pst,
                row_max,
                sum,
                scale,
                count,
                first,
                t,
                span,
                plane.active,
                half,
                false,
                key_tile,
            );
            row_max = new_max;
            sum = new_sum;
            #[unroll]
            for i in 0..d_v / 2 {
                acc[i] *= correction;
            }
            sync_plane();

            // acc += p . v, `pv_cols` output columns per pass through the score region.
            let p_frags = row_fragments::<F>(&probs, p_region, key_tile, pst);
            #[unroll]
            for j in 0..d_v / pv_cols {
                #[unroll]
                for n in 0..pv_cols / TILE {
                    let o = zero_tile();
                    let col = j * pv_cols + n * TILE;
                    #[unroll]
                    for kk in 0..key_tile / TILE {
                        if kk < subtiles {
                            let spill = spilled && kk + 1 == subtiles;
                            let vt = key_fragment::<F, N>(
                                v,
                                b,
                                hk,
                                first + kk * TILE,
                                col,
                                &staged,
                                v_spill + col,
                                spill,
                                MatrixLayout::RowMajor,
                                vs,
                            );
                            cmma::execute::<F, F, f32, f32>(p_frags.index(kk), &vt, &o, &o);
                        }
                    }
                    let at = region + n * TILE;
                    cmma::store(
                        &mut scores.slice_mut(at, at + comptime!(tile_span(pvs))),
                        &o,
                        pvs as u32,
                        MatrixLayout::RowMajor,
                    );
                }
                sync_plane();
                #[unroll]
                for i in 0..pv_cols / 2 {
                    acc[j * (pv_cols / 2) + i] += scores[region + local * pvs + 2 * i + half];
                }
                sync_plane();
            }
            first += count;
        }
    }

    if plane.active {
        store_row_result::<F>(out, lse, b, t, plane.h, half, &acc, row_max, sum, d_v, 2usize);
    }
}
