//! WIP diagnostic (branch only): expands the tensor-core kernels on WGPU to catch CubeCL
//! expansion errors without a GPU; WGSL has no CMMA, so the compile step after expansion fails.
//! The failure is a panic on the device thread, which these tests cannot catch: run with
//! `--nocapture` and read it. "Cooperative matrix-multiply and accumulate not supported" from
//! the WGSL compiler means the kernel expanded; any other panic is an expansion error.

use burn::backend::wgpu::{CubeBackend, WgpuDevice, WgpuRuntime};
use burn::tensor::{DType, Tensor};
use cubecl::prelude::*;
use cubecl::CubeDim;

type B = CubeBackend<WgpuRuntime, f32, i32, u32>;

fn t(shape: [usize; 4], device: &WgpuDevice) -> burn_cubecl::tensor::CubeTensor<WgpuRuntime> {
    Tensor::<B, 4>::zeros(shape, device).into_primitive().tensor()
}

fn u(shape: [usize; 3], device: &WgpuDevice) -> burn_cubecl::tensor::CubeTensor<WgpuRuntime> {
    Tensor::<B, 3, burn::tensor::Int>::zeros(shape, device).cast(DType::U32).into_primitive()
}

#[test]
fn expand_mma_key_kernel() {
    let device = WgpuDevice::default();
    let (q, k, v, go) = (t([1, 64, 2, 64], &device), t([1, 64, 1, 64], &device), t([1, 64, 1, 64], &device), t([1, 64, 2, 64], &device));
    let stat = Tensor::<B, 3>::zeros([1, 64, 2], &device).into_primitive().tensor();
    let client = q.client.clone();
    for window in [false, true] {
    let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        nsa_kernels::kernel::mma_backward::attention_backward_key_mma::launch::<WgpuRuntime>(
            &client,
            CubeCount::Static(1, 1, 1),
            CubeDim::new_2d(32, 4),
            q.clone().into_tensor_arg(),
            k.clone().into_tensor_arg(),
            v.clone().into_tensor_arg(),
            go.clone().into_tensor_arg(),
            stat.clone().into_tensor_arg(),
            stat.clone().into_tensor_arg(),
            u([1, 1, 1], &device).into_tensor_arg(),
            u([1, 1, 1], &device).into_tensor_arg(),
            u([1, 1, 1], &device).into_tensor_arg(),
            u([1, 1, 1], &device).into_tensor_arg(),
            u([1, 1, 1], &device).into_tensor_arg(),
            u([1, 1, 1], &device).into_tensor_arg(),
            t([1, 64, 1, 64], &device).into_tensor_arg(),
            t([1, 64, 1, 64], &device).into_tensor_arg(),
            Tensor::<B, 3>::zeros([1, 1, 1], &device).into_primitive().tensor().into_tensor_arg(),
            0.125,
            512,
            512,
            window,
            64,
            64,
            4,
            64,
            DType::F16.into(),
        );
        <B as burn::tensor::backend::Backend>::sync(&device).unwrap();
    }));
    match res {
        Ok(()) => println!("launched (unexpected on WGSL)"),
        Err(e) => println!("panic: {:?}", e.downcast_ref::<String>().cloned().or(e.downcast_ref::<&str>().map(|s| s.to_string()))),
    }
    }
}

#[test]
fn expand_mma_dq_kernel() {
    let device = WgpuDevice::default();
    let (q, k, v) = (t([1, 64, 2, 64], &device), t([1, 64, 1, 64], &device), t([1, 64, 1, 64], &device));
    let stat = Tensor::<B, 3>::zeros([1, 64, 2], &device).into_primitive().tensor();
    let blocks = Tensor::<B, 4, burn::tensor::Int>::zeros([1, 1, 1, 1], &device).into_primitive();
    let client = q.client.clone();
    let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        nsa_kernels::kernel::mma_dq::attention_backward_query_mma::launch::<WgpuRuntime>(
            &client,
            CubeCount::Static(1, 1, 1),
            CubeDim::new_2d(32, 8),
            q.clone().into_tensor_arg(),
            k.clone().into_tensor_arg(),
            v.clone().into_tensor_arg(),
            blocks.clone().into_tensor_arg(),
            q.clone().into_tensor_arg(),
            q.clone().into_tensor_arg(),
            stat.clone().into_tensor_arg(),
            stat.clone().into_tensor_arg(),
            t([1, 64, 2, 64], &device).into_tensor_arg(),
            0.125,
            512,
            true,
            64,
            64,
            126,
            8,
            64,
            [DType::F16.into(), DType::I32.into()],
        );
        <B as burn::tensor::backend::Backend>::sync(&device).unwrap();
    }));
    if let Err(e) = res {
        println!("panic: {:?}", e.downcast_ref::<String>().cloned().or(e.downcast_ref::<&str>().map(|s| s.to_string())));
    }
}
