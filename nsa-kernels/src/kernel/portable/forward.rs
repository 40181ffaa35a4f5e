//! Forward: a cube computes the output and log-sum-exp of its query rows with an online softmax
//! (flash attention's recurrence), walking their keys in chunks staged in shared memory.
//!
//! A window cube holds consecutive queries (all `g` heads of one KV head each): their windows
//! overlap, so one staged chunk serves every row and each row masks the keys outside its own
//! window. A selection cube holds one query's `g` heads and walks its selected blocks; with few
//! rows it splits each row over more units instead (see [`crate::sparse::tiling`]).

use cubecl::prelude::*;

use crate::kernel::primitives::layout::MASKED;
use crate::kernel::primitives::query_cube::QueryCube;
use crate::kernel::primitives::rows::{
    add_shared, chunk_dots, document_start_if, load_slice, offset3, store_row_result, zero_slice, NEG_LARGE,
};
use crate::kernel::primitives::staging::stage_rows;

/// `q [B, T, H_q, d_k]`, `k [B, T, H_kv, d_k]`, `v [B, T, H_kv, d_v]`, `blocks [B, T, H_kv, n]`
/// (ignored for a window) -> `out [B, T, H_q, d_v]`, `lse [B, T, H_q]` (f32). With `documents` nonzero,
/// a window row attends no key before its document's start in `starts [B, T]`.
/// `span` is the window `w` or the block size `l_sel`; inputs' last axes are contiguous.
/// Cube `rows * parts` units; one cube per `(b, hk, query tile)`.
#[cube(launch)]
pub fn attention_forward<F: Float, I: Int>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    v: &Tensor<F>,
    blocks: &Tensor<I>,
    starts: &Tensor<I>,
    out: &mut Tensor<F>,
    lse: &mut Tensor<f32>,
    scale: f32,
    span: u32,
    #[comptime] window: bool,
    documents: u32,
    #[comptime] d_k: usize,
    #[comptime] d_v: usize,
    #[comptime] parts: usize,
    #[comptime] rows: usize,
    #[comptime] chunk: usize,
    #[comptime] unroll: bool,
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    let cube = QueryCube::new::<F>(q, k, rows, parts);
    if !cube.exists {
        terminate!();
    }
    let (b, hk, t, h, part, row) = (cube.b, cube.hk, cube.t, cube.h, cube.part, cube.row);
    let span = span as usize;
    // The first key of this row's document, and of the tile's first row's (the earliest).
    let row_start = document_start_if::<I>(starts, b, t, documents);
    let tile_start = document_start_if::<I>(starts, b, cube.t0, documents);

    let q_slice = load_slice::<F>(q, offset3::<F>(q, b, t, h), part, scale, d_k, parts, unroll);
    let mut acc = zero_slice(d_v, parts, unroll);
    let mut row_max = f32::new(NEG_LARGE);
    let mut sum = 0.0f32;

    let mut k_tile = SharedMemory::<f32>::new(chunk * d_k);
    let mut v_tile = SharedMemory::<f32>::new(chunk * d_v);
    let mut partials = SharedMemory::<f32>::new(comptime!(if parts > 1 { rows * chunk * parts } else { 1usize }));
    let mut totals = SharedMemory::<f32>::new(comptime!(if parts > 1 { rows * chunk } else { 1usize }));

    for r in 0..cube.range_count::<I>(blocks, window) {
        let (start, end) = cube.key_range::<I>(blocks, r, span, window);
        let mut first = max(start, tile_start);
        while first < end {
            let count = min(end - first, chunk);
            stage_rows::<F, f32>(k, &mut k_tile, 0usize, b, first, count, hk, chunk, d_k, d_k);
            stage_rows::<F, f32>(v, &mut v_tile, 0usize, b, first, count, hk, chunk, d_v, d_v);
            sync_cube();

            let mut scores =
                chunk_dots(&q_slice, &k_tile, &mut partials, &mut totals, row, part, d_k, chunk, parts, unroll);

            let mut chunk_max = f32::new(NEG_LARGE);
            #[unroll(unroll)]
            for key in 0..chunk {
                let valid = key < count && cube.attends(first + key, span, window) && first + key >= row_start;
                scores[key] = select(valid, scores[key], f32::new(NEG_LARGE));
                chunk_max = max(chunk_max, scores[key]);
            }
            if chunk_max > row_max {
                // Rescale what was accumulated under the old maximum.
                let correction = (row_max - chunk_max).exp();
                sum *= correction;
                #[unroll(unroll)]
                for i in 0..d_v / parts {
                    acc[i] *= correction;
                }
                row_max = chunk_max;
            }
            #[unroll(unroll)]
            for key in 0..chunk {
                if scores[key] > MASKED {
                    let p = (scores[key] - row_max).exp();
                    sum += p;
                    add_shared(&mut acc, p, &v_tile, key * d_v, part, d_v, parts, unroll);
                }
            }
            sync_cube();
            first += count;
        }
    }

    if cube.active {
        store_row_result::<F>(out, lse, b, t, h, part, &acc, row_max, sum, d_v, parts, unroll);
    }
}
