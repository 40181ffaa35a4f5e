//! dQ of a selection on tensor cores, one query per plane: the planes of
//! [`super::mma_select`] (same tiles, same 16-byte staging of each step's K and V rows in the
//! plane's shared tile) computing what [`super::mma_dq`] computes for a window.
//!
//! A plane's q and dO rows are A fragments held for the whole walk and its dQ is accumulator
//! fragments (a backward has no rescaling). Per step: `s = q K^T` and `dp = dO V^T` go to f32
//! tiles in shared memory; two units per row turn them into `ds = p (dp - delta)` with
//! `p = exp(s scale - lse)` (masked, rounded to the storage type); then `dQ += ds K`.

use cubecl::prelude::*;

use super::mma_dq::{accumulate_dq, ds_weights, half_row_delta, score_and_dp_tiles, store_dq_rows};
use super::mma_forward::{tile_row_fragments, zero_accumulators, ALIGN, TILE, VECTOR};
use super::mma_select::SelectPlane;
use super::rows::{block_range, offset3};
use crate::tiling::{f32_stride, storage_stride};

/// Inputs as the plain query kernel for a selection (`q`, `k`, `v`, `out`, `grad_out` as
/// vectors of [`VECTOR`]); writes `grad_q` and `delta = dO . O` (for the key pass). Cube
/// `(32, planes)` units; dims as [`super::mma_select::selection_forward_mma`].
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn selection_backward_query_mma<F: Float, I: Int, N: Size>(
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
    #[comptime] d_k: usize,
    #[comptime] d_v: usize,
    #[comptime] planes: usize,
    #[comptime] key_tile: usize,
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    let plane = SelectPlane::new::<Vector<F, N>>(q, k, planes);
    if !plane.exists {
        terminate!();
    }
    let span = span as usize;
    let (b, hk, t, h, local, half) = (plane.b, plane.hk, plane.t, plane.h, plane.local, plane.half);
    let p_index = UNIT_POS_Y as usize;

    // This row's statistics: lse from the forward, delta = dO . O (two units, alternate
    // vectors each).
    let row_lse = lse[offset3::<f32>(lse, b, t, h)];
    let partial_delta = half_row_delta::<F, N>(out, grad_out, b, t, h, half, d_v);
    let row_delta = partial_delta + plane_shuffle_xor(partial_delta, 1u32);
    if plane.active && half == 0usize {
        delta[offset3::<f32>(delta, b, t, h)] = row_delta;
    }

    // Per plane: `key_tile` K rows then `key_tile` V rows; the q and dO rows first, while
    // their fragments load.
    let ks = comptime!(storage_stride(d_k));
    let vs = comptime!(storage_stride(d_v));
    let stage_len = comptime!(key_tile * (ks + vs));
    let mut staged = SharedMemory::<Vector<F, N>>::new_aligned(comptime!(planes * stage_len / VECTOR), ALIGN);
    let k_at = p_index * stage_len;
    let v_at = k_at + comptime!(key_tile * ks);
    plane.stage_query_rows::<F, N>(q, &mut staged, k_at, d_k, ks);
    plane.stage_query_rows::<F, N>(grad_out, &mut staged, v_at, d_v, vs);
    sync_plane();
    let q_frags = tile_row_fragments::<F, N>(&staged, k_at, d_k, ks);
    let do_frags = tile_row_fragments::<F, N>(&staged, v_at, d_v, vs);
    sync_plane();

    let dq = zero_accumulators(d_k);

    // Per plane: f32 `s` and `dp` tiles `[16, key_tile]`, and `ds` in the storage type.
    let sst = comptime!(f32_stride(key_tile));
    let pst = comptime!(storage_stride(key_tile));
    let region_len = comptime!(TILE * sst);
    let mut scores = SharedMemory::<f32>::new_aligned(comptime!(2 * planes * region_len), ALIGN);
    let mut weights = SharedMemory::<F>::new_aligned(comptime!(planes * TILE * pst), ALIGN);
    let s_region = p_index * 2 * region_len;
    let dp_region = s_region + region_len;
    let ds_region = p_index * TILE * pst;

    let slots = offset3::<I>(blocks, b, t, hk);
    for r in 0..blocks.shape(3) {
        let (start, end) = block_range::<I>(blocks, slots, r, t, span);
        let mut first = start;
        while first < end {
            let count = min(end - first, key_tile);
            let subtiles = count.div_ceil(TILE);
            plane.stage_key_rows::<F, N>(k, &mut staged, k_at, first, count, key_tile, d_k, ks);
            plane.stage_key_rows::<F, N>(v, &mut staged, v_at, first, count, key_tile, d_v, vs);
            sync_plane();

            score_and_dp_tiles::<F, N>(&staged, k_at, v_at, &q_frags, &do_frags, &mut scores, s_region, dp_region, subtiles, d_k, d_v, key_tile);
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
                plane.active,
                half,
                false,
                key_tile,
            );
            sync_plane();
            accumulate_dq::<F, N>(&weights, ds_region, &staged, k_at, &dq, subtiles, d_k, key_tile);
            // The next step overwrites the tiles.
            sync_plane();
            first += count;
        }
    }

    store_dq_rows::<F>(&dq, &mut scores, s_region, grad_q, b, t, h, local, half, plane.active, scale, d_k);
}
