//! Boolean "may attend" masks built on the device from index arithmetic (no host loops, no
//! host-to-device copies of `T x T` data). `true` means the key is attended.

use burn::tensor::{backend::Backend, Bool, Int, Tensor};

/// Query positions as a column `[T, 1]`.
pub fn query_positions<B: Backend>(t: usize, device: &B::Device) -> Tensor<B, 2, Int> {
    Tensor::arange(0..t as i64, device).reshape([t, 1])
}

/// Indices `0..n` as a row `[1, n]`.
pub fn index_row<B: Backend>(n: usize, device: &B::Device) -> Tensor<B, 2, Int> {
    Tensor::arange(0..n as i64, device).reshape([1, n])
}

/// Causal sliding window `[T, T]`: key `k` is visible to `t` when `t - w < k <= t`.
/// `w >= T` gives plain causal attention.
pub fn sliding_window<B: Backend>(t: usize, w: usize, device: &B::Device) -> Tensor<B, 2, Bool> {
    let lag = query_positions::<B>(t, device) - index_row::<B>(t, device); // t - k
    lag.clone().greater_equal_elem(0).bool_and(lag.lower_elem(w as i64))
}
