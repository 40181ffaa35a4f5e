//! One decode query row per head of a KV group against a range of cached key rows: the online
//! softmax of flash decoding, one plane per cube. Each lane scores one key of a chunk for all
//! `g` heads; every lane then keeps the same running maximum and sum per head (computed from
//! the chunk's scores in shared memory, in one order) and its own columns of the output.

use cubecl::prelude::*;

use crate::kernel::primitives::rows::{offset3, NEG_LARGE};
use crate::sparse::tiling::SELECTION_LANES as LANES;

/// The running state of the `g` rows: maxima and sums per head, and this lane's output
/// columns `lane, lane + LANES, ..` per head (`acc[h * cols + c]`).
#[derive(CubeType)]
pub struct DecodeRows {
    pub max: Array<f32>,
    pub sum: Array<f32>,
    pub acc: Array<f32>,
}

#[cube]
impl DecodeRows {
    /// Rows that have seen no key.
    pub fn new(#[comptime] g: usize, #[comptime] d_v: usize) -> DecodeRows {
        let cols = comptime!(d_v.div_ceil(LANES));
        let mut max = Array::<f32>::new(g);
        let mut sum = Array::<f32>::new(g);
        let mut acc = Array::<f32>::new(comptime!(g * cols));
        #[unroll]
        for h in 0..g {
            max[h] = f32::new(NEG_LARGE);
            sum[h] = 0.0f32;
        }
        #[unroll]
        for i in 0..g * cols {
            acc[i] = 0.0f32;
        }
        DecodeRows { max, sum, acc }
    }

    /// Head `h`'s log-sum-exp of the scaled scores (meaningless before any key).
    pub fn lse(&self, h: usize) -> f32 {
        self.max[h] + self.sum[h].ln()
    }

    /// Takes a chunk's maxima (its `keys_here` scores per head in `scores`) into the running
    /// ones and rescales the sums and outputs.
    pub fn rescale(
        &mut self,
        scores: &SharedMemory<f32>,
        keys_here: usize,
        #[comptime] g: usize,
        #[comptime] d_v: usize,
    ) {
        let cols = comptime!(d_v.div_ceil(LANES));
        #[unroll]
        for h in 0..g {
            let mut chunk_max = f32::new(NEG_LARGE);
            for k in 0..keys_here {
                chunk_max = max(chunk_max, scores[h * LANES + k]);
            }
            let new_max = max(self.max[h], chunk_max);
            let correction = (self.max[h] - new_max).exp();
            self.sum[h] = self.sum[h] * correction;
            #[unroll]
            for c in 0..cols {
                self.acc[h * cols + c] = self.acc[h * cols + c] * correction;
            }
            self.max[h] = new_max;
        }
    }
}

/// Attends the rows' queries (`queries`: `g` rows of `d_k / vector` vectors, pre-scaled) to
/// keys `first..first + count` of `(b, hk)` in `keys`/`values` (`[B, S, H_kv, d]`, any
/// strides), every one visible. `scores` holds a chunk's `g x LANES` scores, then
/// probabilities. Called by every unit of the cube (it synchronises).
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn attend_keys<F: Float, V: Size>(
    rows: &mut DecodeRows,
    queries: &SharedMemory<Vector<f32, V>>,
    keys: &Tensor<F>,
    values: &Tensor<F>,
    scores: &mut SharedMemory<f32>,
    b: usize,
    hk: usize,
    first: usize,
    count: usize,
    #[comptime] g: usize,
    #[comptime] d_k: usize,
    #[comptime] d_v: usize,
    #[comptime] vector: usize,
) {
    let lane = UNIT_POS_X as usize;
    let end = first + count;
    let mut start = first;
    while start < end {
        let keys_here = min(end - start, LANES);
        let valid = lane < keys_here;
        let s = key_scores::<F, V>(queries, keys, b, hk, start + lane, valid, g, d_k, vector);
        #[unroll]
        for h in 0..g {
            scores[h * LANES + lane] = s[h];
        }
        sync_cube();
        rows.rescale(scores, keys_here, g, d_v);
        sync_cube();
        #[unroll]
        for h in 0..g {
            scores[h * LANES + lane] = select(valid, (s[h] - rows.max[h]).exp(), 0.0f32);
        }
        sync_cube();
        accumulate::<F>(rows, values, scores, b, hk, start, keys_here, g, d_v);
        sync_cube();
        start += LANES;
    }
}

/// Adds a chunk's probabilities (in `scores`) times its value rows `start..start + keys_here`.
#[cube]
#[allow(clippy::too_many_arguments)]
fn accumulate<F: Float>(
    rows: &mut DecodeRows,
    values: &Tensor<F>,
    scores: &SharedMemory<f32>,
    b: usize,
    hk: usize,
    start: usize,
    keys_here: usize,
    #[comptime] g: usize,
    #[comptime] d_v: usize,
) {
    let cols = comptime!(d_v.div_ceil(LANES));
    let lane = UNIT_POS_X as usize;
    for k in 0..keys_here {
        let at = offset3::<F>(values, b, start + k, hk);
        #[unroll]
        for c in 0..cols {
            let col = lane + c * LANES;
            if col < d_v {
                let v = f32::cast_from(values[at + col]);
                #[unroll]
                for h in 0..g {
                    rows.acc[h * cols + c] = rows.acc[h * cols + c] + scores[h * LANES + k] * v;
                }
            }
        }
        #[unroll]
        for h in 0..g {
            rows.sum[h] = rows.sum[h] + scores[h * LANES + k];
        }
    }
}

/// Writes the rows' outputs to `out[b, 0, hk * g + h, :]` (`[B, 1, H_q, d_v]`; zeros for a
/// row that saw no key).
#[cube]
pub fn write_rows<F: Float>(
    rows: &DecodeRows,
    out: &mut Tensor<F>,
    b: usize,
    hk: usize,
    #[comptime] g: usize,
    #[comptime] d_v: usize,
) {
    let cols = comptime!(d_v.div_ceil(LANES));
    let lane = UNIT_POS_X as usize;
    #[unroll]
    for h in 0..g {
        let at = offset3::<F>(out, b, 0, hk * g + h);
        let inverse = select(rows.sum[h] > 0.0f32, 1.0f32 / rows.sum[h], 0.0f32);
        #[unroll]
        for c in 0..cols {
            let col = lane + c * LANES;
            if col < d_v {
                out[at + col] = F::cast_from(rows.acc[h * cols + c] * inverse);
            }
        }
    }
}

/// The scaled scores of key row `row` of `(b, hk)` against the `g` staged queries (zeros when
/// not `valid`).
#[cube]
#[allow(clippy::too_many_arguments)]
fn key_scores<F: Float, V: Size>(
    queries: &SharedMemory<Vector<f32, V>>,
    keys: &Tensor<F>,
    b: usize,
    hk: usize,
    row: usize,
    valid: bool,
    #[comptime] g: usize,
    #[comptime] d_k: usize,
    #[comptime] vector: usize,
) -> Array<f32> {
    let per_row = comptime!(d_k / vector);
    let mut s = Array::<f32>::new(g);
    #[unroll]
    for h in 0..g {
        s[h] = 0.0f32;
    }
    if valid {
        let at = offset3::<F>(keys, b, row, hk);
        for part in 0..per_row {
            let mut k = Vector::<f32, V>::new(0.0f32);
            #[unroll]
            for e in 0..vector {
                k[e] = f32::cast_from(keys[at + part * vector + e]);
            }
            #[unroll]
            for h in 0..g {
                let q = queries[h * per_row + part];
                let mut dot = s[h];
                #[unroll]
                for e in 0..vector {
                    dot += q[e] * k[e];
                }
                s[h] = dot;
            }
        }
    }
    s
}
