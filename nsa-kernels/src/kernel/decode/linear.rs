//! A decode step's linear layer over its few rows (one per sequence): `out = r + f(x) w`, with
//! `f` the layer's input function (nothing, the RMSNorm before it, or the MLP's SiLU) and `r`
//! the residual stream when the layer adds into it. At one token per sequence the product
//! reads each weight once for a handful of rows, and every separate op costs the host a queued
//! task or two: so the norm, the activation and the residual add live in the product's one
//! launch.
//!
//! A cube serves [`LINEAR_ROWS`] rows at most and [`LINEAR_VECTORS`] vectors of columns. It
//! walks `k` in chunks of [`LINEAR_UNITS`]: each unit stages `f(x)` of one `k` for every row in
//! shared memory (so `f` runs once per element and cube), then the units, split into
//! [`LINEAR_SLICES`] interleaved slices of the chunk, read their rows of `w` as vectors, all of
//! a chunk's loads issued together (a product this thin is bound by how many loads are in
//! flight), and the slices' sums meet in shared memory at the end. No plane operations, so WGPU
//! runs it too.

use cubecl::prelude::*;

/// Units of a cube.
pub const LINEAR_UNITS: usize = 256;
/// Column vectors a cube serves.
pub const LINEAR_VECTORS: usize = 4;
/// Slices of `k` a cube's units split between them.
pub const LINEAR_SLICES: usize = LINEAR_UNITS / LINEAR_VECTORS;
/// Rows a cube serves at most (its units hold `rows * vector` sums each).
pub const LINEAR_ROWS: usize = 4;
/// `k`s of a chunk each slice reads.
const PER_SLICE: usize = LINEAR_UNITS / LINEAR_SLICES;

/// `f(x[row, kk])` in f32, where `scale[local]` holds the row's `1 / rms` for a norm.
#[cube]
#[allow(clippy::too_many_arguments)]
fn input_at<F: Float>(
    x: &Tensor<F>,
    gamma: &Tensor<F>,
    scale: &SharedMemory<f32>,
    row: usize,
    local: usize,
    kk: usize,
    #[comptime] norm: bool,
    #[comptime] silu: bool,
) -> f32 {
    let raw = f32::cast_from(x[row * x.stride(0) + kk]);
    let mut value = raw;
    if comptime!(norm) {
        value = f32::cast_from(F::cast_from(raw * scale[local] * f32::cast_from(gamma[kk])));
    }
    if comptime!(silu) {
        value = f32::cast_from(F::cast_from(raw / (1.0f32 + (0.0f32 - raw).exp())));
    }
    value
}

/// `1 / sqrt(mean(x[row]^2) + eps)` of the cube's rows into `scale`, through `sums`
/// (`rows * LINEAR_UNITS`). Every unit of the cube calls it (it synchronises).
#[cube]
fn row_scales<F: Float>(
    x: &Tensor<F>,
    sums: &mut SharedMemory<f32>,
    scale: &mut SharedMemory<f32>,
    first: usize,
    epsilon: f32,
    #[comptime] rows: usize,
) {
    let (m, k) = (x.shape(0), x.shape(1));
    let unit = UNIT_POS as usize;
    #[unroll]
    for r in 0..rows {
        let row = min(first + r, m - 1);
        let mut squares = 0.0f32;
        let mut kk = unit;
        while kk < k {
            let v = f32::cast_from(x[row * x.stride(0) + kk]);
            squares += v * v;
            kk += LINEAR_UNITS;
        }
        sums[r * LINEAR_UNITS + unit] = squares;
    }
    sync_cube();
    if unit < rows {
        let mut total = 0.0f32;
        for i in 0..LINEAR_UNITS {
            total += sums[unit * LINEAR_UNITS + i];
        }
        scale[unit] = 1.0f32 / (total / f32::cast_from(k) + epsilon).sqrt();
    }
    sync_cube();
}

/// `out [m, n] = residual + f(x [m, k]) w [k, n]` (`out` and `residual` contiguous; `x` and `w`
/// with contiguous rows, `n` and `w`'s row stride multiples of `vector`; `gamma [k]` read only
/// by a norm, `residual` only when `add_residual`). Cubes
/// `(ceil(n / (LINEAR_VECTORS vector)), ceil(m / rows))` of [`LINEAR_UNITS`] units.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn decode_linear<F: Float, N: Size>(
    x: &Tensor<F>,
    w: &Tensor<Vector<F, N>>,
    gamma: &Tensor<F>,
    residual: &Tensor<Vector<F, N>>,
    out: &mut Tensor<Vector<F, N>>,
    epsilon: f32,
    #[comptime] vector: usize,
    #[comptime] rows: usize,
    #[comptime] norm: bool,
    #[comptime] silu: bool,
    #[comptime] add_residual: bool,
    #[define(F)] _dtype: StorageType,
) {
    let (m, k) = (x.shape(0), x.shape(1));
    let vectors = w.shape(1) / vector;
    // Rows of `w` may be padded (CubeCL pitches the rows of some allocations).
    let pitch = w.stride(0) / vector;
    let unit = UNIT_POS as usize;
    let lane = unit % LINEAR_VECTORS;
    let (column, slice) = (CUBE_POS_X as usize * LINEAR_VECTORS + lane, unit / LINEAR_VECTORS);
    let first = CUBE_POS_Y as usize * rows;
    // The staged chunk `[rows, LINEAR_UNITS]`, the norm's sums before it and the slices' sums
    // after it.
    let mut shared = SharedMemory::<f32>::new(comptime!(LINEAR_UNITS * if vector > rows { vector } else { rows }));
    let mut scale = SharedMemory::<f32>::new(rows);
    if comptime!(norm) {
        row_scales::<F>(x, &mut shared, &mut scale, first, epsilon, rows);
    }

    let mut sums = Array::<f32>::new(comptime!(rows * vector));
    #[unroll]
    for i in 0..rows * vector {
        sums[i] = 0.0f32;
    }
    let mut base = 0;
    while base < k {
        let kk = base + unit;
        #[unroll]
        for r in 0..rows {
            let mut value = 0.0f32;
            if kk < k {
                value = input_at::<F>(x, gamma, &scale, min(first + r, m - 1), r, kk, norm, silu);
            }
            shared[r * LINEAR_UNITS + unit] = value;
        }
        sync_cube();
        // Past `k` the staged inputs are zeros: the clamped weight rows add nothing. Unrolled
        // without branches, so the compiler issues the chunk's loads together.
        #[unroll]
        for i in 0..PER_SLICE {
            let j = slice + i * LINEAR_SLICES;
            let weights = Vector::<f32, N>::cast_from(w[min(base + j, k - 1) * pitch + min(column, vectors - 1)]);
            #[unroll]
            for r in 0..rows {
                let a = shared[r * LINEAR_UNITS + j];
                #[unroll]
                for e in 0..vector {
                    sums[r * vector + e] += a * weights[e];
                }
            }
        }
        sync_cube();
        base += LINEAR_UNITS;
    }

    // The slices' sums, a row at a time: every unit leaves its `vector` sums; the cube's
    // `LINEAR_VECTORS vector` columns are then added over the slices by `groups` units
    // each (a share of the slices apiece), and their shares by one unit per column.
    let columns = comptime!(LINEAR_VECTORS * vector);
    let (col, group) = (unit % columns, unit / columns);
    let groups = comptime!(LINEAR_UNITS / (LINEAR_VECTORS * vector));
    let per_group = comptime!(LINEAR_SLICES / (LINEAR_UNITS / (LINEAR_VECTORS * vector)));
    let mut totals = SharedMemory::<f32>::new(LINEAR_UNITS);
    #[unroll]
    for r in 0..rows {
        sync_cube();
        #[unroll]
        for e in 0..vector {
            shared[unit * vector + e] = sums[r * vector + e];
        }
        sync_cube();
        // Column `col` is element `col % vector` of lane `col / vector`.
        let mut share = 0.0f32;
        for i in 0..per_group {
            let s = group * per_group + i;
            share += shared[(s * LINEAR_VECTORS + col / vector) * vector + col % vector];
        }
        totals[group * columns + col] = share;
        sync_cube();
        let row = first + r;
        if unit < LINEAR_VECTORS && column < vectors && row < m {
            let mut total = Vector::<f32, N>::empty();
            #[unroll]
            for e in 0..vector {
                let mut t = 0.0f32;
                for g in 0..groups {
                    t += totals[g * columns + unit * vector + e];
                }
                total[e] = f32::cast_from(F::cast_from(t));
            }
            let at = row * vectors + column;
            if comptime!(add_residual) {
                total += Vector::<f32, N>::cast_from(residual[at]);
            }
            out[at] = Vector::cast_from(total);
        }
    }
}
