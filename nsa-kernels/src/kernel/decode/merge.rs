//! Flash decoding's merge: a branch's tile partials ([`super::tile`]) into its output rows,
//! each tile's state rescaled to the largest maximum of the branch.

use cubecl::prelude::*;

use super::tile::partial_at;
use crate::kernel::primitives::rows::{offset3, NEG_LARGE};

/// Merges tiles `first..first + count` of `bh = b * H_kv + hk` in `partials`
/// (`[B * H_kv, tiles, g, 2 + d_v]`) into `out[b, 0, hk * g + h, :]` (`[B, 1, H_q, d_v]`;
/// zeros for a head that saw no key) and leaves head `h`'s log-sum-exp at `lse[lse_at + h]`
/// (meaningless when it saw no key). Tiles are taken in ascending order.
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn merge_tiles<F: Float>(
    partials: &Tensor<f32>,
    out: &mut Tensor<F>,
    lse: &mut SharedMemory<f32>,
    lse_at: usize,
    bh: usize,
    b: usize,
    hk: usize,
    first: usize,
    count: usize,
    #[comptime] g: usize,
    #[comptime] d_v: usize,
) {
    let tiles = partials.shape(1);
    let mut idx = UNIT_POS as usize;
    while idx < g * d_v {
        let (h, c) = (idx / d_v, idx % d_v);
        let mut top = f32::new(NEG_LARGE);
        for tile in first..first + count {
            top = max(top, partials[partial_at(bh, tile, h, tiles, g, d_v)]);
        }
        let mut sum = 0.0f32;
        let mut acc = 0.0f32;
        for tile in first..first + count {
            let at = partial_at(bh, tile, h, tiles, g, d_v);
            let weight = (partials[at] - top).exp();
            sum += partials[at + 1] * weight;
            acc += partials[at + 2 + c] * weight;
        }
        let inverse = select(sum > 0.0f32, 1.0f32 / sum, 0.0f32);
        out[offset3::<F>(out, b, 0, hk * g + h) + c] = F::cast_from(acc * inverse);
        if c == 0 {
            lse[lse_at + h] = top + sum.ln();
        }
        idx += CUBE_DIM as usize;
    }
}

/// The selected branch's merge: one cube per `(b, hk)` over all its tiles of `partials`
/// (`[B * H_kv, tiles, g, 2 + d_v]`; tiles of unused or future blocks are empty) into `out`
/// (`[B, 1, H_q, d_v]`).
#[cube(launch)]
pub fn decode_merge<F: Float>(
    partials: &Tensor<f32>,
    out: &mut Tensor<F>,
    #[comptime] g: usize,
    #[comptime] d_v: usize,
    #[define(F)] _dtype: StorageType,
) {
    let bh = CUBE_POS;
    if bh >= partials.shape(0) {
        terminate!();
    }
    let h_kv = out.shape(2) / g;
    let mut lse = SharedMemory::<f32>::new(g);
    merge_tiles::<F>(partials, out, &mut lse, 0, bh, bh / h_kv, bh % h_kv, 0, partials.shape(1), g, d_v);
}
