//! The tensor-core selection's products (see [`super::top_n_mma`]): every staged query row's
//! compressed-branch probabilities `p = exp(q . k scale - lse)` against a staged chunk of keys,
//! on CUDA's manual MMA, and their sum over each query's `g` heads.

use cubecl::cmma::MmaDefinition;
use cubecl::prelude::*;

use crate::kernel::primitives::fragments::{products_with_rows, row_fragments, Pair, MMA_K, MMA_M, MMA_N};
use crate::tile_sizes::{storage_stride, SELECTION_CHUNK as CHUNK, SELECTION_LANES as LANES, SELECTION_PROB_STRIDE};

/// Pairs per row of the probabilities.
const PAIR_STRIDE: usize = SELECTION_PROB_STRIDE / 2;

/// `probs[row][c] = exp(q_row . k_c scale - lse_row)` for the `16 row_tiles` staged query rows
/// (`queries`, 16-bit rows of stride `storage_stride(d_k)`) and the [`CHUNK`] staged keys
/// (`keys`, likewise), f32 pairs of row stride `SELECTION_PROB_STRIDE / 2`. Plane `plane` of
/// `planes` takes the 16-key groups `plane, plane + planes, ..`, every row tile of each; the
/// products accumulate in f32 and are scaled after, as the compressed branch's forward does
/// (its `lse` is of the same scores).
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn chunk_probabilities<F: Float, N: Size>(
    def: MmaDefinition<F, F, f32>,
    queries: &SharedMemory<Vector<F, N>>,
    keys: &SharedMemory<Vector<F, N>>,
    stats: &SharedMemory<f32>,
    probs: &mut SharedMemory<Pair<f32>>,
    plane: usize,
    lane: usize,
    scale: f32,
    #[comptime] planes: usize,
    #[comptime] row_tiles: usize,
    #[comptime] d_k: usize,
) {
    let stride = comptime!(storage_stride(d_k));
    #[unroll]
    for i in 0..comptime!(CHUNK / MMA_K / planes) {
        let key0 = (plane + i * planes) * MMA_K;
        for tile in 0..row_tiles {
            let a = row_fragments::<F, N>(def, queries, 0usize, tile * MMA_M, lane, d_k, stride);
            let s = products_with_rows::<F, N>(def, &a, keys, key0 * stride, lane, d_k, stride, MMA_K);
            #[unroll]
            for half in 0..2usize {
                let row = tile * MMA_M + lane / 4 + 8 * half;
                let lse = stats[row];
                #[unroll]
                for j in 0..comptime!(MMA_K / MMA_N) {
                    let x = s[2 * j + half];
                    let mut p = Pair::<f32>::new(0.0f32);
                    #[unroll]
                    for e in 0..2usize {
                        p[e] = (x[e] * scale - lse).exp();
                    }
                    probs[row * PAIR_STRIDE + (key0 + j * MMA_N) / 2 + lane % 4] = p;
                }
            }
        }
    }
}

/// `mass[r][c] = sum_h probs[r g + h][c]` (heads in ascending order) for query row `r`'s keys
/// `c`, this lane's pairs `lane, lane + LANES, ..`; 0 where key `first + c` is not among the
/// query's `visible` ones or lies before `first_key` (its document's first compressed block).
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn group_sums(
    probs: &SharedMemory<Pair<f32>>,
    mass: &mut SharedMemory<f32>,
    r: usize,
    lane: usize,
    first: usize,
    visible: usize,
    first_key: usize,
    #[comptime] g: usize,
) {
    #[unroll]
    for m in 0..comptime!(CHUNK / 2 / LANES) {
        let pair = lane + m * LANES;
        let mut sum = Pair::<f32>::new(0.0f32);
        #[unroll]
        for h in 0..g {
            sum += probs[(r * g + h) * PAIR_STRIDE + pair];
        }
        #[unroll]
        for e in 0..2usize {
            let key = 2 * pair + e;
            let own = first + key < visible && first + key >= first_key;
            mass[r * CHUNK + key] = select(own, sum[e], 0.0f32);
        }
    }
}
