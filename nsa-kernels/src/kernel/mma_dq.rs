//! dQ of a window on tensor cores (CMMA 16x16x16, f16/bf16 in, f32 accumulation): the query
//! cubes of [`super::mma_forward`] (same rows, same key walk), computing what
//! [`super::backward::attention_backward_query`] does.
//!
//! A plane's q and dO rows are A fragments held for the whole walk and its dQ is accumulator
//! fragments (a backward has no rescaling). Per staged key tile: `s = q K^T` and `dp = dO V^T`
//! go to f32 tiles in shared memory; two units per row turn them into `ds = p (dp - delta)` with
//! `p = exp(s scale - lse)` (masked, rounded to the storage type); then `dQ += ds K`.

use cubecl::cmma::{self, Matrix, MatrixIdent, MatrixLayout};
use cubecl::prelude::*;

use super::mma_forward::{
    max_usize, stage_query_rows, storage_fragment, tile_fragment, tile_row_fragments, tile_span, zero_accumulators,
    zero_tile, ALIGN, TILE, VECTOR,
};
use super::query::QueryCube;
use super::rows::{attends, offset3, stage_vector_rows};
use crate::tiling::{f32_stride, storage_stride};

/// Inputs as the plain query kernel; writes `grad_q` and `delta = dO . O` (for the key pass).
/// Cube `(32, planes)` units, `rows <= 16 * planes` real rows, `key_tile` a multiple of 32.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn attention_backward_query_mma<F: Float, I: Int, N: Size>(
    q: &Tensor<Vector<F, N>>,
    k: &Tensor<Vector<F, N>>,
    v: &Tensor<Vector<F, N>>,
    blocks: &Tensor<I>,
    out: &Tensor<Vector<F, N>>,
    grad_out: &Tensor<Vector<F, N>>,
    lse: &Tensor<f32>,
    delta: &mut Tensor<f32>,
    grad_q: &mut Tensor<F>,
    scale: f32,
    span: u32,
    #[comptime] window: bool,
    #[comptime] d_k: usize,
    #[comptime] d_v: usize,
    #[comptime] rows: usize,
    #[comptime] planes: usize,
    #[comptime] key_tile: usize,
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    let cube = QueryCube::new::<Vector<F, N>>(q, k, rows, 2usize);
    if !cube.exists {
        terminate!();
    }
    let span = span as usize;
    let plane = UNIT_POS_Y as usize;
    let local = (UNIT_POS_X as usize) / 2;
    let half = cube.part;
    let g = q.shape(2) / k.shape(2);

    // This row's statistics: lse from the forward, delta = dO . O (two units, half each).
    let (b, t, h) = (cube.b, cube.t, cube.h);
    let row_lse = lse[offset3::<f32>(lse, b, t, h)];
    let partial_delta = half_row_delta::<F, N>(out, grad_out, b, t, h, half, d_v);
    let row_delta = partial_delta + plane_shuffle_xor(partial_delta, 1u32);
    if cube.active && half == 0usize {
        delta[offset3::<f32>(delta, b, t, h)] = row_delta;
    }

    // One buffer: q rows, then dO rows, while their fragments load; then K and V tiles.
    // Rows are padded (`storage_stride`, `f32_stride`) against shared-memory bank conflicts.
    let ks = comptime!(storage_stride(d_k));
    let vs = comptime!(storage_stride(d_v));
    let mut staged = SharedMemory::<Vector<F, N>>::new_aligned(
        comptime!(max_usize(planes * TILE * max_usize(ks, vs), key_tile * (ks + vs)) / VECTOR),
        ALIGN,
    );
    let v_at = comptime!(key_tile * ks);
    stage_query_rows::<F, N>(q, &mut staged, b, cube.t0, cube.hk, g, rows, planes, d_k, ks);
    sync_cube();
    let q_frags = tile_row_fragments::<F, N>(&staged, plane * TILE * ks, d_k, ks);
    sync_cube();
    stage_query_rows::<F, N>(grad_out, &mut staged, b, cube.t0, cube.hk, g, rows, planes, d_v, vs);
    sync_cube();
    let do_frags = tile_row_fragments::<F, N>(&staged, plane * TILE * vs, d_v, vs);
    sync_cube();

    let dq = zero_accumulators(d_k);

    // Per plane: f32 `s` and `dp` tiles `[16, key_tile]`, and `ds` in the storage type.
    let sst = comptime!(f32_stride(key_tile));
    let pst = comptime!(storage_stride(key_tile));
    let region_len = comptime!(TILE * sst);
    let mut scores = SharedMemory::<f32>::new_aligned(comptime!(2 * planes * TILE * sst), ALIGN);
    let mut weights = SharedMemory::<F>::new_aligned(comptime!(planes * TILE * pst), ALIGN);
    let s_region = plane * 2 * region_len;
    let dp_region = s_region + region_len;
    let ds_region = plane * TILE * pst;

    for r in 0..cube.range_count::<I>(blocks, window) {
        let (start, end) = cube.key_range::<I>(blocks, r, span, window);
        let mut first = start;
        while first < end {
            let count = min(end - first, key_tile);
            stage_vector_rows::<F, N>(
                k,
                &mut staged,
                0usize,
                b,
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
                b,
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

            let all = comptime!(key_tile / TILE);
            score_and_dp_tiles::<F, N>(
                &staged,
                0usize,
                v_at,
                &q_frags,
                &do_frags,
                &mut scores,
                s_region,
                dp_region,
                all,
                d_k,
                d_v,
                key_tile,
            );
            sync_plane();
            ds_weights::<F>(
                &scores,
                s_region + local * sst,
                dp_region + local * sst,
                &mut weights,
                ds_region + local * pst,
                scale,
                row_lse,
                row_delta,
                count,
                first,
                t,
                span,
                cube.active,
                half,
                window,
                key_tile,
            );
            sync_plane();
            accumulate_dq::<F, N>(&weights, ds_region, &staged, 0usize, &dq, all, d_k, key_tile);
            // The next tile overwrites K and V.
            sync_cube();
            first += count;
        }
    }

    store_dq_rows::<F>(&dq, &mut scores, s_region, grad_q, b, t, h, local, half, cube.active, scale, d_k);
}

/// Writes a plane's dQ accumulators, times `scale`, to the rows `(b, t, h)` of `grad_q`
/// through the plane's f32 tile at `region` (one 16x16 fragment at a time; two units per row,
/// alternate columns); only active rows write.
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn store_dq_rows<F: Float>(
    dq: &Sequence<Matrix<f32>>,
    scores: &mut SharedMemory<f32>,
    region: usize,
    grad_q: &mut Tensor<F>,
    b: usize,
    t: usize,
    h: usize,
    local: usize,
    half: usize,
    active: bool,
    scale: f32,
    #[comptime] d_k: usize,
) {
    let ost = comptime!(f32_stride(TILE));
    #[unroll]
    for n in 0..d_k / TILE {
        cmma::store(
            &mut scores.slice_mut(region, region + comptime!(tile_span(ost))),
            dq.index(n),
            ost as u32,
            MatrixLayout::RowMajor,
        );
        sync_plane();
        if active {
            #[unroll]
            for c in 0..TILE / 2 {
                let col = 2 * c + half;
                grad_q[offset3::<F>(grad_q, b, t, h) + n * TILE + col] =
                    F::cast_from(scores[region + local * ost + col] * scale);
            }
        }
        sync_plane();
    }
}

/// This unit's half of `dO . O` for the row `(b, t, h)`: alternate vectors of the row, so the
/// two units of a row read neighbouring 16-byte words; the caller adds the other half.
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn half_row_delta<F: Float, N: Size>(
    out: &Tensor<Vector<F, N>>,
    grad_out: &Tensor<Vector<F, N>>,
    b: usize,
    t: usize,
    h: usize,
    half: usize,
    #[comptime] d_v: usize,
) -> f32 {
    let o_row = offset3::<Vector<F, N>>(out, b, t, h) / VECTOR;
    let do_row = offset3::<Vector<F, N>>(grad_out, b, t, h) / VECTOR;
    let mut partial = 0.0f32;
    #[unroll]
    for i in 0..d_v / (2 * VECTOR) {
        let c = 2 * i + half;
        let (o, d_o) = (out[o_row + c], grad_out[do_row + c]);
        #[unroll]
        for e in 0..VECTOR {
            partial += f32::cast_from(d_o[e]) * f32::cast_from(o[e]);
        }
    }
    partial
}

/// `s = q K^T` and `dp = dO V^T` for a plane's 16 rows against the first `subtiles` 16-key
/// sub-tiles of a staged step (K rows at element `k_at`, V rows at `v_at` of `staged`, read
/// column-major: their transposes), into the plane's f32 tiles at `s_region` and `dp_region`.
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn score_and_dp_tiles<F: Float, N: Size>(
    staged: &SharedMemory<Vector<F, N>>,
    k_at: usize,
    v_at: usize,
    q_frags: &Sequence<Matrix<F>>,
    do_frags: &Sequence<Matrix<F>>,
    scores: &mut SharedMemory<f32>,
    s_region: usize,
    dp_region: usize,
    subtiles: usize,
    #[comptime] d_k: usize,
    #[comptime] d_v: usize,
    #[comptime] key_tile: usize,
) {
    let ks = comptime!(storage_stride(d_k));
    let vs = comptime!(storage_stride(d_v));
    let sst = comptime!(f32_stride(key_tile));
    #[unroll]
    for n in 0..key_tile / TILE {
        if n < subtiles {
            let s = zero_tile();
            #[unroll]
            for kk in 0..d_k / TILE {
                let kt = tile_fragment::<F, N>(
                    staged,
                    k_at + n * TILE * ks + kk * TILE,
                    MatrixIdent::B,
                    MatrixLayout::ColMajor,
                    ks,
                );
                cmma::execute::<F, F, f32, f32>(q_frags.index(kk), &kt, &s, &s);
            }
            let at = s_region + n * TILE;
            cmma::store(
                &mut scores.slice_mut(at, at + comptime!(tile_span(sst))),
                &s,
                sst as u32,
                MatrixLayout::RowMajor,
            );
            let dp = zero_tile();
            #[unroll]
            for kk in 0..d_v / TILE {
                let vt = tile_fragment::<F, N>(
                    staged,
                    v_at + n * TILE * vs + kk * TILE,
                    MatrixIdent::B,
                    MatrixLayout::ColMajor,
                    vs,
                );
                cmma::execute::<F, F, f32, f32>(do_frags.index(kk), &vt, &dp, &dp);
            }
            let at = dp_region + n * TILE;
            cmma::store(
                &mut scores.slice_mut(at, at + comptime!(tile_span(sst))),
                &dp,
                sst as u32,
                MatrixLayout::RowMajor,
            );
        }
    }
}

/// `ds = p (dp - delta)`, `p = exp(s scale - lse)`, for this unit's half of its row's keys
/// (every other key: the two units of a row read neighbouring words), from the row's `s` at
/// `s_at` and `dp` at `dp_at`, to `weights` at `w_at` in the storage type. Keys past `count`
/// or not attended by query `t` (and every key of an inactive row) get zero: their `s` and `dp`
/// may never have been computed.
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn ds_weights<F: Float>(
    scores: &SharedMemory<f32>,
    s_at: usize,
    dp_at: usize,
    weights: &mut SharedMemory<F>,
    w_at: usize,
    scale: f32,
    row_lse: f32,
    row_delta: f32,
    count: usize,
    first: usize,
    t: usize,
    span: usize,
    active: bool,
    half: usize,
    #[comptime] window: bool,
    #[comptime] key_tile: usize,
) {
    #[unroll]
    for c in 0..key_tile / 2 {
        let key = 2 * c + half;
        let valid = key < count && attends(t, first + key, span, window) && active;
        let p = select(valid, (scores[s_at + key] * scale - row_lse).exp(), 0.0f32);
        let ds = select(valid, p * (scores[dp_at + key] - row_delta), 0.0f32);
        weights[w_at + key] = F::cast_from(ds);
    }
}

/// `dQ += ds K` over the first `subtiles` 16-key sub-tiles: `ds` rows at `ds_region` of
/// `weights`, K rows at element `k_at` of `staged`.
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn accumulate_dq<F: Float, N: Size>(
    weights: &SharedMemory<F>,
    ds_region: usize,
    staged: &SharedMemory<Vector<F, N>>,
    k_at: usize,
    dq: &Sequence<Matrix<f32>>,
    subtiles: usize,
    #[comptime] d_k: usize,
    #[comptime] key_tile: usize,
) {
    let ks = comptime!(storage_stride(d_k));
    let pst = comptime!(storage_stride(key_tile));
    #[unroll]
    for kk in 0..key_tile / TILE {
        if kk < subtiles {
            let ds = storage_fragment::<F>(weights, ds_region + kk * TILE, MatrixLayout::RowMajor, pst);
            #[unroll]
            for n in 0..d_k / TILE {
                let kb = tile_fragment::<F, N>(
                    staged,
                    k_at + kk * TILE * ks + n * TILE,
                    MatrixIdent::B,
                    MatrixLayout::RowMajor,
                    ks,
                );
                cmma::execute::<F, F, f32, f32>(&ds, &kb, dq.index(n), dq.index(n));
            }
        }
    }
}
