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

/// Compressed blocks visible to each query `[T, n_blocks]`: block `i` (raw `[i*d, i*d + l)`)
/// exists once its last token `i*d + l - 1 <= t` exists.
pub fn compressed_visible<B: Backend>(
    t: usize,
    n_blocks: usize,
    l: usize,
    d: usize,
    device: &B::Device,
) -> Tensor<B, 2, Bool> {
    let last_token = index_row::<B>(n_blocks, device).mul_scalar(d as i64).add_scalar(l as i64 - 1);
    let last_token = last_token.expand([t, n_blocks]);
    let query = query_positions::<B>(t, device).expand([t, n_blocks]);
    last_token.lower_equal(query)
}
