//! The second pass of the key-major selection forward: each row's per-block partial results
//! merged into its output and log-sum-exp.

use cubecl::prelude::*;

use crate::kernel::primitives::layout::MASKED;
use crate::kernel::primitives::rows::NEG_LARGE;

/// `part_out [B, T, H_q, n * d_v]`, `part_lse [B, T, H_q, n]` and `blocks [B, T, H_kv, n]` ->
/// `out [B, T, H_q, d_v]`, `lse [B, T, H_q]`: each row's slots combined with weights
/// `exp(lse_i - lse)`. Slots whose block is unused (negative) or wholly after the query
/// (`lse_i` masked) weigh nothing; a row with none gets zeros and `NEG_LARGE`. One unit per
/// vector of `vector` output elements; all tensors but `blocks` contiguous.
#[cube(launch)]
pub fn merge_selection_partials<F: Float, I: Int, N: Size>(
    part_out: &Tensor<Vector<F, N>>,
    part_lse: &Tensor<f32>,
    blocks: &Tensor<I>,
    out: &mut Tensor<Vector<F, N>>,
    lse: &mut Tensor<f32>,
    #[comptime] d_v: usize,
    #[comptime] vector: usize,
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    let per_row = comptime!(d_v / vector);
    let (t_len, h_q, n) = (part_lse.shape(1), part_lse.shape(2), part_lse.shape(3));
    let rows = part_lse.shape(0) * t_len * h_q;
    let pos = ABSOLUTE_POS;
    if pos >= rows * per_row {
        terminate!();
    }
    let (row, c) = (pos / per_row, pos % per_row);
    let h = row % h_q;
    let t = (row / h_q) % t_len;
    let b = row / (h_q * t_len);
    let hk = h / (h_q / blocks.shape(2));
    let listed = b * blocks.stride(0) + t * blocks.stride(1) + hk * blocks.stride(2);

    // One pass, online (flash attention's rescaling): each used slot's weight against the
    // running maximum, the sum and the output rescaled when the maximum grows.
    let mut row_max = f32::new(NEG_LARGE);
    let mut sum = 0.0f32;
    let mut acc = Vector::<f32, N>::new(0.0f32);
    for i in 0..n {
        let block_lse = part_lse[row * n + i];
        if i32::cast_from(blocks[listed + i * blocks.stride(3)]) >= 0 && block_lse > MASKED {
            let new_max = max(row_max, block_lse);
            let rescale = (row_max - new_max).exp();
            let weight = (block_lse - new_max).exp();
            let part = Vector::<f32, N>::cast_from(part_out[(row * n + i) * per_row + c]);
            acc = acc * Vector::<f32, N>::new(rescale) + part * Vector::<f32, N>::new(weight);
            sum = sum * rescale + weight;
            row_max = new_max;
        }
    }
    let mut row_lse = f32::new(NEG_LARGE);
    if sum > 0.0f32 {
        row_lse = row_max + sum.ln();
        acc = acc * Vector::<f32, N>::new(1.0f32 / sum);
    }
    out[row * per_row + c] = Vector::<F, N>::cast_from(acc);
    if c == 0 {
        lse[row] = row_lse;
    }
}
