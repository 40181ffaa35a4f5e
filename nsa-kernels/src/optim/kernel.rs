//! The fused optimiser's kernels: a sum of squares per gradient (partials, then one total), and
//! the AdamW update of one parameter with its clipped gradient, both moments and the compute
//! copy in one pass over memory.

use cubecl::prelude::*;

/// Units per cube of every kernel here.
pub const UNITS: usize = 256;

/// Sums `shared[0..UNITS]` into `shared[0]` (a tree over the cube). Called by every unit.
#[cube]
fn cube_sum(shared: &mut SharedMemory<f32>) {
    let unit = UNIT_POS as usize;
    // `CUBE_DIM` (= UNITS) rather than the constant: a loop variable must be a runtime value.
    let mut half = CUBE_DIM as usize / 2;
    while half > 0 {
        sync_cube();
        if unit < half {
            shared[unit] += shared[unit + half];
        }
        half /= 2;
    }
    sync_cube();
}

/// `partials[base + c]` = the sum of squares, in f32, of the vectors of `grad` that cube `c`
/// strides over (`c, c + cubes, ..` in units of the cube's width).
#[cube(launch)]
pub fn square_sums<G: Float, N: Size>(
    grad: &Tensor<Vector<G, N>>,
    partials: &mut Tensor<f32>,
    base: u32,
    #[comptime] vector: usize,
    #[define(G)] _dtype: StorageType,
) {
    let mut acc = Vector::<f32, N>::new(0.0f32);
    let stride = CUBE_COUNT_X as usize * UNITS;
    let mut i = CUBE_POS_X as usize * UNITS + UNIT_POS as usize;
    while i < grad.len() {
        let g = Vector::<f32, N>::cast_from(grad[i]);
        acc += g * g;
        i += stride;
    }
    let mut shared = SharedMemory::<f32>::new(UNITS);
    let mut sum = 0.0f32;
    #[unroll]
    for e in 0..vector {
        sum += acc[e];
    }
    shared[UNIT_POS as usize] = sum;
    cube_sum(&mut shared);
    if UNIT_POS == 0 {
        partials[base as usize + CUBE_POS_X as usize] = shared[0];
    }
}

/// One cube: `norm[0]` = the global L2 norm of the gradients (the square root of all
/// `partials`), and `factor[0]` the clip's scale `min(max_norm / (norm + 1e-6), 1)`, or 1 when
/// not clipping (written the way the tensor-op clip computes it).
#[cube(launch)]
pub fn clip_factor(
    partials: &Tensor<f32>,
    norm: &mut Tensor<f32>,
    factor: &mut Tensor<f32>,
    max_norm: f32,
    #[comptime] clips: bool,
) {
    let mut sum = 0.0f32;
    let mut i = UNIT_POS as usize;
    while i < partials.len() {
        sum += partials[i];
        i += UNITS;
    }
    let mut shared = SharedMemory::<f32>::new(UNITS);
    shared[UNIT_POS as usize] = sum;
    cube_sum(&mut shared);
    if UNIT_POS == 0 {
        let total = f32::sqrt(shared[0]);
        norm[0] = total;
        if clips {
            factor[0] = f32::min((1.0f32 / (total + 1e-6f32)) * max_norm, 1.0f32);
        } else {
            factor[0] = 1.0f32;
        }
    }
}

/// AdamW on one parameter, one vector per unit: the gradient scaled by the clip's `factor`, the
/// moments' moving averages, the bias-corrected step, decoupled weight decay, and (with
/// `compute`) the new weights cast to the compute dtype. The scalars: the learning rate, the
/// weight-decay factor `1 - lr * wd` (or 1), the betas and `1 - beta`, the bias corrections
/// `1 - beta^t` and epsilon. Each value is computed with the same operations, in the same order,
/// as Burn's `AdamW` and the tensor-op clip and decay ([`super::reference`]).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn adamw_update<P: Float, G: Float, C: Float, N: Size>(
    param: &Tensor<Vector<P, N>>,
    grad: &Tensor<Vector<G, N>>,
    moment_1: &Tensor<Vector<P, N>>,
    moment_2: &Tensor<Vector<P, N>>,
    factor: &Tensor<f32>,
    param_out: &mut Tensor<Vector<P, N>>,
    moment_1_out: &mut Tensor<Vector<P, N>>,
    moment_2_out: &mut Tensor<Vector<P, N>>,
    compute_out: &mut Tensor<Vector<C, N>>,
    lr: f32,
    decay: f32,
    beta_1: f32,
    beta_2: f32,
    rest_1: f32,
    rest_2: f32,
    correction_1: f32,
    correction_2: f32,
    epsilon: f32,
    #[comptime] compute: bool,
    #[define(P, G, C)] _dtypes: [StorageType; 3],
) {
    let i = ABSOLUTE_POS;
    if i >= param.len() {
        terminate!();
    }
    let g = Vector::<P, N>::cast_from(grad[i]) * Vector::<P, N>::new(P::cast_from(factor[0]));
    let m = moment_1[i] * Vector::<P, N>::new(P::cast_from(beta_1)) + g * Vector::<P, N>::new(P::cast_from(rest_1));
    let v = moment_2[i] * Vector::<P, N>::new(P::cast_from(beta_2)) + g * g * Vector::<P, N>::new(P::cast_from(rest_2));
    let m_hat = m / Vector::<P, N>::new(P::cast_from(correction_1));
    let v_hat = v / Vector::<P, N>::new(P::cast_from(correction_2));
    let delta = m_hat / (Vector::sqrt(v_hat) + Vector::<P, N>::new(P::cast_from(epsilon)));
    let p = param[i] * Vector::<P, N>::new(P::cast_from(decay)) - delta * Vector::<P, N>::new(P::cast_from(lr));
    moment_1_out[i] = m;
    moment_2_out[i] = v;
    param_out[i] = p;
    if compute {
        compute_out[i] = Vector::<C, N>::cast_from(p);
    }
}
