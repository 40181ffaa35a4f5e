//! A decode step's linear layer over its few rows (one per sequence): `out = r + f(x) w`, with
//! `f` the layer's input function (nothing, the RMSNorm before it, the MLP's SiLU, or the
//! attention branches' gated mix) and `r` the residual stream when the layer adds into it. At one token per sequence the product
//! reads each weight once for a handful of rows, and every separate op costs the host a queued
//! task or two: so the norm, the activation, the mix and the residual add live in the
//! product's one launch.
//!
//! A cube serves [`LINEAR_ROWS`] rows at most and [`LINEAR_VECTORS`] vectors of columns. It
//! walks `k` in chunks of `per_slice` x [`LINEAR_SLICES`] (up to [`MAX_PER_SLICE`] a slice, as
//! many as the registers allow two cubes an SM): each unit first issues its `per_slice` loads of
//! `w`'s rows for the chunk (a product this thin is bound by how many loads are in flight),
//! then stages its share of `f(x)` for every row in shared memory (so `f` runs once per element
//! and cube), and the units, split into [`LINEAR_SLICES`] interleaved slices of the chunk, add
//! their products. The slices' sums (and the norm's squares) meet at the end: by plane shuffles,
//! then one row per plane in shared memory, where the device's planes are 32 wide; by a
//! shared-memory tree elsewhere.

use cubecl::prelude::*;

/// The product's extent, passed by value with the launch (as its arrays' lengths are): tensor
/// arguments would have their shapes and strides uploaded with every launch, a cost the host
/// pays about a hundred times a decode step.
#[derive(CubeType, CubeLaunch, Clone, Copy)]
pub struct LinearShape {
    /// Rows of `x` (the step's sequences).
    pub m: usize,
    /// Columns of `x`, rows of `w`.
    pub k: usize,
    /// Elements between rows of `x`.
    pub x_pitch: usize,
    /// Vectors of `w`'s (and the output's) columns.
    pub vectors: usize,
    /// Vectors between rows of `w` (CubeCL pads the rows of some allocations).
    pub w_pitch: usize,
    /// Heads of a gated mix (1 for the other input functions).
    pub heads: usize,
}

/// Units of a cube.
pub const LINEAR_UNITS: usize = 256;
/// Column vectors a cube serves.
pub const LINEAR_VECTORS: usize = 4;
/// Slices of `k` a cube's units split between them.
pub const LINEAR_SLICES: usize = LINEAR_UNITS / LINEAR_VECTORS;
/// Units of a plane where the kernel exchanges by plane shuffles.
const PLANE: usize = 32;
/// Rows a cube serves at most (its units hold `rows * vector` sums each).
pub const LINEAR_ROWS: usize = 4;
/// The most `k`s of a chunk each slice reads (its loads in flight at once).
pub const MAX_PER_SLICE: usize = 8;

/// Shared words of a cube: the staged chunk (`rows x chunk`), and before and after it the
/// norm's squares and the slices' sums (per plane and lane with plane shuffles, per unit in a
/// tree).
pub fn linear_shared_words(rows: usize, vector: usize, per_slice: usize, plane_exchange: bool) -> usize {
    let exchange = match plane_exchange {
        true => LINEAR_UNITS / PLANE * LINEAR_VECTORS * rows * vector,
        false => LINEAR_UNITS * rows * vector,
    };
    (rows * per_slice * LINEAR_SLICES).max(exchange)
}

/// `f(x[row, kk])` in f32, where `scale[local]` holds the row's `1 / rms` for a norm. For the
/// gated mix of the attention's branches (`mix`), `x` holds the compressed branch's outputs,
/// `selected` and `window` the others' (contiguous `[m, k]`) and `gamma` the gates (`[m * 3 H]`:
/// per row the three branches' gates of each head, head `h` owning columns `h d_v..`).
#[cube]
#[allow(clippy::too_many_arguments)]
fn input_at<F: Float>(
    x: &Array<F>,
    gamma: &Array<F>,
    selected: &Array<F>,
    window: &Array<F>,
    scale: &SharedMemory<f32>,
    shape: &LinearShape,
    row: usize,
    local: usize,
    kk: usize,
    #[comptime] norm: bool,
    #[comptime] silu: bool,
    #[comptime] mix: bool,
) -> f32 {
    let raw = f32::cast_from(x[row * shape.x_pitch + kk]);
    let mut value = raw;
    if comptime!(mix) {
        let (k, heads) = (shape.k, shape.heads);
        let g = row * 3 * heads + kk / (k / heads);
        let mixed = raw * f32::cast_from(gamma[g])
            + f32::cast_from(selected[row * k + kk]) * f32::cast_from(gamma[g + heads])
            + f32::cast_from(window[row * k + kk]) * f32::cast_from(gamma[g + 2 * heads]);
        value = f32::cast_from(F::cast_from(mixed));
    }
    if comptime!(norm) {
        value = f32::cast_from(F::cast_from(raw * scale[local] * f32::cast_from(gamma[kk])));
    }
    if comptime!(silu) {
        value = f32::cast_from(F::cast_from(raw / (1.0f32 + (0.0f32 - raw).exp())));
    }
    value
}

/// `1 / sqrt(mean(x[row]^2) + eps)` of the cube's rows into `scale`, each row's squares added
/// in `sums` (`rows * LINEAR_UNITS` words) by plane shuffles or a tree. Every unit of the cube
/// calls it (it synchronises).
#[cube]
#[allow(clippy::too_many_arguments)]
fn row_scales<F: Float>(
    x: &Array<F>,
    sums: &mut SharedMemory<f32>,
    scale: &mut SharedMemory<f32>,
    shape: &LinearShape,
    first: usize,
    epsilon: f32,
    #[comptime] rows: usize,
    #[comptime] plane_exchange: bool,
) {
    let (m, k) = (shape.m, shape.k);
    let unit = UNIT_POS as usize;
    let mut squares = Array::<f32>::new(rows);
    #[unroll]
    for r in 0..rows {
        let row = min(first + r, m - 1);
        squares[r] = 0.0f32;
        let mut kk = unit;
        while kk < k {
            let v = f32::cast_from(x[row * shape.x_pitch + kk]);
            squares[r] += v * v;
            kk += LINEAR_UNITS;
        }
    }
    if comptime!(plane_exchange) {
        let planes = comptime!(LINEAR_UNITS / PLANE);
        #[unroll]
        for r in 0..rows {
            let mut v = squares[r];
            #[unroll]
            for step in 0..5u32 {
                v += plane_shuffle_xor(v, comptime!(1u32 << step));
            }
            if unit % PLANE == 0 {
                sums[(unit / PLANE) * rows + r] = v;
            }
        }
        sync_cube();
        if unit < rows {
            let mut total = 0.0f32;
            #[unroll]
            for p in 0..planes {
                total += sums[p * rows + unit];
            }
            scale[unit] = 1.0f32 / (total / f32::cast_from(k) + epsilon).sqrt();
        }
    } else {
        #[unroll]
        for r in 0..rows {
            sums[r * LINEAR_UNITS + unit] = squares[r];
        }
        halve_rows(sums, unit, 1usize, comptime!(rows * LINEAR_UNITS), LINEAR_UNITS);
        if unit < rows {
            scale[unit] = 1.0f32 / (sums[unit * LINEAR_UNITS] / f32::cast_from(k) + epsilon).sqrt();
        }
    }
    sync_cube();
}

/// Adds each row of `width` words of `shared` (`words / width` rows) into its first `spacing`
/// words by halving: after it, `shared[i * width + p]` holds the sum of row `i`'s words `p, p +
/// spacing, ..` for `p < spacing`. `width / spacing` is a power of two and the cube has `width`
/// units, unit `u` adding word `u` of every row. Called by every unit (it synchronises before
/// and after).
#[cube]
fn halve_rows(
    shared: &mut SharedMemory<f32>,
    unit: usize,
    #[comptime] spacing: usize,
    #[comptime] words: usize,
    #[comptime] width: usize,
) {
    #[unroll]
    for i in 0..comptime!((width / spacing).trailing_zeros() as usize) {
        let step = comptime!(((width / spacing) >> (i + 1)) * spacing);
        sync_cube();
        if unit < step {
            let mut at = unit;
            while at < words {
                shared[at] += shared[at + step];
                at += width;
            }
        }
    }
    sync_cube();
}

/// `out [m, n] = residual + f(x [m, k]) w [k, n]` (`out` and `residual` contiguous; `x` and `w`
/// with contiguous rows, `n` and `w`'s row stride multiples of `vector`; `gamma [k]` read only
/// by a norm, `residual` only when `add_residual`). Cubes
/// `(ceil(n / (LINEAR_VECTORS vector)), ceil(m / rows))` of [`LINEAR_UNITS`] units; chunks of
/// `per_slice x LINEAR_SLICES` `k`s.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn decode_linear<F: Float, N: Size>(
    x: &Array<F>,
    w: &Array<Vector<F, N>>,
    gamma: &Array<F>,
    selected: &Array<F>,
    window: &Array<F>,
    residual: &Array<Vector<F, N>>,
    out: &mut Array<Vector<F, N>>,
    shape: LinearShape,
    epsilon: f32,
    #[comptime] vector: usize,
    #[comptime] rows: usize,
    #[comptime] per_slice: usize,
    #[comptime] norm: bool,
    #[comptime] silu: bool,
    #[comptime] mix: bool,
    #[comptime] add_residual: bool,
    #[comptime] plane_exchange: bool,
    #[define(F)] _dtype: StorageType,
) {
    let (m, k) = (shape.m, shape.k);
    let vectors = shape.vectors;
    // Rows of `w` may be padded (CubeCL pitches the rows of some allocations).
    let pitch = shape.w_pitch;
    let unit = UNIT_POS as usize;
    let lane = unit % LINEAR_VECTORS;
    let (column, slice) = (min(CUBE_POS_X as usize * LINEAR_VECTORS + lane, vectors - 1), unit / LINEAR_VECTORS);
    let first = CUBE_POS_Y as usize * rows;
    let chunk = comptime!(per_slice * LINEAR_SLICES);
    let mut shared = SharedMemory::<f32>::new(comptime!(linear_shared_words(rows, vector, per_slice, plane_exchange)));
    let mut scale = SharedMemory::<f32>::new(rows);
    if comptime!(norm) {
        row_scales::<F>(x, &mut shared, &mut scale, &shape, first, epsilon, rows, plane_exchange);
    }

    let mut sums = Array::<f32>::new(comptime!(rows * vector));
    #[unroll]
    for i in 0..rows * vector {
        sums[i] = 0.0f32;
    }
    let mut base = 0;
    while base < k {
        // The chunk's weights first, so that their loads are in flight while `f(x)` is staged.
        // Past `k` the clamped rows meet staged zeros and add nothing.
        let mut weights = Array::<Vector<F, N>>::new(per_slice);
        #[unroll]
        for i in 0..per_slice {
            weights[i] = w[min(base + slice + i * LINEAR_SLICES, k - 1) * pitch + column];
        }
        stage_chunk::<F>(
            x,
            gamma,
            selected,
            window,
            &scale,
            &mut shared,
            &shape,
            base,
            first,
            rows,
            chunk,
            norm,
            silu,
            mix,
        );
        #[unroll]
        for i in 0..per_slice {
            let j = slice + i * LINEAR_SLICES;
            let weight = Vector::<f32, N>::cast_from(weights[i]);
            #[unroll]
            for r in 0..rows {
                let a = shared[r * chunk + j];
                #[unroll]
                for e in 0..vector {
                    sums[r * vector + e] += a * weight[e];
                }
            }
        }
        sync_cube();
        base += chunk;
    }

    let in_cube = CUBE_POS_X as usize * LINEAR_VECTORS + lane < vectors;
    if comptime!(plane_exchange) {
        // A plane holds eight slices of the four lanes: xor over the slice bits, then the
        // planes' sums meet in shared memory, word `(plane LINEAR_VECTORS + lane) rows vector + i`.
        let width = comptime!(rows * vector);
        #[unroll]
        for i in 0..rows * vector {
            let mut v = sums[i];
            #[unroll]
            for step in 0..3u32 {
                v += plane_shuffle_xor(v, comptime!((LINEAR_VECTORS as u32) << step));
            }
            sums[i] = v;
        }
        if unit % PLANE < LINEAR_VECTORS {
            #[unroll]
            for i in 0..rows * vector {
                shared[(unit / PLANE * LINEAR_VECTORS + lane) * width + i] = sums[i];
            }
        }
        sync_cube();
        // Unit `r LINEAR_VECTORS + lane` writes row `r` of its lane's columns.
        let r = unit / LINEAR_VECTORS;
        if r < rows && in_cube {
            let mut total = Vector::<f32, N>::empty();
            #[unroll]
            for e in 0..vector {
                let mut t = 0.0f32;
                #[unroll]
                for p in 0..comptime!(LINEAR_UNITS / PLANE) {
                    t += shared[(p * LINEAR_VECTORS + lane) * width + r * vector + e];
                }
                total[e] = t;
            }
            write_row::<F, N>(residual, out, total, first + r, m, vectors, column, add_residual);
        }
    } else {
        // Word `(r vector + e) LINEAR_UNITS + unit` holds this unit's column `e` of row `r`; a
        // tree over the slices leaves each total at its lane's slice-0 unit.
        #[unroll]
        for i in 0..rows * vector {
            shared[i * LINEAR_UNITS + unit] = sums[i];
        }
        halve_rows(&mut shared, unit, LINEAR_VECTORS, comptime!(rows * vector * LINEAR_UNITS), LINEAR_UNITS);
        if slice == 0 && in_cube {
            #[unroll]
            for r in 0..rows {
                let mut total = Vector::<f32, N>::empty();
                #[unroll]
                for e in 0..vector {
                    total[e] = shared[(r * vector + e) * LINEAR_UNITS + lane];
                }
                write_row::<F, N>(residual, out, total, first + r, m, vectors, column, add_residual);
            }
        }
    }
}

/// Row `row`'s (when `row < m`) output vector `column` from its f32 sums: rounded to `F`, then
/// plus the residual's.
#[cube]
#[allow(clippy::too_many_arguments)]
fn write_row<F: Float, N: Size>(
    residual: &Array<Vector<F, N>>,
    out: &mut Array<Vector<F, N>>,
    sums: Vector<f32, N>,
    row: usize,
    m: usize,
    vectors: usize,
    column: usize,
    #[comptime] add_residual: bool,
) {
    if row < m {
        let mut total = Vector::<f32, N>::cast_from(Vector::<F, N>::cast_from(sums));
        let at = row * vectors + column;
        if comptime!(add_residual) {
            total += Vector::<f32, N>::cast_from(residual[at]);
        }
        out[at] = Vector::cast_from(total);
    }
}

/// `f(x)` of `k`s `base..base + chunk` of the cube's rows into `shared[r * chunk + j]` (zeros
/// past `k`), then a barrier.
#[cube]
#[allow(clippy::too_many_arguments)]
fn stage_chunk<F: Float>(
    x: &Array<F>,
    gamma: &Array<F>,
    selected: &Array<F>,
    window: &Array<F>,
    scale: &SharedMemory<f32>,
    shared: &mut SharedMemory<f32>,
    shape: &LinearShape,
    base: usize,
    first: usize,
    #[comptime] rows: usize,
    #[comptime] chunk: usize,
    #[comptime] norm: bool,
    #[comptime] silu: bool,
    #[comptime] mix: bool,
) {
    let (m, k) = (shape.m, shape.k);
    #[unroll]
    for i in 0..comptime!(chunk.div_ceil(LINEAR_UNITS)) {
        let j = UNIT_POS as usize + i * LINEAR_UNITS;
        if j < chunk {
            #[unroll]
            for r in 0..rows {
                let mut value = 0.0f32;
                if base + j < k {
                    let row = min(first + r, m - 1);
                    value = input_at::<F>(x, gamma, selected, window, scale, shape, row, r, base + j, norm, silu, mix);
                }
                shared[r * chunk + j] = value;
            }
        }
    }
    sync_cube();
}
