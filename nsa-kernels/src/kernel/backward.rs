//! Backward, flash-attention style: probabilities are recomputed from the saved log-sum-exp,
//! `p = exp(q.k * scale - lse)`, and with `delta = dO . O` per row:
//! `dv_s = sum_t p dO_t`, `ds = p (dO_t . v_s - delta_t)`, `dq_t = scale sum_s ds k_s`,
//! `dk_s = scale sum_t ds q_t`.
//!
//! `dq` runs per query row over the same key ranges as the forward. `dk`/`dv` run per key row
//! over the queries that attend it: the window's are the contiguous `[s, s + w)`; a selected
//! block's come from the inverted block index of [`super::inverse`], so no unit scans queries
//! that did not pick its block.

use cubecl::prelude::*;

use super::rows::{add_scaled, dot, key_range, load_row, offset3, range_count, store_row, zeros};

/// Per query row: `dq` and `delta = dO . O` (written for the key pass).
#[cube(launch)]
pub fn attention_backward_query<F: Float, I: Int>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    v: &Tensor<F>,
    blocks: &Tensor<I>,
    out: &Tensor<F>,
    grad_out: &Tensor<F>,
    lse: &Tensor<f32>,
    delta: &mut Tensor<f32>,
    grad_q: &mut Tensor<F>,
    scale: f32,
    span: u32,
    #[comptime] window: bool,
    #[comptime] d_k: usize,
    #[comptime] d_v: usize,
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    let (t_len, h_q, h_kv) = (q.shape(1), q.shape(2), k.shape(2));
    let row = ABSOLUTE_POS;
    if row >= q.shape(0) * t_len * h_q {
        terminate!();
    }
    let h = row % h_q;
    let t = (row / h_q) % t_len;
    let b = row / (h_q * t_len);
    let hk = h / (h_q / h_kv);

    let q_row = load_row::<F>(q, offset3::<F>(q, b, t, h), scale, d_k);
    let do_row = load_row::<F>(grad_out, offset3::<F>(grad_out, b, t, h), 1.0f32, d_v);
    let row_delta = dot::<F>(&do_row, out, offset3::<F>(out, b, t, h), d_v);
    let stat = b * lse.stride(0) + t * lse.stride(1) + h * lse.stride(2);
    let row_lse = lse[stat];
    delta[stat] = row_delta;

    let mut acc = zeros(d_k);
    let mut slots = 0usize;
    if !window {
        slots = offset3::<I>(blocks, b, t, hk);
    }
    for r in 0..range_count::<I>(blocks, window) {
        let (start, end) = key_range::<I>(blocks, slots, r, t, span as usize, window);
        for s in start..end {
            let p = (dot::<F>(&q_row, k, offset3::<F>(k, b, s, hk), d_k) - row_lse).exp();
            let ds = p * (dot::<F>(&do_row, v, offset3::<F>(v, b, s, hk), d_v) - row_delta);
            add_scaled::<F>(&mut acc, ds, k, offset3::<F>(k, b, s, hk), d_k);
        }
    }
    store_row::<F>(grad_q, offset3::<F>(grad_q, b, t, h), &acc, scale, d_k);
}

/// Adds query `t`'s contribution (all `g` heads of KV head `hk`) to key `s`'s `dk`, `dv`.
#[cube]
#[allow(clippy::too_many_arguments)]
fn accumulate_query<F: Float>(
    q: &Tensor<F>,
    grad_out: &Tensor<F>,
    lse: &Tensor<f32>,
    delta: &Tensor<f32>,
    k_row: &Array<f32>,
    v_row: &Array<f32>,
    dk: &mut Array<f32>,
    dv: &mut Array<f32>,
    b: usize,
    t: usize,
    hk: usize,
    g: usize,
    #[comptime] d_k: usize,
    #[comptime] d_v: usize,
) {
    for h in hk * g..(hk + 1) * g {
        let q_at = offset3::<F>(q, b, t, h);
        let do_at = offset3::<F>(grad_out, b, t, h);
        let stat = b * lse.stride(0) + t * lse.stride(1) + h * lse.stride(2);
        // k_row carries the softmax scale, so this is the forward's scaled score.
        let p = (dot::<F>(k_row, q, q_at, d_k) - lse[stat]).exp();
        let ds = p * (dot::<F>(v_row, grad_out, do_at, d_v) - delta[stat]);
        add_scaled::<F>(dv, p, grad_out, do_at, d_v);
        add_scaled::<F>(dk, ds, q, q_at, d_k);
    }
}

/// Per key row `(b, s, hk)`: `dk` and `dv` summed over the queries (and heads) that attend it.
/// For a selection, `offsets`/`counts` `[B, H_kv, n_blocks]` and `entries [B, H_kv, T * n]`
/// list the queries that picked each block.
#[cube(launch)]
pub fn attention_backward_key<F: Float>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    v: &Tensor<F>,
    grad_out: &Tensor<F>,
    lse: &Tensor<f32>,
    delta: &Tensor<f32>,
    offsets: &Tensor<u32>,
    counts: &Tensor<u32>,
    entries: &Tensor<u32>,
    grad_k: &mut Tensor<F>,
    grad_v: &mut Tensor<F>,
    scale: f32,
    span: u32,
    #[comptime] window: bool,
    #[comptime] d_k: usize,
    #[comptime] d_v: usize,
    #[define(F)] _dtype: StorageType,
) {
    let (t_len, h_q, h_kv) = (q.shape(1), q.shape(2), k.shape(2));
    let row = ABSOLUTE_POS;
    if row >= k.shape(0) * t_len * h_kv {
        terminate!();
    }
    let hk = row % h_kv;
    let s = (row / h_kv) % t_len;
    let b = row / (h_kv * t_len);
    let g = h_q / h_kv;
    let span = span as usize;

    let k_row = load_row::<F>(k, offset3::<F>(k, b, s, hk), scale, d_k);
    let v_row = load_row::<F>(v, offset3::<F>(v, b, s, hk), 1.0f32, d_v);
    let mut dk = zeros(d_k);
    let mut dv = zeros(d_v);
    if window {
        let mut end = s + span;
        if end > t_len {
            end = t_len;
        }
        for t in s..end {
            accumulate_query::<F>(q, grad_out, lse, delta, &k_row, &v_row, &mut dk, &mut dv, b, t, hk, g, d_k, d_v);
        }
    } else {
        let list = (b * h_kv + hk) * offsets.shape(2) + s / span;
        let first = offsets[list] as usize;
        let base = (b * h_kv + hk) * entries.shape(2);
        for e in first..first + counts[list] as usize {
            let t = entries[base + e] as usize;
            // The block is whole for later queries, clamped for the query inside it.
            if t >= s {
                accumulate_query::<F>(q, grad_out, lse, delta, &k_row, &v_row, &mut dk, &mut dv, b, t, hk, g, d_k, d_v);
            }
        }
    }
    store_row::<F>(grad_k, offset3::<F>(grad_k, b, s, hk), &dk, scale, d_k);
    store_row::<F>(grad_v, offset3::<F>(grad_v, b, s, hk), &dv, 1.0f32, d_v);
}
