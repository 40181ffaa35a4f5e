//! Backward, flash-attention style: probabilities are recomputed from the saved log-sum-exp,
//! `p = exp(q.k * scale - lse)`, and with `delta = dO . O` per row:
//! `dv_s = sum_t p dO_t`, `ds = p (dO_t . v_s - delta_t)`, `dq_t = scale sum_s ds k_s`,
//! `dk_s = scale sum_t ds q_t`.
//!
//! `dq` runs on query cubes over the same staged key chunks as the forward. `dk`/`dv` run on key
//! cubes (consecutive keys of one KV head) over staged chunks of the query rows that attend
//! them: the window's are the contiguous `[s0, s_end - 1 + w)`; a selected block's come from the
//! inverted block index of [`crate::kernel::selection::index`], so no cube scans queries that did not pick its
//! block.

use cubecl::prelude::*;

use crate::kernel::primitives::key_cube::{BlockLists, KeyCube};
use crate::kernel::primitives::query_cube::QueryCube;
use crate::kernel::primitives::rows::{
    add_shared, attends, chunk_dots, document_end_if, document_start_if, dot_shared, dot_slices, load_slice, offset3,
    store_slice, zero_slice,
};
use crate::kernel::primitives::staging::{stage_listed_rows, stage_rows};

/// Query cubes: `dq` and `delta = dO . O` (written for the key pass). Tiled as the forward.
#[cube(launch)]
pub fn attention_backward_query<F: Float, I: Int>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    v: &Tensor<F>,
    blocks: &Tensor<I>,
    starts: &Tensor<I>,
    out: &Tensor<F>,
    grad_out: &Tensor<F>,
    lse: &Tensor<f32>,
    delta: &mut Tensor<f32>,
    grad_q: &mut Tensor<F>,
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
    let row_start = document_start_if::<I>(starts, b, t, documents);
    let tile_start = document_start_if::<I>(starts, b, cube.t0, documents);

    let q_slice = load_slice::<F>(q, offset3::<F>(q, b, t, h), part, scale, d_k, parts, unroll);
    let do_slice = load_slice::<F>(grad_out, offset3::<F>(grad_out, b, t, h), part, 1.0f32, d_v, parts, unroll);
    let o_slice = load_slice::<F>(out, offset3::<F>(out, b, t, h), part, 1.0f32, d_v, parts, unroll);
    let mut row_parts = SharedMemory::<f32>::new(rows * parts);
    row_parts[row * parts + part] = dot_slices(&do_slice, &o_slice, d_v, parts, unroll);
    sync_cube();
    let mut row_delta = 0.0f32;
    #[unroll(unroll)]
    for p in 0..parts {
        row_delta += row_parts[row * parts + p];
    }
    let stat = offset3::<f32>(lse, b, t, h);
    let row_lse = lse[stat];
    if cube.active && part == 0usize {
        delta[offset3::<f32>(delta, b, t, h)] = row_delta;
    }

    let mut acc = zero_slice(d_k, parts, unroll);
    let mut k_tile = SharedMemory::<f32>::new(chunk * d_k);
    let mut v_tile = SharedMemory::<f32>::new(chunk * d_v);
    let mut score_partials = SharedMemory::<f32>::new(comptime!(if parts > 1 { rows * chunk * parts } else { 1usize }));
    let mut score_totals = SharedMemory::<f32>::new(comptime!(if parts > 1 { rows * chunk } else { 1usize }));
    let mut dp_partials = SharedMemory::<f32>::new(comptime!(if parts > 1 { rows * chunk * parts } else { 1usize }));
    let mut dp_totals = SharedMemory::<f32>::new(comptime!(if parts > 1 { rows * chunk } else { 1usize }));

    for r in 0..cube.range_count::<I>(blocks, window) {
        let (start, end) = cube.key_range::<I>(blocks, r, span, window);
        let mut first = max(start, tile_start);
        while first < end {
            let count = min(end - first, chunk);
            stage_rows::<F, f32>(k, &mut k_tile, 0usize, b, first, count, hk, chunk, d_k, d_k);
            stage_rows::<F, f32>(v, &mut v_tile, 0usize, b, first, count, hk, chunk, d_v, d_v);
            sync_cube();

            let scores = chunk_dots(
                &q_slice,
                &k_tile,
                &mut score_partials,
                &mut score_totals,
                row,
                part,
                d_k,
                chunk,
                parts,
                unroll,
            );
            let dps =
                chunk_dots(&do_slice, &v_tile, &mut dp_partials, &mut dp_totals, row, part, d_v, chunk, parts, unroll);

            #[unroll(unroll)]
            for key in 0..chunk {
                if key < count && cube.attends(first + key, span, window) && first + key >= row_start {
                    let p = (scores[key] - row_lse).exp();
                    let ds = p * (dps[key] - row_delta);
                    add_shared(&mut acc, ds, &k_tile, key * d_k, part, d_k, parts, unroll);
                }
            }
            sync_cube();
            first += count;
        }
    }
    if cube.active {
        store_slice::<F>(grad_q, offset3::<F>(grad_q, b, t, h), part, &acc, scale, d_k, parts, unroll);
    }
}

/// Key cubes: `dk` and `dv` of `keys` consecutive key rows of one KV head, summed over the
/// query rows (every head of the group) that attend them. For a selection a cube covers (part
/// of) one block, whose list in `lists` ([`BlockLists`]) holds the queries that picked it.
/// Cube `keys * parts` units. With `documents` nonzero, a walked row `t` skips keys before its
/// document's start in `starts [B, T]`.
#[cube(launch)]
pub fn attention_backward_key<F: Float, I: Int>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    v: &Tensor<F>,
    grad_out: &Tensor<F>,
    lse: &Tensor<f32>,
    delta: &Tensor<f32>,
    lists: &BlockLists,
    starts: &Tensor<I>,
    grad_k: &mut Tensor<F>,
    grad_v: &mut Tensor<F>,
    partial: &mut Tensor<f32>,
    scale: f32,
    span: u32,
    segment: u32,
    #[comptime] window: bool,
    documents: u32,
    #[comptime] d_k: usize,
    #[comptime] d_v: usize,
    #[comptime] parts: usize,
    #[comptime] keys: usize,
    #[comptime] chunk: usize,
    #[comptime] unroll: bool,
    #[comptime] g: usize,
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    let span = span as usize;
    let cube = KeyCube::new::<F>(q, k, lists, span, segment as usize, window, keys, g);
    if !cube.exists {
        terminate!();
    }
    let (b, hk, s0, s_end) = (cube.b, cube.hk, cube.s0, cube.s_end);
    let mut n_rows = cube.n_rows;
    if window {
        n_rows = cube.window_rows_before(document_end_if::<I>(starts, b, s_end - 1, q.shape(1), documents));
    }
    let unit = UNIT_POS as usize;
    let part = unit % parts;
    let s = s0 + unit / parts;
    let key_active = s < s_end;
    let s_row = min(s, s_end - 1);

    let k_slice = load_slice::<F>(k, offset3::<F>(k, b, s_row, hk), part, scale, d_k, parts, unroll);
    let v_slice = load_slice::<F>(v, offset3::<F>(v, b, s_row, hk), part, 1.0f32, d_v, parts, unroll);
    let mut dk = zero_slice(d_k, parts, unroll);
    let mut dv = zero_slice(d_v, parts, unroll);

    let mut q_tile = SharedMemory::<f32>::new(chunk * d_k);
    let mut do_tile = SharedMemory::<f32>::new(chunk * d_v);
    let mut lse_tile = SharedMemory::<f32>::new(chunk);
    let mut delta_tile = SharedMemory::<f32>::new(chunk);
    let mut t_tile = SharedMemory::<u32>::new(chunk);
    let mut start_tile = SharedMemory::<u32>::new(chunk);
    let mut score_partials = SharedMemory::<f32>::new(comptime!(if parts > 1 { keys * chunk * parts } else { 1usize }));
    let mut dp_partials = SharedMemory::<f32>::new(comptime!(if parts > 1 { keys * chunk * parts } else { 1usize }));
    let key_row = unit / parts;

    let mut row_first = 0usize;
    while row_first < n_rows {
        let count = min(n_rows - row_first, chunk);
        // Stage the chunk's rows: query position, q, dO and their statistics.
        let mut i = UNIT_POS as usize;
        while i < chunk {
            let mut t = 0usize;
            let mut start = 0usize;
            let mut stat_lse = 0.0f32;
            let mut stat_delta = 0.0f32;
            if i < count {
                let at = row_first + i;
                t = cube.query_of(&lists.entries, at, window);
                let h = cube.head_of(at);
                start = document_start_if::<I>(starts, b, t, documents);
                stat_lse = lse[offset3::<f32>(lse, b, t, h)];
                stat_delta = delta[offset3::<f32>(delta, b, t, h)];
            }
            t_tile[i] = t as u32;
            start_tile[i] = start as u32;
            lse_tile[i] = stat_lse;
            delta_tile[i] = stat_delta;
            i += CUBE_DIM as usize;
        }
        sync_cube();
        stage_listed_rows::<F, f32>(q, &mut q_tile, 0usize, &t_tile, b, hk, g, row_first, count, chunk, d_k, d_k);
        stage_listed_rows::<F, f32>(
            grad_out,
            &mut do_tile,
            0usize,
            &t_tile,
            b,
            hk,
            g,
            row_first,
            count,
            chunk,
            d_v,
            d_v,
        );
        sync_cube();

        let mut scores = Array::<f32>::new(chunk);
        let mut dps = Array::<f32>::new(chunk);
        if comptime!(parts == 1) {
            #[unroll(unroll)]
            for r in 0..chunk {
                scores[r] = dot_shared(&k_slice, &q_tile, r * d_k, 0usize, d_k, 1usize, unroll);
                dps[r] = dot_shared(&v_slice, &do_tile, r * d_v, 0usize, d_v, 1usize, unroll);
            }
        } else {
            #[unroll(unroll)]
            for r in 0..chunk {
                let at = (key_row * chunk + r) * parts + part;
                score_partials[at] = dot_shared(&k_slice, &q_tile, r * d_k, part, d_k, parts, unroll);
                dp_partials[at] = dot_shared(&v_slice, &do_tile, r * d_v, part, d_v, parts, unroll);
            }
            sync_cube();
            #[unroll(unroll)]
            for r in 0..chunk {
                let at = (key_row * chunk + r) * parts;
                let mut score = 0.0f32;
                let mut dp = 0.0f32;
                #[unroll(unroll)]
                for p in 0..parts {
                    score += score_partials[at + p];
                    dp += dp_partials[at + p];
                }
                scores[r] = score;
                dps[r] = dp;
            }
        }

        #[unroll(unroll)]
        for r in 0..chunk {
            let own = s >= start_tile[r] as usize;
            if r < count && key_active && own && attends(t_tile[r] as usize, s, span, window) {
                let p = (scores[r] - lse_tile[r]).exp();
                let ds = p * (dps[r] - delta_tile[r]);
                add_shared(&mut dv, p, &do_tile, r * d_v, part, d_v, parts, unroll);
                add_shared(&mut dk, ds, &q_tile, r * d_k, part, d_k, parts, unroll);
            }
        }
        sync_cube();
        row_first += count;
    }

    if key_active {
        if window {
            store_slice::<F>(grad_k, offset3::<F>(grad_k, b, s, hk), part, &dk, scale, d_k, parts, unroll);
            store_slice::<F>(grad_v, offset3::<F>(grad_v, b, s, hk), part, &dv, 1.0f32, d_v, parts, unroll);
        } else {
            // This segment's share; `sum_segments` adds a block's shares up.
            let row = cube.partial_row(lists.segment_block.shape(2), k.shape(2), s, span);
            let at = row * (d_k + d_v);
            store_slice::<f32>(partial, at, part, &dk, scale, d_k, parts, unroll);
            store_slice::<f32>(partial, at + d_k, part, &dv, 1.0f32, d_v, parts, unroll);
        }
    }
}
