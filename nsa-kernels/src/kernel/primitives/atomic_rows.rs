//! Adding a lane's result rows to global f32 memory by atomics.

use cubecl::prelude::*;

use super::fragments::{Pair, MMA_N};
use super::key_cube::ListedRows;
use super::rows::offset3;

/// Adds the lane's two rows of `tiles` (over `d` columns), times `factor`, to rows `(b, t, h)`
/// of the f32 `dst` by atomics (real rows only), `width` columns per atomic (4 where the device
/// adds 16-byte vectors atomically, sm90: a quarter of the atomics). Neighbouring lanes first
/// swap halves, so that each holds four consecutive columns of one row: the even lane of a pair
/// row `l / 4`, the odd lane row `l / 4 + 8`.
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn add_rows<A: Size>(
    dst: &mut Tensor<Atomic<Vector<f32, A>>>,
    rows: &ListedRows,
    tiles: &Array<Pair<f32>>,
    b: usize,
    factor: f32,
    first_col: usize,
    lane: usize,
    #[comptime] d: usize,
    #[comptime] width: usize,
) {
    let quad = lane % 4;
    let even = quad % 2 == 0;
    let half = select(even, 0usize, 1usize);
    let base =
        offset3::<Atomic<Vector<f32, A>>>(dst, b, rows.t[half], rows.h[half]) + first_col + 2 * (quad - quad % 2);
    #[unroll]
    for j in 0..d / MMA_N {
        let low = tiles[2 * j];
        let high = tiles[2 * j + 1];
        // The even lane gives away its second row, the odd lane its first.
        let mut given = Array::<f32>::new(2usize);
        #[unroll]
        for e in 0..2usize {
            given[e] = plane_shuffle_xor(select(even, high[e], low[e]), 1u32);
        }
        let mut four = Array::<f32>::new(4usize);
        #[unroll]
        for e in 0..2usize {
            four[e] = select(even, low[e], given[e]);
            four[2 + e] = select(even, given[e], high[e]);
        }
        if rows.real[half] {
            #[unroll]
            for part in 0..comptime!(4 / width) {
                let mut value = Vector::<f32, A>::new(0.0f32);
                #[unroll]
                for e in 0..width {
                    value[e] = four[part * width + e] * factor;
                }
                let at = (base + j * MMA_N + part * width) / width;
                dst[at].fetch_add(value);
            }
        }
    }
}
