//! `CubeBackend`: the mix and its backward as the kernels of [`crate::mix::kernel`].

use burn::tensor::ops::FloatTensor;
use burn::tensor::Shape;
use burn_cubecl::element::BoolElement;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{CubeBackend, CubeRuntime, FloatElement, IntElement};
use cubecl::prelude::*;
use cubecl::{calculate_cube_count_elemwise, CubeDim};

use super::GatedMixBackend;
use crate::mix::kernel;

/// Units per cube of the backward (whole rows of `d / vector` units each).
const BACKWARD_UNITS: usize = 256;

/// The inputs, contiguous, and the vector width that divides the head dimension.
struct Mix<R: CubeRuntime> {
    branches: [CubeTensor<R>; 3],
    gates: CubeTensor<R>,
    vector: usize,
}

impl<R: CubeRuntime> Mix<R> {
    fn new(branches: [CubeTensor<R>; 3], gates: CubeTensor<R>) -> Self {
        let shape = branches[0].meta.shape().clone();
        assert!(shape.num_dims() == 4, "the mix takes [B, T, H, d] branch outputs");
        assert!(branches.iter().all(|o| *o.meta.shape() == shape), "the branch outputs' shapes differ");
        let [b, t, h, d] = shape.dims::<4>();
        assert!(*gates.meta.shape() == Shape::new([b, t, 3, h]), "the gates are not [B, T, 3, H]");
        assert!(branches.iter().all(|o| o.dtype == gates.dtype), "the gates' dtype differs from the branches'");
        let client = gates.client.clone();
        let vector = client.io_optimized_vector_sizes(gates.dtype.size()).find(|v| d % v == 0).unwrap_or(1);
        Mix { branches: branches.map(into_contiguous), gates: into_contiguous(gates), vector }
    }

    fn client(&self) -> ComputeClient<R> {
        self.gates.client.clone()
    }

    fn empty_like(&self, like: &CubeTensor<R>) -> CubeTensor<R> {
        empty_device_contiguous_dtype::<R>(self.client(), like.device.clone(), like.meta.shape().clone(), like.dtype)
    }

    fn forward(&self) -> CubeTensor<R> {
        let out = self.empty_like(&self.branches[0]);
        let dim = CubeDim::new_1d(256);
        let [o_0, o_1, o_2] = self.branches.clone().map(|o| o.into_tensor_arg());
        kernel::gated_mix::launch::<R>(
            &self.client(),
            calculate_cube_count_elemwise(&self.client(), out.meta.shape().num_elements() / self.vector, dim),
            dim,
            self.vector,
            o_0,
            o_1,
            o_2,
            self.gates.clone().into_tensor_arg(),
            out.clone().into_tensor_arg(),
            self.vector,
            out.dtype.into(),
        );
        out
    }

    fn backward(&self, grad: CubeTensor<R>) -> ([CubeTensor<R>; 3], CubeTensor<R>) {
        let grad = into_contiguous(grad);
        let branch_grads = [0, 1, 2].map(|_| self.empty_like(&grad));
        let gate_grads = self.empty_like(&self.gates);
        let per_row = grad.meta.shape()[3] / self.vector;
        let rows = (BACKWARD_UNITS / per_row).max(1);
        let dim = CubeDim::new_2d(per_row as u32, rows as u32);
        let row_count = grad.meta.shape().num_elements() / grad.meta.shape()[3];
        let [o_0, o_1, o_2] = self.branches.clone().map(|o| o.into_tensor_arg());
        let [d_0, d_1, d_2] = branch_grads.clone().map(|d| d.into_tensor_arg());
        kernel::gated_mix_backward::launch::<R>(
            &self.client(),
            calculate_cube_count_elemwise(&self.client(), row_count.div_ceil(rows) * dim.num_elems() as usize, dim),
            dim,
            self.vector,
            o_0,
            o_1,
            o_2,
            self.gates.clone().into_tensor_arg(),
            grad.clone().into_tensor_arg(),
            d_0,
            d_1,
            d_2,
            gate_grads.clone().into_tensor_arg(),
            self.vector,
            per_row,
            rows,
            grad.dtype.into(),
        );
        (branch_grads, gate_grads)
    }
}

impl<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement> GatedMixBackend for CubeBackend<R, F, I, BT> {
    fn gated_mix(branches: [FloatTensor<Self>; 3], gates: FloatTensor<Self>) -> FloatTensor<Self> {
        Mix::new(branches, gates).forward()
    }

    fn gated_mix_backward(
        branches: [FloatTensor<Self>; 3],
        gates: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> ([FloatTensor<Self>; 3], FloatTensor<Self>) {
        Mix::new(branches, gates).backward(grad)
    }
}
