//! The block selection's scores (see [`super::top_n`]): each query's block scores from the
//! compressed keys, staged a chunk at a time, summed over the group's heads and spread over the
//! selection blocks by their overlap, in shared memory.

use cubecl::prelude::*;

use crate::kernel::primitives::rows::offset3;
use crate::tile_sizes::{SELECTION_CHUNK as CHUNK, SELECTION_KEYS_PER_LANE as KEYS_PER_LANE, SELECTION_LANES as LANES};

/// Stages the `g` heads' query rows of positions `t0..t0 + rows` (times `scale`, f32, in
/// vectors of `vector`) and their log-sum-exps, zeros past the sequence end, and zeroes the
/// rows' block scores.
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn stage_queries<F: Float, V: Size>(
    q: &Tensor<F>,
    lse: &Tensor<f32>,
    queries: &mut SharedMemory<Vector<f32, V>>,
    stats: &mut SharedMemory<f32>,
    scores: &mut SharedMemory<f32>,
    b: usize,
    hk: usize,
    t0: usize,
    scale: f32,
    #[comptime] g: usize,
    #[comptime] d_k: usize,
    #[comptime] rows: usize,
    #[comptime] blocks: usize,
    #[comptime] vector: usize,
) {
    let t_len = q.shape(1);
    let units = CUBE_DIM as usize;
    let per_row = comptime!(d_k / vector);
    let mut idx = UNIT_POS as usize;
    while idx < rows * g * per_row {
        let (row, rest) = (idx / (g * per_row), idx % (g * per_row));
        let mut value = Vector::<f32, V>::new(0.0f32);
        if t0 + row < t_len {
            let at = offset3::<F>(q, b, t0 + row, hk * g + rest / per_row) + (rest % per_row) * vector;
            #[unroll]
            for e in 0..vector {
                value[e] = f32::cast_from(q[at + e]) * scale;
            }
        }
        queries[idx] = value;
        idx += units;
    }
    idx = UNIT_POS as usize;
    while idx < rows * g {
        let mut value = 0.0f32;
        if t0 + idx / g < t_len {
            value = lse[offset3::<f32>(lse, b, t0 + idx / g, hk * g + idx % g)];
        }
        stats[idx] = value;
        idx += units;
    }
    idx = UNIT_POS as usize;
    while idx < rows * blocks {
        scores[idx] = 0.0f32;
        idx += units;
    }
}

/// Stages compressed keys `first..first + count` (at most [`CHUNK`]) of head `hk` as f32
/// vectors, row stride [`key_stride`]; rows past `count` are zero.
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn stage_keys<F: Float, V: Size>(
    k: &Tensor<F>,
    keys: &mut SharedMemory<Vector<f32, V>>,
    b: usize,
    first: usize,
    count: usize,
    hk: usize,
    #[comptime] d_k: usize,
    #[comptime] vector: usize,
) {
    let per_row = comptime!(d_k / vector);
    let stride = comptime!(key_stride(d_k, vector));
    let mut idx = UNIT_POS as usize;
    while idx < CHUNK * per_row {
        let (row, part) = (idx / per_row, idx % per_row);
        let mut value = Vector::<f32, V>::new(0.0f32);
        if row < count {
            let at = offset3::<F>(k, b, first + row, hk) + part * vector;
            #[unroll]
            for e in 0..vector {
                value[e] = f32::cast_from(k[at + e]);
            }
        }
        keys[row * stride + part] = value;
        idx += CUBE_DIM as usize;
    }
}

/// Row stride (in vectors) of the staged keys: one vector of padding, so that the lanes' rows
/// start in different banks.
pub fn key_stride(d_k: usize, vector: usize) -> usize {
    d_k / vector + 1
}

/// `sum_h exp(q_h . k - lse_h)` over the group's heads for query row `r` and the staged keys
/// `lane + m * LANES` (`m < KEYS_PER_LANE`; queries pre-scaled): each query vector is read once
/// for all the lane's keys, each key vector once for all `g` heads. Elements are added in
/// ascending order, as a plain dot product.
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn group_mass<V: Size>(
    queries: &SharedMemory<Vector<f32, V>>,
    stats: &SharedMemory<f32>,
    keys: &SharedMemory<Vector<f32, V>>,
    r: usize,
    lane: usize,
    #[comptime] g: usize,
    #[comptime] d_k: usize,
    #[comptime] vector: usize,
) -> Array<f32> {
    let per_row = comptime!(d_k / vector);
    let stride = comptime!(key_stride(d_k, vector));
    let mut dots = Array::<f32>::new(comptime!(g * KEYS_PER_LANE));
    #[unroll]
    for i in 0..g * KEYS_PER_LANE {
        dots[i] = 0.0f32;
    }
    let q_at = r * g * per_row;
    for part in 0..per_row {
        let mut k_parts = Array::<Vector<f32, V>>::new(KEYS_PER_LANE);
        #[unroll]
        for m in 0..KEYS_PER_LANE {
            k_parts[m] = keys[(lane + m * LANES) * stride + part];
        }
        #[unroll]
        for h in 0..g {
            let q_part = queries[q_at + h * per_row + part];
            #[unroll]
            for m in 0..KEYS_PER_LANE {
                let k_part = k_parts[m];
                let mut dot = dots[m * g + h];
                #[unroll]
                for e in 0..vector {
                    dot += q_part[e] * k_part[e];
                }
                dots[m * g + h] = dot;
            }
        }
    }
    let mut p = Array::<f32>::new(KEYS_PER_LANE);
    #[unroll]
    for m in 0..KEYS_PER_LANE {
        let mut sum = 0.0f32;
        #[unroll]
        for h in 0..g {
            sum += (dots[m * g + h] - stats[r * g + h]).exp();
        }
        p[m] = sum;
    }
    p
}

/// Adds the chunk's key masses (`mass[r][c]` for keys `first + c`, `c < count`) to query row
/// `r`'s scores of the selection blocks they meet (blocks of `length` tokens at `stride`,
/// selection blocks of `size`: compile-time, so the divisions by them are cheap), each times
/// its overlap in tokens; lane
/// `lane` owns blocks `j_lo + lane, j_lo + lane + LANES, ..`, so no two units add to one score.
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn add_chunk_mass(
    mass: &SharedMemory<f32>,
    scores: &mut SharedMemory<f32>,
    r: usize,
    lane: usize,
    first: usize,
    count: usize,
    #[comptime] length: usize,
    #[comptime] stride: usize,
    #[comptime] size: usize,
    #[comptime] blocks: usize,
) {
    let j_end = ((first + count - 1) * stride + length - 1) / size + 1;
    let mut j = (first * stride) / size + lane;
    while j < j_end {
        let (start, end) = (j * size, (j + 1) * size);
        // Keys of the chunk with `i * stride < end` and `i * stride + length > start`.
        let mut i = first;
        if start + 1 > length {
            i = max(first, (start + 1 - length + stride - 1) / stride);
        }
        let i_end = min(first + count, (end - 1) / stride + 1);
        let mut total = scores[r * blocks + j];
        while i < i_end {
            let overlap = min(i * stride + length, end) - max(i * stride, start);
            total += mass[r * CHUNK + i - first] * f32::cast_from(overlap as u32);
            i += 1;
        }
        scores[r * blocks + j] = total;
        j += LANES;
    }
}
