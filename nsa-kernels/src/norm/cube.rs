//! `CubeBackend`: RMSNorm as the kernels of [`crate::norm::kernel`].

use burn::tensor::ops::{FloatTensor, FloatTensorOps};
use burn::tensor::{DType, Shape};
use burn_cubecl::element::BoolElement;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{CubeBackend, CubeRuntime, FloatElement, IntElement};
use cubecl::{calculate_cube_count_elemwise, CubeDim};

use super::{rms_norm_backward_tensor_ops, RmsNormBackend};
use crate::norm::kernel::{self as kernel, NORM_UNITS};

/// Rows per cube of the forward.
const FORWARD_ROWS: usize = 8;
/// The backward's row slots per cube hold `d` f32 each of the gain's shares: at most this many
/// bytes of them.
const SHARES_BYTES: usize = 32 * 1024;
/// Row groups each backward cube serves (fewer per-cube shares of the gain to add up).
const PASSES: usize = 8;

/// The widest vector that divides `d`.
fn vector_for<R: CubeRuntime>(x: &CubeTensor<R>, d: usize) -> usize {
    x.client.io_optimized_vector_sizes(x.dtype.size()).find(|v| d.is_multiple_of(*v)).unwrap_or(1)
}

fn empty<R: CubeRuntime>(like: &CubeTensor<R>, shape: Shape, dtype: DType) -> CubeTensor<R> {
    empty_device_contiguous_dtype::<R>(like.client.clone(), like.device.clone(), shape, dtype)
}

impl<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement> RmsNormBackend for CubeBackend<R, F, I, BT> {
    fn rms_norm(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        epsilon: f64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (x, gamma) = (into_contiguous(x), into_contiguous(gamma));
        let [rows, d] = x.meta.shape().dims::<2>();
        assert!(gamma.dtype == x.dtype, "RMSNorm's gain and input dtypes differ");
        let vector = vector_for(&x, d);
        let y = empty(&x, x.meta.shape().clone(), x.dtype);
        let rstd = empty(&x, Shape::new([rows]), DType::F32);
        let client = x.client.clone();
        let dim = CubeDim::new_1d((FORWARD_ROWS * NORM_UNITS) as u32);
        kernel::rms_norm_forward::launch::<R>(
            &client,
            calculate_cube_count_elemwise(&client, rows * NORM_UNITS, dim),
            dim,
            vector,
            x.clone().into_tensor_arg(),
            gamma.into_tensor_arg(),
            y.clone().into_tensor_arg(),
            rstd.clone().into_tensor_arg(),
            epsilon as f32,
            vector,
            FORWARD_ROWS,
            x.dtype.into(),
        );
        (y, rstd)
    }

    fn rms_norm_backward(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        rstd: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let [rows, d] = x.meta.shape().dims::<2>();
        let slots = (SHARES_BYTES / (4 * d)).min(FORWARD_ROWS);
        if slots == 0 {
            // A row too wide for the gain's shares in shared memory.
            return rms_norm_backward_tensor_ops::<Self>(x, gamma, rstd, grad);
        }
        let (x, gamma, grad) = (into_contiguous(x), into_contiguous(gamma), into_contiguous(grad));
        let vector = vector_for(&x, d);
        let grad_x = empty(&x, x.meta.shape().clone(), x.dtype);
        let cubes = rows.div_ceil(slots * PASSES);
        let partial = empty(&x, Shape::new([d, cubes]), DType::F32);
        let client = x.client.clone();
        let dim = CubeDim::new_1d((slots * NORM_UNITS) as u32);
        kernel::rms_norm_backward::launch::<R>(
            &client,
            calculate_cube_count_elemwise(&client, cubes * slots * NORM_UNITS, dim),
            dim,
            vector,
            x.clone().into_tensor_arg(),
            gamma.clone().into_tensor_arg(),
            into_contiguous(rstd).into_tensor_arg(),
            grad.into_tensor_arg(),
            grad_x.clone().into_tensor_arg(),
            partial.clone().into_tensor_arg(),
            vector,
            slots,
            PASSES,
            d,
            x.dtype.into(),
        );
        let grad_gamma = Self::float_reshape(Self::float_sum_dim(partial, 1), Shape::new([d]));
        (grad_x, Self::float_cast(grad_gamma, gamma.dtype.into()))
    }

    fn has_rms_norm_kernels() -> bool {
        true
    }
}
