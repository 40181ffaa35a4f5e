//! `nsa-bench launch`: what one kernel launch costs the host on this machine, the cost that
//! bounds a small step (a decode step is about a hundred launches). A kernel that does nearly
//! nothing is queued many times back to back and the queue timed to its closing sync, in four
//! forms: six tensor arguments (whose shapes and strides CubeCL uploads with each launch), the
//! same six as arrays (lengths only), the tensor form with a fresh output allocated per launch
//! (as each of our decode launches allocates), and one tensor argument.

use serde::Serialize;

/// One form's cost per launch.
#[derive(Debug, Clone, Serialize)]
pub struct LaunchCost {
    pub form: &'static str,
    pub launches: usize,
    /// Queue to closing sync, per launch.
    pub us_per_launch: f64,
    /// The host's time to queue them, per launch.
    pub queue_us_per_launch: f64,
}

#[cfg(any(feature = "cuda", feature = "wgpu"))]
mod kernels {
    use cubecl::prelude::*;

    #[cube(launch)]
    pub fn touch_tensors(
        a: &mut Tensor<f32>,
        b: &Tensor<f32>,
        c: &Tensor<f32>,
        d: &Tensor<f32>,
        e: &Tensor<f32>,
        f: &Tensor<f32>,
    ) {
        if ABSOLUTE_POS == 0 {
            a[0] = b[0] + c[0] + d[0] + e[0] + f[0] + f32::cast_from(b.shape(0));
        }
    }

    #[cube(launch)]
    pub fn touch_arrays(
        a: &mut Array<f32>,
        b: &Array<f32>,
        c: &Array<f32>,
        d: &Array<f32>,
        e: &Array<f32>,
        f: &Array<f32>,
    ) {
        if ABSOLUTE_POS == 0 {
            a[0] = b[0] + c[0] + d[0] + e[0] + f[0] + f32::cast_from(b.len());
        }
    }

    #[cube(launch)]
    pub fn touch_one(a: &mut Tensor<f32>) {
        if ABSOLUTE_POS == 0 {
            a[0] += f32::cast_from(a.shape(0));
        }
    }
}

/// Each form's cost over `launches` launches on `device`, after a warm-up that compiles them.
#[cfg(any(feature = "cuda", feature = "wgpu"))]
pub fn measure<R: burn_cubecl::CubeRuntime>(device: &R::Device, launches: usize) -> Vec<LaunchCost> {
    use std::time::Instant;

    use burn::tensor::backend::Backend;
    use burn::tensor::{Shape, Tensor};
    use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
    use burn_cubecl::tensor::CubeTensor;
    use cubecl::prelude::*;
    type C<R> = burn_cubecl::CubeBackend<R, f32, i32, u8>;

    let new = || -> CubeTensor<R> { Tensor::<C<R>, 1>::zeros([1024], device).into_primitive().tensor() };
    use kernels::{touch_arrays, touch_one, touch_tensors};
    let inputs: Vec<CubeTensor<R>> = (0..5).map(|_| new()).collect();
    let out = new();
    let client = out.client.clone();
    let (count, dim) = (CubeCount::new_1d(1), CubeDim::new_1d(32));
    let args = || inputs.iter().map(|x| x.clone().into_tensor_arg()).collect::<Vec<_>>();
    let tensors = |out: &CubeTensor<R>| {
        let [b, c, d, e, f]: [_; 5] = args().try_into().unwrap_or_else(|_| unreachable!());
        touch_tensors::launch::<R>(&client, count.clone(), dim, out.clone().into_tensor_arg(), b, c, d, e, f);
    };
    let arrays = || {
        let [b, c, d, e, f]: [_; 5] = inputs
            .iter()
            .map(|x| x.clone().into_array_arg())
            .collect::<Vec<_>>()
            .try_into()
            .unwrap_or_else(|_| unreachable!());
        touch_arrays::launch::<R>(&client, count.clone(), dim, out.clone().into_array_arg(), b, c, d, e, f);
    };
    let allocating = || {
        let fresh =
            empty_device_contiguous_dtype::<R>(client.clone(), out.device.clone(), Shape::new([1024]), out.dtype);
        tensors(&fresh);
    };
    let one = || touch_one::launch::<R>(&client, count.clone(), dim, out.clone().into_tensor_arg());
    let forms: [(&'static str, &dyn Fn()); 4] = [
        ("six tensors", &|| tensors(&out)),
        ("six arrays", &arrays),
        ("six tensors, an output allocated", &allocating),
        ("one tensor", &one),
    ];
    let sync = || <C<R> as Backend>::sync(device).expect("device sync");
    forms
        .iter()
        .map(|(form, launch)| {
            for _ in 0..launches.min(64) {
                launch();
            }
            sync();
            let start = Instant::now();
            for _ in 0..launches {
                launch();
            }
            let queued = start.elapsed().as_secs_f64();
            sync();
            let total = start.elapsed().as_secs_f64();
            let per = |s: f64| s * 1e6 / launches as f64;
            LaunchCost { form, launches, us_per_launch: per(total), queue_us_per_launch: per(queued) }
        })
        .collect()
}

/// [`measure`] on device 0 of the `cuda` or `wgpu` backend.
pub fn measure_on(kind: nsa_backend_kind::BackendKind, launches: usize) -> Result<Vec<LaunchCost>, String> {
    match kind {
        #[cfg(feature = "cuda")]
        nsa_backend_kind::BackendKind::Cuda => {
            Ok(measure::<burn::cubecl::cuda::CudaRuntime>(&Default::default(), launches))
        }
        #[cfg(feature = "wgpu")]
        nsa_backend_kind::BackendKind::Wgpu => {
            Ok(measure::<burn::cubecl::wgpu::WgpuRuntime>(&Default::default(), launches))
        }
        _ => {
            let _ = launches;
            Err(format!("launch costs are measured on the cuda or wgpu backend, not {}", kind.name()))
        }
    }
}
