//! A selection's dK/dV: the sum of each block's segment shares, in segment order.

use cubecl::prelude::*;

use crate::kernel::primitives::key_cube::segment_row;
use crate::kernel::primitives::rows::offset3;

/// Selection only: `dk`, `dv` of each key as the sum of its block's segment shares in
/// `partial [B * H_kv, max_segments, l_sel * (d_k + d_v)]`, in segment order (deterministic).
/// One unit per `vector` consecutive elements of a key's `d_k + d_v`: 16-byte reads of each
/// share where `d_k` and `d_v` are multiples of 4 ([`sum_segments_vector`]), so a vector never
/// straddles dK and dV.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn sum_segments<F: Float, N: Size>(
    partial: &Tensor<Vector<f32, N>>,
    counts: &Tensor<u32>,
    segment_base: &Tensor<u32>,
    grad_k: &mut Tensor<F>,
    grad_v: &mut Tensor<F>,
    span: u32,
    segment: u32,
    #[comptime] d_k: usize,
    #[comptime] d_v: usize,
    #[comptime] vector: usize,
    #[define(F)] _dtype: StorageType,
) {
    let (t_len, h_kv) = (grad_k.shape(1), grad_k.shape(2));
    let width = comptime!((d_k + d_v) / vector);
    let pos = ABSOLUTE_POS;
    if pos >= grad_k.shape(0) * t_len * h_kv * width {
        terminate!();
    }
    let part = pos % width;
    let hk = (pos / width) % h_kv;
    let s = (pos / (width * h_kv)) % t_len;
    let b = pos / (width * h_kv * t_len);
    let span = span as usize;
    let j = s / span;
    let list = offset3::<u32>(counts, b, hk, j);
    let first = segment_base[list] as usize;
    let n = counts[list].div_ceil(segment) as usize;
    let max_segments = partial.shape(1);
    let mut sum = Vector::<f32, N>::new(0.0f32);
    for item in first..first + n {
        sum += partial[segment_row(b, hk, h_kv, max_segments, item, s - j * span, span) * width + part];
    }
    let e = part * vector;
    if e < d_k {
        let at = offset3::<F>(grad_k, b, s, hk) + e;
        #[unroll]
        for i in 0..vector {
            grad_k[at + i] = F::cast_from(sum[i]);
        }
    } else {
        let at = offset3::<F>(grad_v, b, s, hk) + e - d_k;
        #[unroll]
        for i in 0..vector {
            grad_v[at + i] = F::cast_from(sum[i]);
        }
    }
}

/// [`sum_segments`]' vector width: 4 f32 (16 bytes) where both head dims are multiples of 4,
/// else 1.
pub fn sum_segments_vector(d_k: usize, d_v: usize) -> usize {
    if d_k % 4 == 0 && d_v % 4 == 0 {
        4
    } else {
        1
    }
}
