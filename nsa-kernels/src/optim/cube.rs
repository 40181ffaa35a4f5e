//! [`FusedAdamWBackend`] for `CubeBackend` (CUDA, WGPU): per parameter one sum-of-squares
//! launch into a shared buffer of partials, one launch that turns them into the norm and the clip
//! factor, then per parameter one update launch that reads the factor on the device (no host
//! read anywhere).

use burn::tensor::{DType, Device, FloatDType, Shape};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::{empty_device_contiguous_dtype, zeros_client};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{element::BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use cubecl::prelude::*;
use cubecl::{calculate_cube_count_elemwise, CubeDim};

use super::kernel::{adamw_update, clip_factor, square_sums, UNITS};
use super::{AdamWHyper, AdamWSlot, AdamWUpdate, FusedAdamWBackend};

/// Cubes of a sum of squares at most: enough to fill the device on the largest parameters, few
/// enough that the partials stay a small buffer.
const MAX_SUM_CUBES: usize = 128;

/// The widest vector (4, 2 or 1 elements) that divides `n`.
fn vector_for(n: usize) -> usize {
    [4, 2, 1].into_iter().find(|v| n.is_multiple_of(*v)).unwrap_or(1)
}

impl<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement> FusedAdamWBackend for CubeBackend<R, F, I, BT> {
    fn adamw_step(
        slots: Vec<AdamWSlot<Self>>,
        hyper: AdamWHyper,
        compute: Option<FloatDType>,
        device: &Device<Self>,
    ) -> (Vec<AdamWUpdate<Self>>, CubeTensor<R>) {
        let launcher = Launcher::<R> { client: R::client(device), device: device.clone() };
        let slots: Vec<AdamWSlot<Self>> = slots
            .into_iter()
            .map(|s| AdamWSlot {
                param: into_contiguous(s.param),
                grad: into_contiguous(s.grad),
                moment_1: into_contiguous(s.moment_1),
                moment_2: into_contiguous(s.moment_2),
                ..s
            })
            .collect();
        let (norm, factor) = launcher.clip(&slots, hyper.max_norm);
        let updates = slots.into_iter().map(|slot| launcher.update(slot, &factor, hyper, compute)).collect();
        (updates, norm)
    }
}

/// The launches of one optimiser step on one device.
struct Launcher<R: CubeRuntime> {
    client: ComputeClient<R>,
    device: R::Device,
}

impl<R: CubeRuntime> Launcher<R> {
    fn empty(&self, shape: Shape, dtype: DType) -> CubeTensor<R> {
        empty_device_contiguous_dtype::<R>(self.client.clone(), self.device.clone(), shape, dtype)
    }

    /// The global norm of the slots' gradients and the clip factor for `max_norm` (1 when it is
    /// 0 or the norm is below it), each a one-element f32 tensor on the device.
    fn clip<B: burn::tensor::backend::Backend<FloatTensorPrimitive = CubeTensor<R>>>(
        &self,
        slots: &[AdamWSlot<B>],
        max_norm: f64,
    ) -> (CubeTensor<R>, CubeTensor<R>) {
        let dim = CubeDim::new_1d(UNITS as u32);
        // Sums of squares: each slot's cubes write their own run of partials.
        let cubes: Vec<usize> = slots
            .iter()
            .map(|s| {
                let vectors = s.grad.meta.num_elements() / vector_for(s.grad.meta.num_elements());
                vectors.div_ceil(UNITS).clamp(1, MAX_SUM_CUBES)
            })
            .collect();
        let partials = match slots.is_empty() {
            // No gradients: a norm of zero (the clip kernel sums one zeroed partial).
            true => zeros_client::<R>(self.client.clone(), self.device.clone(), Shape::new([1]), DType::F32),
            false => self.empty(Shape::new([cubes.iter().sum::<usize>()]), DType::F32),
        };
        let mut base = 0;
        for (slot, &count) in slots.iter().zip(&cubes) {
            let vector = vector_for(slot.grad.meta.num_elements());
            square_sums::launch::<R>(
                &self.client,
                CubeCount::Static(count as u32, 1, 1),
                dim,
                vector,
                slot.grad.clone().into_tensor_arg(),
                partials.clone().into_tensor_arg(),
                base as u32,
                vector,
                slot.grad.dtype.into(),
            );
            base += count;
        }
        let norm = self.empty(Shape::new([1]), DType::F32);
        let factor = self.empty(Shape::new([1]), DType::F32);
        clip_factor::launch::<R>(
            &self.client,
            CubeCount::Static(1, 1, 1),
            dim,
            partials.into_tensor_arg(),
            norm.clone().into_tensor_arg(),
            factor.clone().into_tensor_arg(),
            max_norm as f32,
            max_norm > 0.0,
        );
        (norm, factor)
    }

    /// One parameter's update with its gradient scaled by `factor`, and its copy in `compute`.
    fn update<B: burn::tensor::backend::Backend<FloatTensorPrimitive = CubeTensor<R>>>(
        &self,
        slot: AdamWSlot<B>,
        factor: &CubeTensor<R>,
        hyper: AdamWHyper,
        compute: Option<FloatDType>,
    ) -> AdamWUpdate<B> {
        let dim = CubeDim::new_1d(UNITS as u32);
        let shape = slot.param.meta.shape().clone();
        let n = shape.num_elements();
        let vector = vector_for(n);
        let dtype = slot.param.dtype;
        let [param, moment_1, moment_2] = [0; 3].map(|_| self.empty(shape.clone(), dtype));
        // Without a compute dtype the kernel writes no copy: a one-element stand-in.
        let out = match compute {
            Some(c) => self.empty(shape.clone(), DType::from(c)),
            None => self.empty(Shape::new([1]), dtype),
        };
        let s = hyper.scalars(slot.time, slot.decay);
        adamw_update::launch::<R>(
            &self.client,
            calculate_cube_count_elemwise(&self.client, n / vector, dim),
            dim,
            vector,
            slot.param.into_tensor_arg(),
            slot.grad.clone().into_tensor_arg(),
            slot.moment_1.into_tensor_arg(),
            slot.moment_2.into_tensor_arg(),
            factor.clone().into_tensor_arg(),
            param.clone().into_tensor_arg(),
            moment_1.clone().into_tensor_arg(),
            moment_2.clone().into_tensor_arg(),
            out.clone().into_tensor_arg(),
            s.lr,
            s.decay,
            s.beta_1,
            s.beta_2,
            s.rest_1,
            s.rest_2,
            s.correction_1,
            s.correction_2,
            s.epsilon,
            compute.is_some(),
            [dtype.into(), slot.grad.dtype.into(), out.dtype.into()],
        );
        AdamWUpdate { param, moment_1, moment_2, compute: compute.map(|_| out) }
    }
}
