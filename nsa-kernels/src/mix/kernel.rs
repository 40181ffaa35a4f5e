//! The gated mix `out = sum_i g_i o_i` over rows of `d` (one row per `(b, t, h)`; the gates
//! `[B, T, 3, H]`), in f32, each unit one vector of a row. All tensors contiguous.

use cubecl::prelude::*;

use crate::kernel::primitives::vectors::dot;

/// `out[b, t, h, :] = sum_i gates[b, t, i, h] o_i[b, t, h, :]`.
#[cube(launch)]
pub fn gated_mix<F: Float, N: Size>(
    o_0: &Tensor<Vector<F, N>>,
    o_1: &Tensor<Vector<F, N>>,
    o_2: &Tensor<Vector<F, N>>,
    gates: &Tensor<F>,
    out: &mut Tensor<Vector<F, N>>,
    #[comptime] vector: usize,
    #[define(F)] _dtype: StorageType,
) {
    let pos = ABSOLUTE_POS;
    if pos >= out.len() {
        terminate!();
    }
    let h_len = out.shape(2);
    let row = pos / (out.shape(3) / vector);
    let g = gate_offset(row, h_len);
    let mix = weighted::<F, N>(o_0[pos], gates[g])
        + weighted::<F, N>(o_1[pos], gates[g + h_len])
        + weighted::<F, N>(o_2[pos], gates[g + 2 * h_len]);
    out[pos] = Vector::cast_from(mix);
}

/// The branches' gradients `g_i grad` and the gates' `sum_c o_i[c] grad[c]`: a cube holds
/// `rows` rows of `per_row` units; a row's partial sums meet in shared memory.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn gated_mix_backward<F: Float, N: Size>(
    o_0: &Tensor<Vector<F, N>>,
    o_1: &Tensor<Vector<F, N>>,
    o_2: &Tensor<Vector<F, N>>,
    gates: &Tensor<F>,
    grad: &Tensor<Vector<F, N>>,
    d_0: &mut Tensor<Vector<F, N>>,
    d_1: &mut Tensor<Vector<F, N>>,
    d_2: &mut Tensor<Vector<F, N>>,
    d_gates: &mut Tensor<F>,
    #[comptime] vector: usize,
    #[comptime] per_row: usize,
    #[comptime] rows: usize,
    #[define(F)] _dtype: StorageType,
) {
    let mut partials = SharedMemory::<f32>::new(comptime!(3 * rows * per_row));
    let c = UNIT_POS_X as usize;
    let y = UNIT_POS_Y as usize;
    let h_len = grad.shape(2);
    let row = CUBE_POS * rows + y;
    let exists = row < grad.shape(0) * grad.shape(1) * h_len;
    let g = gate_offset(row, h_len);
    let slot = 3 * (y * per_row + c);
    let mut s_0 = 0.0f32;
    let mut s_1 = 0.0f32;
    let mut s_2 = 0.0f32;
    if exists {
        let pos = row * per_row + c;
        let d_o = grad[pos];
        d_0[pos] = Vector::cast_from(weighted::<F, N>(d_o, gates[g]));
        d_1[pos] = Vector::cast_from(weighted::<F, N>(d_o, gates[g + h_len]));
        d_2[pos] = Vector::cast_from(weighted::<F, N>(d_o, gates[g + 2 * h_len]));
        s_0 = dot::<F, N>(o_0[pos], d_o, vector);
        s_1 = dot::<F, N>(o_1[pos], d_o, vector);
        s_2 = dot::<F, N>(o_2[pos], d_o, vector);
    }
    partials[slot] = s_0;
    partials[slot + 1] = s_1;
    partials[slot + 2] = s_2;
    sync_cube();
    if exists && c == 0 {
        let first = 3 * y * per_row;
        let mut t_0 = 0.0f32;
        let mut t_1 = 0.0f32;
        let mut t_2 = 0.0f32;
        #[unroll]
        for j in 0..per_row {
            t_0 += partials[first + 3 * j];
            t_1 += partials[first + 3 * j + 1];
            t_2 += partials[first + 3 * j + 2];
        }
        d_gates[g] = F::cast_from(t_0);
        d_gates[g + h_len] = F::cast_from(t_1);
        d_gates[g + 2 * h_len] = F::cast_from(t_2);
    }
}

/// Where row `(b, t, h)`'s first gate sits in `[B, T, 3, H]`.
#[cube]
fn gate_offset(row: usize, h_len: usize) -> usize {
    (row / h_len) * 3 * h_len + row % h_len
}

/// `x * gate` in f32.
#[cube]
fn weighted<F: Float, N: Size>(x: Vector<F, N>, gate: F) -> Vector<f32, N> {
    Vector::<f32, N>::cast_from(x) * Vector::<f32, N>::new(f32::cast_from(gate))
}
