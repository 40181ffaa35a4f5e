//! Forward on tensor cores (CMMA, 16x16x16, f16/bf16 inputs, f32 accumulation): the same cube
//! layout and online softmax as [`super::forward`], with `q.k` and `p.v` as plane-wide matrix
//! products instead of per-unit dot products.
//!
//! A cube has `planes` planes of 32 units; plane `p` owns rows `16p..16p + 16` of the cube
//! (padding rows past `rows` are zero queries that write nothing). Per staged key tile a plane
//! multiplies its 16 query rows by the tile's keys into an f32 score tile in shared memory; two
//! units per row (`lane / 2`, halves `lane % 2`) turn scores into probabilities and keep the
//! row's output accumulator in registers (every other column), and the plane multiplies the
//! probabilities (rounded to the storage type, as flash attention does) by the value tile,
//! `pv_cols` output columns at a time, through the same shared-memory tile.

use cubecl::cmma::{self, Matrix, MatrixIdent, MatrixLayout};
use cubecl::prelude::*;

use super::forward::MASKED;
use super::query::QueryCube;
use super::rows::{attends, offset3, stage_vector_rows, store_row_result, zero_slice, NEG_LARGE};
use crate::tiling::{f32_stride, storage_stride};

/// Rows of a plane's tile, and the MMA shape on every axis.
pub const TILE: usize = 16;
/// Byte alignment of the shared tiles (wmma's 256-bit rule).
pub const ALIGN: usize = 32;

/// `q [B, T, H_q, d_k]`, `k [B, T, H_kv, d_k]`, `v [B, T, H_kv, d_v]`, `blocks [B, T, H_kv, n]`
/// (ignored for a window) -> `out [B, T, H_q, d_v]`, `lse [B, T, H_q]` (f32), as
/// [`super::forward::attention_forward`]. Cube `(32, planes)` units; `rows <= 16 * planes`
/// real rows; `d_k`, `d_v`, `key_tile` and `pv_cols` multiples of 16, `pv_cols` dividing `d_v`.
#[cube(launch)]
pub fn attention_forward_mma<F: Float, I: Int, N: Size>(
    q: &Tensor<Vector<F, N>>,
    k: &Tensor<Vector<F, N>>,
    v: &Tensor<Vector<F, N>>,
    blocks: &Tensor<I>,
    out: &mut Tensor<F>,
    lse: &mut Tensor<f32>,
    scale: f32,
    span: u32,
    #[comptime] window: bool,
    #[comptime] d_k: usize,
    #[comptime] d_v: usize,
    #[comptime] rows: usize,
    #[comptime] planes: usize,
    #[comptime] key_tile: usize,
    #[comptime] pv_cols: usize,
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    // Two units per row: QueryCube's `part` is the half, its `row` the cube row.
    let cube = QueryCube::new::<Vector<F, N>>(q, k, rows, 2usize);
    if !cube.exists {
        terminate!();
    }
    let span = span as usize;
    let plane = UNIT_POS_Y as usize;
    let local = (UNIT_POS_X as usize) / 2;
    let half = cube.part;

    // One buffer holds the query rows while their fragments load, then the K and V tiles.
    // wmma loads and stores need 256-bit aligned tile addresses.
    // Rows are padded (`storage_stride`, `f32_stride`) against shared-memory bank conflicts.
    let ks = comptime!(storage_stride(d_k));
    let vs = comptime!(storage_stride(d_v));
    let mut staged = SharedMemory::<Vector<F, N>>::new_aligned(
        comptime!(max_usize(planes * TILE * ks, key_tile * (ks + vs)) / VECTOR),
        ALIGN,
    );
    let v_at = comptime!(key_tile * ks);
    stage_query_rows::<F, N>(q, &mut staged, cube.b, cube.t0, cube.hk, q.shape(2) / k.shape(2), rows, planes, d_k, ks);
    sync_cube();
    let q_frags = tile_row_fragments::<F, N>(&staged, plane * TILE * ks, d_k, ks);
    sync_cube();

    // Per plane: scores `[16, key_tile]`, later a `[16, pv_cols]` slice of `p.v`; and the
    // probabilities `[16, key_tile]` in the storage type.
    let sst = comptime!(f32_stride(key_tile));
    let pst = comptime!(storage_stride(key_tile));
    let region_len = comptime!(TILE * max_usize(f32_stride(key_tile), f32_stride(pv_cols)));
    let mut scores = SharedMemory::<f32>::new_aligned(planes * region_len, ALIGN);
    let mut probs = SharedMemory::<F>::new_aligned(comptime!(planes * TILE * pst), ALIGN);
    let region = plane * region_len;
    let p_region = plane * TILE * pst;

    let mut acc = zero_slice(d_v, 2usize);
    let mut row_max = f32::new(NEG_LARGE);
    let mut sum = 0.0f32;

    for r in 0..cube.range_count::<I>(blocks, window) {
        let (start, end) = cube.key_range::<I>(blocks, r, span, window);
        let mut first = start;
        while first < end {
            let count = min(end - first, key_tile);
            stage_vector_rows::<F, N>(
                k,
                &mut staged,
                0usize,
                cube.b,
                first,
                count,
                cube.hk,
                key_tile,
                d_k,
                ks,
                VECTOR,
                UNIT_POS as usize,
                CUBE_DIM as usize,
            );
            stage_vector_rows::<F, N>(
                v,
                &mut staged,
                v_at,
                cube.b,
                first,
                count,
                cube.hk,
                key_tile,
                d_v,
                vs,
                VECTOR,
                UNIT_POS as usize,
                CUBE_DIM as usize,
            );
            sync_cube();

            // Scores of the plane's 16 rows against the tile's keys (K read column-major: k^T).
            #[unroll]
            for n in 0..key_tile / TILE {
                let s = zero_tile();
                #[unroll]
                for kk in 0..d_k / TILE {
                    let kt = tile_fragment::<F, N>(
                        &staged,
                        n * TILE * ks + kk * TILE,
                        MatrixIdent::B,
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
            sync_plane();

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
                cube.t,
                span,
                cube.active,
                half,
                window,
                key_tile,
            );
            row_max = new_max;
            sum = new_sum;
            #[unroll]
            for i in 0..d_v / 2 {
                acc[i] *= correction;
            }
            sync_plane();

            accumulate_values::<F, N>(
                &staged,
                v_at,
                &probs,
                p_region,
                &mut scores,
                region,
                &mut acc,
                local,
                half,
                d_v,
                key_tile,
                pv_cols,
            );
            // The next tile overwrites K and V.
            sync_cube();
            first += count;
        }
    }

    if cube.active {
        store_row_result::<F>(out, lse, cube.b, cube.t, cube.h, half, &acc, row_max, sum, d_v, 2usize);
    }
}

/// One key tile of the online softmax for this unit's half of a row (every other key, so the
/// two units of a row read neighbouring words): scales the raw scores at `s_at`, masks keys
/// past `count` or not attended by query `t` (inactive rows mask everything), writes the
/// probabilities, rounded to the storage type, at `p_at`, and returns the row's new maximum,
/// its new sum and the factor that rescales what was accumulated under the old maximum.
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn softmax_tile<F: Float>(
    scores: &SharedMemory<f32>,
    s_at: usize,
    probs: &mut SharedMemory<F>,
    p_at: usize,
    row_max: f32,
    sum: f32,
    scale: f32,
    count: usize,
    first: usize,
    t: usize,
    span: usize,
    active: bool,
    half: usize,
    #[comptime] window: bool,
    #[comptime] key_tile: usize,
) -> (f32, f32, f32) {
    let half_keys = comptime!(key_tile / 2);
    let mut row_scores = Array::<f32>::new(half_keys);
    let mut tile_max = f32::new(NEG_LARGE);
    #[unroll]
    for c in 0..half_keys {
        let key = 2 * c + half;
        let valid = key < count && attends(t, first + key, span, window) && active;
        row_scores[c] = select(valid, scores[s_at + key] * scale, f32::new(NEG_LARGE));
        tile_max = max(tile_max, row_scores[c]);
    }
    tile_max = max(tile_max, plane_shuffle_xor(tile_max, 1u32));
    let new_max = max(row_max, tile_max);
    let correction = (row_max - new_max).exp();
    let mut tile_sum = 0.0f32;
    #[unroll]
    for c in 0..half_keys {
        let p = select(row_scores[c] > MASKED, (row_scores[c] - new_max).exp(), 0.0f32);
        tile_sum += p;
        probs[p_at + 2 * c + half] = F::cast_from(p);
    }
    tile_sum += plane_shuffle_xor(tile_sum, 1u32);
    (new_max, sum * correction + tile_sum, correction)
}

/// `acc += p . v` for the plane's 16 rows, `pv_cols` output columns per pass through the
/// plane's score region; this unit adds its row's interleaved columns (`2i + half`).
#[cube]
#[allow(clippy::too_many_arguments)]
fn accumulate_values<F: Float, N: Size>(
    staged: &SharedMemory<Vector<F, N>>,
    v_at: usize,
    probs: &SharedMemory<F>,
    p_region: usize,
    scores: &mut SharedMemory<f32>,
    region: usize,
    acc: &mut Array<f32>,
    local: usize,
    half: usize,
    #[comptime] d_v: usize,
    #[comptime] key_tile: usize,
    #[comptime] pv_cols: usize,
) {
    let vs = comptime!(storage_stride(d_v));
    let pst = comptime!(storage_stride(key_tile));
    let pvs = comptime!(f32_stride(pv_cols));
    // The probabilities are the A operand, as query rows are for the scores.
    let p_frags = row_fragments::<F>(probs, p_region, key_tile, pst);
    #[unroll]
    for j in 0..d_v / pv_cols {
        #[unroll]
        for n in 0..pv_cols / TILE {
            let o = zero_tile();
            #[unroll]
            for kk in 0..key_tile / TILE {
                let vt = tile_fragment::<F, N>(
                    staged,
                    v_at + kk * TILE * vs + j * pv_cols + n * TILE,
                    MatrixIdent::B,
                    MatrixLayout::RowMajor,
                    vs,
                );
                cmma::execute::<F, F, f32, f32>(p_frags.index(kk), &vt, &o, &o);
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
}

/// Stages the cube's query rows `[16 * planes, stride]` at element 0 of `staged` (row `r` is
/// query `t0 + r / g`, head `hk * g + r % g`; rows past `rows` or the sequence are zero), all
/// units cooperating with 16-byte loads.
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn stage_query_rows<F: Float, N: Size>(
    q: &Tensor<Vector<F, N>>,
    staged: &mut SharedMemory<Vector<F, N>>,
    b: usize,
    t0: usize,
    hk: usize,
    g: usize,
    #[comptime] rows: usize,
    #[comptime] planes: usize,
    #[comptime] d: usize,
    #[comptime] stride: usize,
) {
    let t_len = q.shape(1);
    let per_row = comptime!(d / VECTOR);
    let mut idx = UNIT_POS as usize;
    while idx < planes * TILE * per_row {
        let (r, c) = (idx / per_row, idx % per_row);
        let t = t0 + r / g;
        let mut value = Vector::<F, N>::new(F::new(0.0));
        if r < rows && t < t_len {
            value = q[offset3::<Vector<F, N>>(q, b, t, hk * g + r % g) / VECTOR + c];
        }
        staged[(r * stride) / VECTOR + c] = value;
        idx += CUBE_DIM as usize;
    }
}

/// Elements a 16x16 tile with row stride `stride` spans.
pub const fn tile_span(stride: usize) -> usize {
    (TILE - 1) * stride + TILE
}

/// The `d / 16` A fragments of the plane's 16 rows at `at` of `staged` (row stride `stride`).
#[cube]
pub fn row_fragments<F: Float>(
    staged: &SharedMemory<F>,
    at: usize,
    #[comptime] d: usize,
    #[comptime] stride: usize,
) -> Sequence<Matrix<F>> {
    let mut frags = Sequence::<Matrix<F>>::new();
    #[unroll]
    for kk in 0..d / TILE {
        frags.push(storage_fragment::<F>(staged, at + kk * TILE, MatrixLayout::RowMajor, stride));
    }
    frags
}

/// The 16x16 A fragment at element `at` of a storage-type tile (row stride `stride`): query or
/// probability rows, or a key cube's `p^T` / `ds^T`; column-major reads the transpose.
#[cube]
pub fn storage_fragment<F: Float>(
    tile: &SharedMemory<F>,
    at: usize,
    layout: MatrixLayout,
    #[comptime] stride: usize,
) -> Matrix<F> {
    Matrix::<F>::from_slice(
        MatrixIdent::A,
        TILE,
        TILE,
        TILE,
        layout,
        &tile.slice(at, at + comptime!(tile_span(stride))),
        stride as u32,
    )
}

/// `max` usable in comptime expressions.
pub const fn max_usize(a: usize, b: usize) -> usize {
    if a > b {
        a
    } else {
        b
    }
}

/// Elements per vector of the staged inputs: 16 bytes of a 16-bit type. The launch passes it
/// as the inputs' vector size; `storage_stride` rows are whole vectors.
pub const VECTOR: usize = 8;

/// The 16x16 fragment `ident` in `layout` (column-major reads the transpose) at element `at` of
/// a staged tile with row stride `stride` elements.
#[cube]
pub fn tile_fragment<F: Float, N: Size>(
    tile: &SharedMemory<Vector<F, N>>,
    at: usize,
    #[comptime] ident: MatrixIdent,
    layout: MatrixLayout,
    #[comptime] stride: usize,
) -> Matrix<F> {
    let frag = unsafe { Matrix::<F>::uninitialized(ident, TILE, TILE, TILE, layout) };
    load_staged::<F, N>(&frag, tile, at, stride);
    frag
}

/// Loads `frag` from element `at` of a staged tile with row stride `stride` elements.
#[cube]
pub fn load_staged<F: Float, N: Size>(
    frag: &Matrix<F>,
    tile: &SharedMemory<Vector<F, N>>,
    at: usize,
    #[comptime] stride: usize,
) {
    let start = at / VECTOR;
    cmma::load(frag, &tile.slice(start, start + comptime!(tile_span(stride) / VECTOR)), stride as u32);
}

/// The `d / 16` A fragments of the 16 rows at element `at` of a staged tile.
#[cube]
pub fn tile_row_fragments<F: Float, N: Size>(
    tile: &SharedMemory<Vector<F, N>>,
    at: usize,
    #[comptime] d: usize,
    #[comptime] stride: usize,
) -> Sequence<Matrix<F>> {
    let mut frags = Sequence::<Matrix<F>>::new();
    #[unroll]
    for kk in 0..d / TILE {
        frags.push(tile_fragment::<F, N>(tile, at + kk * TILE, MatrixIdent::A, MatrixLayout::RowMajor, stride));
    }
    frags
}

/// A 16x16 f32 accumulator fragment of zeros.
#[cube]
pub fn zero_tile() -> Matrix<f32> {
    Matrix::<f32>::from_value(MatrixIdent::Accumulator, TILE, TILE, TILE, MatrixLayout::Undefined, 0.0f32)
}

/// `d / 16` accumulator fragments of zeros: a plane's `[16, d]` sum.
#[cube]
pub fn zero_accumulators(#[comptime] d: usize) -> Sequence<Matrix<f32>> {
    let mut acc = Sequence::<Matrix<f32>>::new();
    #[unroll]
    for _ in 0..d / TILE {
        acc.push(zero_tile());
    }
    acc
}
