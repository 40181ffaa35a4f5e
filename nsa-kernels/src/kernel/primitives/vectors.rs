//! Small element-wise primitives over vectors, shared by the row kernels.

use cubecl::prelude::*;

/// `sum_e a[e] b[e]` in f32.
#[cube]
pub fn dot<F: Float, N: Size>(a: Vector<F, N>, b: Vector<F, N>, #[comptime] vector: usize) -> f32 {
    let product = Vector::<f32, N>::cast_from(a) * Vector::<f32, N>::cast_from(b);
    let mut sum = 0.0f32;
    #[unroll]
    for e in 0..vector {
        sum += product[e];
    }
    sum
}

/// `x` in f32.
#[cube]
pub fn widen<F: Float, N: Size>(x: Vector<F, N>) -> Vector<f32, N> {
    Vector::<f32, N>::cast_from(x)
}
