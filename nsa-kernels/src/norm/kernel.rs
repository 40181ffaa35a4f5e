//! RMSNorm over rows of `d` (`x [rows, d]`, `gamma [d]`, all contiguous): `y = x r gamma` with
//! `r = 1 / sqrt(mean(x^2) + eps)` per row, in f32. A row is served by [`NORM_UNITS`] units, each
//! taking every `NORM_UNITS`-th vector of it; their partial sums meet in shared memory (no plane
//! operations, so WGPU runs them too).

use cubecl::prelude::*;

use crate::kernel::primitives::vectors::{dot, widen};

/// Units per row.
pub const NORM_UNITS: usize = 32;

/// Which row a unit serves. Units past the last row serve it again and write nothing.
#[derive(CubeType)]
struct NormRow {
    active: bool,
    lane: usize,
    /// The row's slot in the cube's shared partials.
    slot: usize,
    /// First vector of the row.
    at: usize,
    row: usize,
}

#[cube]
impl NormRow {
    fn new(row: usize, rows: usize, per_row: usize) -> NormRow {
        let clamped = min(row, rows - 1);
        NormRow {
            active: row < rows,
            lane: UNIT_POS as usize % NORM_UNITS,
            slot: UNIT_POS as usize / NORM_UNITS,
            at: clamped * per_row,
            row: clamped,
        }
    }

    /// The sum of the row's units' `value`s, for every unit of the row. Every unit of the cube
    /// calls it (it synchronises the cube).
    fn sum(&self, partials: &mut SharedMemory<f32>, value: f32) -> f32 {
        partials[self.slot * NORM_UNITS + self.lane] = value;
        sync_cube();
        let mut total = 0.0f32;
        for i in 0..NORM_UNITS {
            total += partials[self.slot * NORM_UNITS + i];
        }
        sync_cube();
        total
    }
}

/// `y = x r gamma` and `rstd[row] = r`. Cube `NORM_UNITS * rows` units, one row per
/// `NORM_UNITS`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn rms_norm_forward<F: Float, N: Size>(
    x: &Tensor<Vector<F, N>>,
    gamma: &Tensor<Vector<F, N>>,
    y: &mut Tensor<Vector<F, N>>,
    rstd: &mut Tensor<f32>,
    epsilon: f32,
    #[comptime] vector: usize,
    #[comptime] rows: usize,
    #[define(F)] _dtype: StorageType,
) {
    let d = gamma.shape(0);
    let per_row = d / vector;
    let row = NormRow::new(ABSOLUTE_POS / NORM_UNITS, rstd.shape(0), per_row);
    let mut partials = SharedMemory::<f32>::new(rows * NORM_UNITS);
    let mut squares = 0.0f32;
    let mut j = row.lane;
    while j < per_row {
        squares += dot::<F, N>(x[row.at + j], x[row.at + j], vector);
        j += NORM_UNITS;
    }
    let total = row.sum(&mut partials, squares);
    let r = 1.0f32 / (total / f32::cast_from(d) + epsilon).sqrt();
    if row.active {
        let mut j = row.lane;
        while j < per_row {
            y[row.at + j] = Vector::cast_from(widen::<F, N>(x[row.at + j]) * Vector::new(r) * widen::<F, N>(gamma[j]));
            j += NORM_UNITS;
        }
        if row.lane == 0 {
            rstd[row.row] = r;
        }
    }
}

/// `dx = r (gamma dy - xhat mean(gamma dy xhat))`, `xhat = x r`, and the cube's share of
/// `dgamma = sum_rows dy xhat` in `partial[:, cube]` (f32; column-major, so that the shares of
/// one column are one contiguous row to sum). A cube serves `passes` groups of
/// `rows` consecutive rows; each row slot adds its rows' shares in its own shared-memory row of
/// `d`, and the slots are summed once at the end.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn rms_norm_backward<F: Float, N: Size>(
    x: &Tensor<Vector<F, N>>,
    gamma: &Tensor<Vector<F, N>>,
    rstd: &Tensor<f32>,
    grad: &Tensor<Vector<F, N>>,
    grad_x: &mut Tensor<Vector<F, N>>,
    partial: &mut Tensor<f32>,
    #[comptime] vector: usize,
    #[comptime] rows: usize,
    #[comptime] passes: usize,
    #[comptime] d: usize,
    #[define(F)] _dtype: StorageType,
) {
    let per_row = d / vector;
    let mut partials = SharedMemory::<f32>::new(rows * NORM_UNITS);
    let mut shares = SharedMemory::<f32>::new(rows * d);
    let slot = UNIT_POS as usize / NORM_UNITS;
    let mut c = UNIT_POS as usize % NORM_UNITS;
    while c < d {
        shares[slot * d + c] = 0.0f32;
        c += NORM_UNITS;
    }
    for pass in 0..passes {
        let row = NormRow::new((CUBE_POS * passes + pass) * rows + slot, rstd.shape(0), per_row);
        let r = rstd[row.row];
        let mut inner = 0.0f32;
        let mut j = row.lane;
        while j < per_row {
            let x_hat = widen::<F, N>(x[row.at + j]) * Vector::new(r);
            inner += dot::<f32, N>(widen::<F, N>(grad[row.at + j]) * widen::<F, N>(gamma[j]), x_hat, vector);
            j += NORM_UNITS;
        }
        let mean = row.sum(&mut partials, inner) / f32::cast_from(d);
        if row.active {
            let mut j = row.lane;
            while j < per_row {
                let x_hat = widen::<F, N>(x[row.at + j]) * Vector::new(r);
                let dy = widen::<F, N>(grad[row.at + j]);
                grad_x[row.at + j] =
                    Vector::cast_from((dy * widen::<F, N>(gamma[j]) - x_hat * Vector::new(mean)) * Vector::new(r));
                let share = dy * x_hat;
                #[unroll]
                for e in 0..vector {
                    shares[slot * d + j * vector + e] += share[e];
                }
                j += NORM_UNITS;
            }
        }
    }
    sync_cube();
    let cubes = partial.shape(1);
    let mut c = UNIT_POS as usize;
    while c < d && CUBE_POS < cubes {
        let mut total = 0.0f32;
        #[unroll]
        for s in 0..rows {
            total += shares[s * d + c];
        }
        partial[c * cubes + CUBE_POS] = total;
        c += CUBE_DIM as usize;
    }
}
