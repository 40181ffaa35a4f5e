//! `delta = dO . O` per query row, for the backward passes that do not compute it on their way.

use cubecl::prelude::*;

use crate::kernel::primitives::layout::VECTOR;
use crate::kernel::primitives::rows::offset3;

/// `delta = dO . O` per query row `(b, t, h)`, for the key cubes that fold dQ (without them
/// the query-side dQ kernel writes it on its way). A cube of `(d_v / VECTOR, rows)` units: unit
/// `(x, y)` multiplies 16-byte vector `x` of row `y` (so a plane's loads are consecutive), the
/// row's partial sums meet in shared memory and its first unit adds them.
///
/// With `zero_d_k > 0` it also zeroes the row's `zero_d_k` columns of `grad_q_sum` (contiguous
/// `[B, T, H_q, zero_d_k]` f32), the buffer the folding kernels then add dQ to by atomics: one
/// launch fewer than a fill of its own.
#[cube(launch)]
pub fn row_delta<F: Float, N: Size>(
    out: &Tensor<Vector<F, N>>,
    grad_out: &Tensor<Vector<F, N>>,
    delta: &mut Tensor<f32>,
    grad_q_sum: &mut Tensor<f32>,
    #[comptime] d_v: usize,
    #[comptime] rows: usize,
    #[comptime] zero_d_k: usize,
    #[define(F)] _dtype: StorageType,
) {
    let per_row = comptime!(d_v / VECTOR);
    let mut partials = SharedMemory::<f32>::new(comptime!(rows * per_row));
    let (t_len, h_q) = (delta.shape(1), delta.shape(2));
    let (c, y) = (UNIT_POS_X as usize, UNIT_POS_Y as usize);
    let row = CUBE_POS * rows + y;
    let exists = row < delta.shape(0) * t_len * h_q;
    let (b, t, h) = (row / (t_len * h_q), (row / h_q) % t_len, row % h_q);
    let mut sum = 0.0f32;
    if exists {
        let (o, d_o) = (
            out[offset3::<Vector<F, N>>(out, b, t, h) / VECTOR + c],
            grad_out[offset3::<Vector<F, N>>(grad_out, b, t, h) / VECTOR + c],
        );
        #[unroll]
        for e in 0..VECTOR {
            sum += f32::cast_from(d_o[e]) * f32::cast_from(o[e]);
        }
    }
    partials[y * per_row + c] = sum;
    sync_cube();
    if exists && c == 0 {
        let mut total = 0.0f32;
        #[unroll]
        for i in 0..per_row {
            total += partials[y * per_row + i];
        }
        delta[offset3::<f32>(delta, b, t, h)] = total;
    }
    if comptime!(zero_d_k > 0) && exists {
        #[unroll]
        for i in 0..zero_d_k.div_ceil(per_row) {
            let column = c + i * per_row;
            if column < zero_d_k {
                grad_q_sum[row * zero_d_k + column] = 0.0f32;
            }
        }
    }
}
