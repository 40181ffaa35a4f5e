//! `CubeBackend`: a step's linear layer as [`crate::kernel::decode::linear::decode_linear`].

use burn::tensor::Shape;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::prelude::*;

use super::StepInput;
use crate::kernel::decode::linear::{
    decode_linear, LinearShapeLaunch, LINEAR_ROWS, LINEAR_SLICES, LINEAR_UNITS, LINEAR_VECTORS, MAX_PER_SLICE,
};
use crate::sparse::launch::planes_of_32;

/// The widest vector of `x`'s element that divides `n` and `pitch`, at most 8 (each unit holds
/// `rows * vector` sums).
fn vector_for<R: CubeRuntime>(x: &CubeTensor<R>, n: usize, pitch: usize) -> usize {
    let fits = |v: &usize| *v <= 8 && n.is_multiple_of(*v) && pitch.is_multiple_of(*v);
    x.client.io_optimized_vector_sizes(x.dtype.size()).find(fits).unwrap_or(1)
}

/// `x` itself when its rows are contiguous (they may be padded), else a contiguous copy.
fn rows_contiguous<R: CubeRuntime>(x: CubeTensor<R>) -> CubeTensor<R> {
    match x.meta.strides()[1] == 1 {
        true => x,
        false => into_contiguous(x),
    }
}

/// Launches `residual + f(x) weight` for `x [M, K]`, `weight [K, N]`, `residual [M, N]` (see
/// [`super::StepLinear`]).
pub(super) fn launch<R: CubeRuntime>(
    x: CubeTensor<R>,
    input: StepInput<CubeTensor<R>>,
    weight: CubeTensor<R>,
    residual: Option<CubeTensor<R>>,
) -> CubeTensor<R> {
    // Padded rows are read where they lie: a step must not copy a weight each time.
    let (x, weight) = (rows_contiguous(x), rows_contiguous(weight));
    let ([m, k], [k_w, n]) = (x.meta.shape().dims::<2>(), weight.meta.shape().dims::<2>());
    assert_eq!(k, k_w, "the step's input has {k} columns, the weight {k_w} rows");
    let dtype = x.dtype;
    let (norm, silu) = (matches!(input, StepInput::Norm(..)), matches!(input, StepInput::Silu));
    let mix = matches!(input, StepInput::Mix { .. });
    let heads = match &input {
        StepInput::Mix { gates, .. } => gates.meta.shape().num_elements() / (3 * m),
        _ => 1,
    };
    // Unread placeholders where the input function reads no gain, gates or other branches.
    let (gamma, [selected, window], epsilon) = match input {
        StepInput::Norm(gamma, epsilon) => (into_contiguous(gamma), [x.clone(), x.clone()], epsilon),
        StepInput::Mix { selected, window, gates } => {
            (into_contiguous(gates), [into_contiguous(selected), into_contiguous(window)], 0.0)
        }
        _ => (x.clone(), [x.clone(), x.clone()], 0.0),
    };
    assert!(
        !mix || (x.meta.strides()[0] == k && selected.meta.shape().num_elements() == m * k),
        "a step's gated mix takes its branches contiguous, [{m}, {k}] each"
    );
    let add_residual = residual.is_some();
    let residual = residual.map(into_contiguous).unwrap_or_else(|| x.clone());
    assert!(
        weight.dtype == dtype && gamma.dtype == dtype && residual.dtype == dtype && selected.dtype == dtype,
        "a decode step's linear layer takes its weight, gain, gates, branches and residual in its input's dtype ({dtype:?})"
    );
    let client = x.client.clone();
    let out = empty_device_contiguous_dtype::<R>(client.clone(), x.device.clone(), Shape::new([m, n]), dtype);
    let vector = vector_for(&x, n, weight.meta.strides()[0]);
    let shape = LinearShapeLaunch::new(m, k, x.meta.strides()[0], n / vector, weight.meta.strides()[0] / vector, heads);
    let rows = m.min(LINEAR_ROWS);
    // One chunk for most layers' `k`, a few for the widest.
    let per_slice = k.div_ceil(LINEAR_SLICES).clamp(1, MAX_PER_SLICE);
    let cubes = CubeCount::new_2d(n.div_ceil(vector * LINEAR_VECTORS) as u32, m.div_ceil(rows) as u32);
    decode_linear::launch::<R>(
        &client,
        cubes,
        CubeDim::new_1d(LINEAR_UNITS as u32),
        vector,
        x.into_array_arg(),
        weight.into_array_arg(),
        gamma.into_array_arg(),
        selected.into_array_arg(),
        window.into_array_arg(),
        residual.into_array_arg(),
        out.clone().into_array_arg(),
        shape,
        epsilon as f32,
        vector,
        rows,
        per_slice,
        norm,
        silu,
        mix,
        add_residual,
        planes_of_32(&client),
        dtype.into(),
    );
    out
}
