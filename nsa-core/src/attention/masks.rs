//! Index rows and query-position columns built on the device (no host loops, no host-to-device
//! copies of `T x T` data), from which the selection's masks are compared.

use burn::tensor::{backend::Backend, Int, Tensor};

/// Query positions as a column `[T, 1]`.
pub fn query_positions<B: Backend>(t: usize, device: &B::Device) -> Tensor<B, 2, Int> {
    Tensor::arange(0..t as i64, device).reshape([t, 1])
}

/// Indices `0..n` as a row `[1, n]`.
pub fn index_row<B: Backend>(n: usize, device: &B::Device) -> Tensor<B, 2, Int> {
    Tensor::arange(0..n as i64, device).reshape([1, n])
}
