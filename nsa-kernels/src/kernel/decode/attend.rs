//! One decode query row per head of a KV group against cached key rows: the online softmax of
//! flash decoding. A cube's planes take turns over chunks of [`LANES`] keys, each lane scoring
//! one key for all `g` heads; every lane of a plane keeps the same running maximum and sum per
//! head (from the chunk's scores in shared memory, in one order) and its own output columns.
//! At the end of a branch the planes' states are merged ([`merge_planes`]).

use cubecl::prelude::*;

use crate::kernel::primitives::rows::{offset3, NEG_LARGE};
use crate::tile_sizes::SELECTION_LANES as LANES;

/// The running state of the `g` rows in one plane: maxima and sums per head, and this lane's
/// output columns `lane, lane + LANES, ..` per head (`acc[h * cols + c]`).
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

    /// Takes a chunk's maxima (its `keys_here` scores per head at `scores[base..]`, masked ones
    /// `NEG_LARGE`) into the running ones and rescales the sums and outputs.
    pub fn rescale(
        &mut self,
        scores: &SharedMemory<f32>,
        base: usize,
        keys_here: usize,
        #[comptime] g: usize,
        #[comptime] d_v: usize,
    ) {
        let cols = comptime!(d_v.div_ceil(LANES));
        #[unroll]
        for h in 0..g {
            let mut chunk_max = f32::new(NEG_LARGE);
            for k in 0..keys_here {
                chunk_max = max(chunk_max, scores[base + h * LANES + k]);
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

/// Which cached keys a branch reads: key `i` of `0..count` is row `i`, or, for the selected
/// branch (`selected`), position `i % block_size` of the `i / block_size`-th chosen block,
/// visible when not after the query's position `t`. Returns the row (0 past `count`) and
/// whether the query sees it.
#[cube]
fn key_row(
    count: usize,
    t: usize,
    chosen: &SharedMemory<u32>,
    i: usize,
    #[comptime] selected: bool,
    #[comptime] block_size: usize,
) -> (usize, bool) {
    let mut row = 0usize;
    let mut visible = false;
    if i < count {
        if selected {
            row = chosen[i / block_size] as usize * block_size + i % block_size;
            visible = row <= t;
        } else {
            row = i;
            visible = true;
        }
    }
    (row, visible)
}

/// Attends the rows' queries (`queries`: `g` rows of `d_k / vector` vectors, pre-scaled) to the
/// keys `0..count` (as [`key_row`] maps them, for a query at `t`) of `(b, hk)` in `keys`/`values` (`[B, S, H_kv, d]`, any strides), plane
/// `UNIT_POS_Y` of `planes` taking every `planes`-th chunk. `scores` holds each plane's chunk
/// of `g x LANES` scores, then probabilities. Called by every unit of the cube (it
/// synchronises); each plane's state then holds its chunks only.
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn attend_keys<F: Float, V: Size>(
    rows: &mut DecodeRows,
    queries: &SharedMemory<Vector<f32, V>>,
    keys: &Tensor<F>,
    values: &Tensor<F>,
    scores: &mut SharedMemory<f32>,
    chosen: &SharedMemory<u32>,
    b: usize,
    hk: usize,
    count: usize,
    t: usize,
    #[comptime] selected: bool,
    #[comptime] block_size: usize,
    #[comptime] g: usize,
    #[comptime] d_k: usize,
    #[comptime] d_v: usize,
    #[comptime] vector: usize,
    #[comptime] planes: usize,
) {
    let lane = UNIT_POS_X as usize;
    let plane = UNIT_POS_Y as usize;
    let base = plane * g * LANES;
    let span = comptime!(planes * LANES);
    let rounds = (count + span - 1) / span;
    for round in 0..rounds {
        let start = round * span + plane * LANES;
        let mut keys_here = 0usize;
        if start < count {
            keys_here = min(count - start, LANES);
        }
        let (row, visible) = key_row(count, t, chosen, start + lane, selected, block_size);
        let s = key_scores::<F, V>(queries, keys, b, hk, row, visible, g, d_k, vector);
        #[unroll]
        for h in 0..g {
            scores[base + h * LANES + lane] = select(visible, s[h], f32::new(NEG_LARGE));
        }
        sync_cube();
        rows.rescale(scores, base, keys_here, g, d_v);
        sync_cube();
        #[unroll]
        for h in 0..g {
            scores[base + h * LANES + lane] = select(visible, (s[h] - rows.max[h]).exp(), 0.0f32);
        }
        sync_cube();
        accumulate::<F>(
            rows, values, scores, chosen, count, t, b, hk, base, start, keys_here, selected, block_size, g, d_v,
        );
        sync_cube();
    }
}

/// Adds a chunk's probabilities (at `scores[base..]`) times the value rows of its keys
/// `start..start + keys_here` (a masked key's probability is 0).
#[cube]
#[allow(clippy::too_many_arguments)]
fn accumulate<F: Float>(
    rows: &mut DecodeRows,
    values: &Tensor<F>,
    scores: &SharedMemory<f32>,
    chosen: &SharedMemory<u32>,
    count: usize,
    t: usize,
    b: usize,
    hk: usize,
    base: usize,
    start: usize,
    keys_here: usize,
    #[comptime] selected: bool,
    #[comptime] block_size: usize,
    #[comptime] g: usize,
    #[comptime] d_v: usize,
) {
    let cols = comptime!(d_v.div_ceil(LANES));
    let lane = UNIT_POS_X as usize;
    for k in 0..keys_here {
        let (row, _) = key_row(count, t, chosen, start + k, selected, block_size);
        let at = offset3::<F>(values, b, row, hk);
        #[unroll]
        for c in 0..cols {
            let col = lane + c * LANES;
            if col < d_v {
                let v = f32::cast_from(values[at + col]);
                #[unroll]
                for h in 0..g {
                    rows.acc[h * cols + c] = rows.acc[h * cols + c] + scores[base + h * LANES + k] * v;
                }
            }
        }
        #[unroll]
        for h in 0..g {
            rows.sum[h] = rows.sum[h] + scores[base + h * LANES + k];
        }
    }
}

/// Merges the planes' states into one that every unit holds: `stats` holds `planes x g`
/// maxima and sums, `outs` `planes x g x d_v` outputs. Called by every unit (it synchronises).
#[cube]
pub fn merge_planes(
    rows: &mut DecodeRows,
    stats: &mut SharedMemory<f32>,
    outs: &mut SharedMemory<f32>,
    #[comptime] g: usize,
    #[comptime] d_v: usize,
    #[comptime] planes: usize,
) {
    let cols = comptime!(d_v.div_ceil(LANES));
    let lane = UNIT_POS_X as usize;
    let plane = UNIT_POS_Y as usize;
    #[unroll]
    for h in 0..g {
        if lane == 0 {
            stats[2 * (plane * g + h)] = rows.max[h];
            stats[2 * (plane * g + h) + 1] = rows.sum[h];
        }
        #[unroll]
        for c in 0..cols {
            let col = lane + c * LANES;
            if col < d_v {
                outs[(plane * g + h) * d_v + col] = rows.acc[h * cols + c];
            }
        }
    }
    sync_cube();
    #[unroll]
    for h in 0..g {
        let mut top = f32::new(NEG_LARGE);
        #[unroll]
        for p in 0..planes {
            top = max(top, stats[2 * (p * g + h)]);
        }
        let mut sum = 0.0f32;
        #[unroll]
        for p in 0..planes {
            sum += stats[2 * (p * g + h) + 1] * (stats[2 * (p * g + h)] - top).exp();
        }
        #[unroll]
        for c in 0..cols {
            let col = lane + c * LANES;
            let mut acc = 0.0f32;
            if col < d_v {
                #[unroll]
                for p in 0..planes {
                    acc += outs[(p * g + h) * d_v + col] * (stats[2 * (p * g + h)] - top).exp();
                }
            }
            rows.acc[h * cols + c] = acc;
        }
        rows.max[h] = top;
        rows.sum[h] = sum;
    }
    sync_cube();
}

/// Writes the rows' merged outputs to `out[b, 0, hk * g + h, :]` (`[B, 1, H_q, d_v]`; zeros
/// for a row that saw no key), from the first plane.
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
    if UNIT_POS_Y == 0 {
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
}

/// The scaled scores of key row `row` of `(b, hk)` against the `g` staged queries (zeros when
/// not `valid`), elements added in ascending order.
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn key_scores<F: Float, V: Size>(
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
