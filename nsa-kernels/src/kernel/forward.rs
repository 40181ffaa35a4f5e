//! Forward: each unit computes one query row's output and log-sum-exp with an online softmax
//! over its key ranges (flash attention's recurrence, one key at a time).

use cubecl::prelude::*;

use super::rows::{add_scaled, dot, key_range, load_row, offset3, range_count, store_row, zeros, NEG_LARGE};

/// `q [B, T, H_q, d_k]`, `k [B, T, H_kv, d_k]`, `v [B, T, H_kv, d_v]`, `blocks [B, T, H_kv, n]`
/// (ignored for a window) -> `out [B, T, H_q, d_v]`, `lse [B, T, H_q]` (f32).
/// `span` is the window `w` or the block size `l_sel`. Rows are numbered `(b, t, h)` with `h`
/// fastest. Inputs' last axes are contiguous.
#[cube(launch)]
pub fn attention_forward<F: Float, I: Int>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    v: &Tensor<F>,
    blocks: &Tensor<I>,
    out: &mut Tensor<F>,
    lse: &mut Tensor<f32>,
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
    let mut acc = zeros(d_v);
    let mut max = f32::new(NEG_LARGE);
    let mut sum = 0.0f32;
    let mut slots = 0usize;
    if !window {
        slots = offset3::<I>(blocks, b, t, hk);
    }
    for r in 0..range_count::<I>(blocks, window) {
        let (start, end) = key_range::<I>(blocks, slots, r, t, span as usize, window);
        for s in start..end {
            let score = dot::<F>(&q_row, k, offset3::<F>(k, b, s, hk), d_k);
            if score > max {
                // Rescale what was accumulated under the old maximum.
                let correction = (max - score).exp();
                sum *= correction;
                #[unroll]
                for i in 0..d_v {
                    acc[i] *= correction;
                }
                max = score;
            }
            let p = (score - max).exp();
            sum += p;
            add_scaled::<F>(&mut acc, p, v, offset3::<F>(v, b, s, hk), d_v);
        }
    }

    let mut inv = 0.0f32;
    let mut row_lse = f32::new(NEG_LARGE);
    if sum > 0.0f32 {
        inv = 1.0f32 / sum;
        row_lse = max + sum.ln();
    }
    store_row::<F>(out, offset3::<F>(out, b, t, h), &acc, inv, d_v);
    lse[b * lse.stride(0) + t * lse.stride(1) + h * lse.stride(2)] = row_lse;
}
