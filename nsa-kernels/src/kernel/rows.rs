//! Small building blocks shared by the kernels: key ranges, row loads and dot products.

use cubecl::prelude::*;

/// Stands in for `-inf` as the running maximum's start (WGSL has no infinity literal).
pub const NEG_LARGE: f32 = -1.0e30;

/// How many key ranges a query row has: one window, or one per selection slot.
#[cube]
pub fn range_count<I: Int>(blocks: &Tensor<I>, #[comptime] window: bool) -> usize {
    let mut count = 1usize;
    if !window {
        count = blocks.shape(3);
    }
    count
}

/// Keys `[start, end)` of range `r` of query `t`: the window `[t + 1 - span, t + 1)`, or the
/// selected block `blocks[slots + r]` of `span` keys clamped causally to `t`. An unused slot
/// (negative block) or a block wholly in the future is the empty range.
#[cube]
pub fn key_range<I: Int>(
    blocks: &Tensor<I>,
    slots: usize,
    r: usize,
    t: usize,
    span: usize,
    #[comptime] window: bool,
) -> (usize, usize) {
    let mut start = 0usize;
    let mut end = 0usize;
    if window {
        end = t + 1;
        if t + 1 > span {
            start = t + 1 - span;
        }
    } else {
        let j = i32::cast_from(blocks[slots + r * blocks.stride(3)]);
        if j >= 0 {
            let first = u32::cast_from(j) as usize * span;
            if first <= t {
                start = first;
                end = first + span;
                if end > t + 1 {
                    end = t + 1;
                }
            }
        }
    }
    (start, end)
}

/// A contiguous row of `len` elements at `base`, widened to f32 and multiplied by `scale`.
#[cube]
pub fn load_row<F: Float>(src: &Tensor<F>, base: usize, scale: f32, #[comptime] len: usize) -> Array<f32> {
    let mut row = Array::<f32>::new(len);
    #[unroll]
    for i in 0..len {
        row[i] = f32::cast_from(src[base + i]) * scale;
    }
    row
}

/// `row . src[base..base + len]` in f32.
#[cube]
pub fn dot<F: Float>(row: &Array<f32>, src: &Tensor<F>, base: usize, #[comptime] len: usize) -> f32 {
    let mut sum = 0.0f32;
    #[unroll]
    for i in 0..len {
        sum += row[i] * f32::cast_from(src[base + i]);
    }
    sum
}

/// `acc += weight * src[base..base + len]`.
#[cube]
pub fn add_scaled<F: Float>(acc: &mut Array<f32>, weight: f32, src: &Tensor<F>, base: usize, #[comptime] len: usize) {
    #[unroll]
    for i in 0..len {
        acc[i] += weight * f32::cast_from(src[base + i]);
    }
}

/// An f32 array of `len` zeros.
#[cube]
pub fn zeros(#[comptime] len: usize) -> Array<f32> {
    let mut row = Array::<f32>::new(len);
    #[unroll]
    for i in 0..len {
        row[i] = 0.0f32;
    }
    row
}

/// Writes `scale * row` to `dst[base..base + len]` in the storage dtype.
#[cube]
pub fn store_row<F: Float>(dst: &mut Tensor<F>, base: usize, row: &Array<f32>, scale: f32, #[comptime] len: usize) {
    #[unroll]
    for i in 0..len {
        dst[base + i] = F::cast_from(row[i] * scale);
    }
}

/// Offset of element `[a, b, c, 0]` of a 4-d tensor.
#[cube]
pub fn offset3<E: CubePrimitive>(x: &Tensor<E>, a: usize, b: usize, c: usize) -> usize {
    a * x.stride(0) + b * x.stride(1) + c * x.stride(2)
}
