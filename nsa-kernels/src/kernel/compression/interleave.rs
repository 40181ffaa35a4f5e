//! The layout moves that turn the compressed branch into a causal attention
//! ([`crate::sparse::compressed::interleaved`]).
//!
//! Query `t >= first` (`first = l - 1`) sees the compressed blocks `0..=c` with
//! `c = (t - first) / stride`: the `stride` queries `t = first + c * stride + r` (`r < stride`)
//! share one key range. Offset `r` of every group is batch row `b * stride + r` of the
//! interleaved layout `[B * stride, G, H, d]`, at position `c`, so that position `c` attends keys
//! `0..=c` of its own batch row: a plain causal attention over the `G = N` compressed keys, which
//! the window kernels run. Positions past the sequence (the last group's tail) are `fill`.
//!
//! All four kernels take contiguous tensors indexed in vectors of `vector` elements (`vector`
//! divides `d`), one unit per vector of the destination.

use cubecl::prelude::*;

/// `src [B, T, H, d]` -> `dst [B * stride, G, H, d]`: `dst[b * stride + r, c] = src[b, first + c
/// * stride + r]`, `fill` where that position is past `T`.
#[cube(launch)]
pub fn interleave_rows<F: Float, N: Size>(
    src: &Tensor<Vector<F, N>>,
    dst: &mut Tensor<Vector<F, N>>,
    first: u32,
    stride: u32,
    fill: f32,
    #[comptime] vector: usize,
    #[define(F)] _dtype: StorageType,
) {
    let per_row = dst.shape(3) / vector;
    let (groups, heads) = (dst.shape(1), dst.shape(2));
    let pos = ABSOLUTE_POS;
    if pos >= dst.shape(0) * groups * heads * per_row {
        terminate!();
    }
    let e = pos % per_row;
    let row = pos / per_row;
    let h = row % heads;
    let c = (row / heads) % groups;
    let batch_row = row / (heads * groups);
    let stride = stride as usize;
    let (b, r) = (batch_row / stride, batch_row % stride);
    let t = first as usize + c * stride + r;
    let t_len = src.shape(1);
    let mut value = Vector::<F, N>::new(F::cast_from(fill));
    if t < t_len {
        value = src[((b * t_len + t) * heads + h) * per_row + e];
    }
    dst[pos] = value;
}

/// [`interleave_rows`]' inverse: `src [B * stride, G, H, d]` -> `dst [B, T, H, d]`, `fill` for
/// the positions before `first` (which see no block).
#[cube(launch)]
pub fn deinterleave_rows<F: Float, N: Size>(
    src: &Tensor<Vector<F, N>>,
    dst: &mut Tensor<Vector<F, N>>,
    first: u32,
    stride: u32,
    fill: f32,
    #[comptime] vector: usize,
    #[define(F)] _dtype: StorageType,
) {
    let per_row = dst.shape(3) / vector;
    let (t_len, heads) = (dst.shape(1), dst.shape(2));
    let pos = ABSOLUTE_POS;
    if pos >= dst.shape(0) * t_len * heads * per_row {
        terminate!();
    }
    let e = pos % per_row;
    let row = pos / per_row;
    let h = row % heads;
    let t = (row / heads) % t_len;
    let b = row / (heads * t_len);
    let (first, stride) = (first as usize, stride as usize);
    let mut value = Vector::<F, N>::new(F::cast_from(fill));
    if t >= first {
        let (c, r) = ((t - first) / stride, (t - first) % stride);
        value = src[(((b * stride + r) * src.shape(1) + c) * heads + h) * per_row + e];
    }
    dst[pos] = value;
}

/// `src [B, N, H, d]` -> `dst [B * copies, N, H, d]`: each batch row's keys once per offset.
#[cube(launch)]
pub fn repeat_batch_rows<F: Float, N: Size>(
    src: &Tensor<Vector<F, N>>,
    dst: &mut Tensor<Vector<F, N>>,
    copies: u32,
    #[comptime] vector: usize,
    #[define(F)] _dtype: StorageType,
) {
    let per_batch = dst.shape(1) * dst.shape(2) * dst.shape(3) / vector;
    let pos = ABSOLUTE_POS;
    if pos >= dst.shape(0) * per_batch {
        terminate!();
    }
    let (batch_row, at) = (pos / per_batch, pos % per_batch);
    dst[pos] = src[(batch_row / copies as usize) * per_batch + at];
}

/// [`repeat_batch_rows`]' gradient: `src [B * copies, N, H, d]` -> `dst [B, N, H, d]`, the
/// copies added in f32 in a fixed order (deterministic).
#[cube(launch)]
pub fn sum_batch_rows<F: Float, N: Size>(
    src: &Tensor<Vector<F, N>>,
    dst: &mut Tensor<Vector<F, N>>,
    copies: u32,
    #[comptime] vector: usize,
    #[define(F)] _dtype: StorageType,
) {
    let per_batch = dst.shape(1) * dst.shape(2) * dst.shape(3) / vector;
    let pos = ABSOLUTE_POS;
    if pos >= dst.shape(0) * per_batch {
        terminate!();
    }
    let (b, at) = (pos / per_batch, pos % per_batch);
    let copies = copies as usize;
    let mut sum = Vector::<f32, N>::new(0.0f32);
    for r in 0..copies {
        sum += Vector::<f32, N>::cast_from(src[(b * copies + r) * per_batch + at]);
    }
    dst[pos] = Vector::<F, N>::cast_from(sum);
}
