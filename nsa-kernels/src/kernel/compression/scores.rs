//! The selection scores from the compressed branch's probabilities (the spec's Eq. 9 and 10),
//! and which compressed blocks a query sees. The branch's attention itself is dense products
//! and [`crate::kernel::compression::rows`].

use cubecl::prelude::*;

use crate::kernel::primitives::rows::offset3;

/// Compressed blocks complete at position `t` (`i * stride + length - 1 <= t`), at most `n`.
#[cube]
pub fn visible_blocks(t: usize, n: usize, length: usize, stride: usize) -> usize {
    let mut count = 0usize;
    if t + 1 >= length {
        count = min((t + 1 - length) / stride + 1, n);
    }
    count
}

/// `out [B, H_kv, T, n_sel]` (f32, contiguous): for selection block `j` of `block_size` tokens,
/// the sum over the group's `g` heads and the compressed blocks `i` complete at `t` that overlap
/// it of `|[i*stride, i*stride + length) ∩ [j*block_size, (j+1)*block_size)| / length * p_t,h,i`,
/// `p = exp(s * scale - lse)` from the raw scores `s = q . k` (`[B * H_q, T, width]`, f32) and
/// the branch's `lse [B, T, H_q]`. One unit per output; a block meets at most
/// `ceil(block_size / stride) + 1` compressed blocks.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn compressed_block_scores(
    scores: &Tensor<f32>,
    lse: &Tensor<f32>,
    out: &mut Tensor<f32>,
    scale: f32,
    length: u32,
    stride: u32,
    block_size: u32,
    n: u32,
    #[comptime] g: usize,
) {
    let pos = ABSOLUTE_POS;
    if pos >= out.len() {
        terminate!();
    }
    let (length, stride, block_size) = (length as usize, stride as usize, block_size as usize);
    let (h_kv, t_len, n_sel) = (out.shape(1), out.shape(2), out.shape(3));
    let j = pos % n_sel;
    let t = (pos / n_sel) % t_len;
    let hk = (pos / (n_sel * t_len)) % h_kv;
    let b = pos / (n_sel * t_len * h_kv);
    let (start, end) = (j * block_size, (j + 1) * block_size);
    // Blocks with `i * stride + length > start` and `i * stride < end`, among those complete at `t`.
    let mut first = 0usize;
    if start + 1 > length {
        first = (start + 1 - length + stride - 1) / stride;
    }
    let last = min(visible_blocks(t, n as usize, length, stride), (end - 1) / stride + 1);
    let width = scores.shape(2);
    let mut total = 0.0f32;
    for i in first..last {
        let overlap = min(i * stride + length, end) - max(i * stride, start);
        let mut p = 0.0f32;
        #[unroll]
        for head in 0..g {
            let h = hk * g + head;
            let s = scores[((b * h_kv * g + h) * t_len + t) * width + i];
            p += (s * scale - lse[offset3::<f32>(lse, b, t, h)]).exp();
        }
        total += p * f32::cast_from(overlap as u32);
    }
    out[pos] = total / f32::cast_from(length as u32);
}
