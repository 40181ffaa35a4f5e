//! The tensor-core kernels expand in CubeCL (no GPU needed): each is launched on WGPU, whose
//! WGSL compiler has no CMMA and panics on the device thread after expansion. A panic hook
//! records every panic message; a launch passes when it produced panics and all of them are
//! that compiler's "no CMMA" message, so an expansion error (any other panic) fails the test.
//! Their numerics are checked on the H100 by `nsa bench-kernels` (docs/kernels.md).

use std::sync::{Mutex, Once};

use burn::backend::wgpu::{CubeBackend, WgpuDevice, WgpuRuntime};
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Int, Tensor};
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;
use cubecl::CubeDim;

type B = CubeBackend<WgpuRuntime, f32, i32, u32>;

const NO_CMMA: &str = "Cooperative matrix-multiply and accumulate not supported";

static PANICS: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn record_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let report = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let message = info
                .payload()
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| info.payload().downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            // The expected compiler panics stay quiet; anything else (a failed assertion too)
            // is reported as usual.
            if !message.contains(NO_CMMA) {
                report(info);
            }
            PANICS.lock().unwrap_or_else(|e| e.into_inner()).push(message);
        }))
    });
}

/// Runs `launch` and syncs; returns the panic messages it caused (on any thread).
fn panics_of(device: &WgpuDevice, launch: impl FnOnce()) -> Vec<String> {
    PANICS.lock().unwrap_or_else(|e| e.into_inner()).clear();
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        launch();
        let _ = <B as Backend>::sync(device);
    }));
    std::mem::take(&mut *PANICS.lock().unwrap_or_else(|e| e.into_inner()))
}

fn assert_expanded(kernel: &str, panics: &[String]) {
    assert!(!panics.is_empty(), "{kernel}: no panic, so WGSL compiled a CMMA kernel or nothing ran");
    for p in panics {
        assert!(p.contains(NO_CMMA), "{kernel}: expansion failed: {p}");
    }
}

fn float(shape: [usize; 4], device: &WgpuDevice) -> CubeTensor<WgpuRuntime> {
    Tensor::<B, 4>::zeros(shape, device).into_primitive().tensor()
}

fn stats(device: &WgpuDevice) -> CubeTensor<WgpuRuntime> {
    Tensor::<B, 3>::zeros([1, 64, 2], device).into_primitive().tensor()
}

fn index(device: &WgpuDevice) -> CubeTensor<WgpuRuntime> {
    Tensor::<B, 3, Int>::zeros([1, 1, 1], device).cast(DType::U32).into_primitive()
}

// One test: the panic hook is process-wide, so the launches must not overlap.
#[test]
fn tensor_core_kernels_expand() {
    record_panics();
    let device = WgpuDevice::default();
    let client = float([1, 1, 1, 1], &device).client.clone();
    // q, dO: 2 heads; k, v: 1 head; d = 64, T = 64.
    let (q, kv) = (|| float([1, 64, 2, 64], &device), || float([1, 64, 1, 64], &device));

    for (window, fold_dq) in [(false, false), (true, false), (false, true), (true, true)] {
        let panics = panics_of(&device, || {
            nsa_kernels::kernel::mma_backward::attention_backward_key_mma::launch::<WgpuRuntime>(
                &client,
                CubeCount::Static(1, 1, 1),
                CubeDim::new_2d(32, 4),
                nsa_kernels::kernel::mma_forward::VECTOR,
                q().into_tensor_arg(),
                kv().into_tensor_arg(),
                kv().into_tensor_arg(),
                q().into_tensor_arg(),
                stats(&device).into_tensor_arg(),
                stats(&device).into_tensor_arg(),
                index(&device).into_tensor_arg(),
                index(&device).into_tensor_arg(),
                index(&device).into_tensor_arg(),
                index(&device).into_tensor_arg(),
                index(&device).into_tensor_arg(),
                index(&device).into_tensor_arg(),
                kv().into_tensor_arg(),
                kv().into_tensor_arg(),
                Tensor::<B, 3>::zeros([1, 1, 1], &device).into_primitive().tensor().into_tensor_arg(),
                q().into_tensor_arg(),
                0.125,
                512,
                512,
                window,
                64,
                64,
                4,
                64,
                fold_dq,
                DType::F16.into(),
            );
        });
        assert_expanded(&format!("attention_backward_key_mma (window {window}, fold_dq {fold_dq})"), &panics);
    }

    let blocks = || Tensor::<B, 4, Int>::zeros([1, 1, 1, 1], &device).into_primitive();
    let panics = panics_of(&device, || {
        nsa_kernels::kernel::mma_dq::attention_backward_query_mma::launch::<WgpuRuntime>(
            &client,
            CubeCount::Static(1, 1, 1),
            CubeDim::new_2d(32, 8),
            nsa_kernels::kernel::mma_forward::VECTOR,
            q().into_tensor_arg(),
            kv().into_tensor_arg(),
            kv().into_tensor_arg(),
            blocks().into_tensor_arg(),
            q().into_tensor_arg(),
            q().into_tensor_arg(),
            stats(&device).into_tensor_arg(),
            stats(&device).into_tensor_arg(),
            q().into_tensor_arg(),
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
    });
    assert_expanded("attention_backward_query_mma", &panics);

    let panics = panics_of(&device, || {
        nsa_kernels::kernel::mma_forward::attention_forward_mma::launch::<WgpuRuntime>(
            &client,
            CubeCount::Static(1, 1, 1),
            CubeDim::new_2d(32, 8),
            nsa_kernels::kernel::mma_forward::VECTOR,
            q().into_tensor_arg(),
            kv().into_tensor_arg(),
            kv().into_tensor_arg(),
            blocks().into_tensor_arg(),
            q().into_tensor_arg(),
            stats(&device).into_tensor_arg(),
            0.125,
            512,
            true,
            64,
            64,
            126,
            8,
            64,
            64,
            [DType::F16.into(), DType::I32.into()],
        );
    });
    assert_expanded("attention_forward_mma", &panics);

    let panics = panics_of(&device, || {
        nsa_kernels::kernel::mma_select::selection_forward_mma::launch::<WgpuRuntime>(
            &client,
            CubeCount::Static(1, 1, 1),
            CubeDim::new_2d(32, 4),
            nsa_kernels::kernel::mma_forward::VECTOR,
            q().into_tensor_arg(),
            kv().into_tensor_arg(),
            kv().into_tensor_arg(),
            blocks().into_tensor_arg(),
            q().into_tensor_arg(),
            stats(&device).into_tensor_arg(),
            0.125,
            64,
            64,
            64,
            4,
            64,
            64,
            [DType::F16.into(), DType::I32.into()],
        );
    });
    assert_expanded("selection_forward_mma", &panics);
}

/// `row_delta` (the folded backward's `delta = dO . O`) has no CMMA, so WGPU runs it: checked
/// against Burn's own product and sum on fresh random rows (the last cube partly past the end).
#[test]
fn row_delta_matches_a_product_and_sum() {
    use burn::tensor::Distribution;
    let device = WgpuDevice::default();
    let shape = [2, 77, 3, 64];
    let out = Tensor::<B, 4>::random(shape, Distribution::Normal(0.0, 1.0), &device);
    let grad_out = Tensor::<B, 4>::random(shape, Distribution::Normal(0.0, 1.0), &device);
    let delta = Tensor::<B, 3>::zeros([2, 77, 3], &device);
    let (o, g, d) = (
        out.clone().into_primitive().tensor(),
        grad_out.clone().into_primitive().tensor(),
        delta.clone().into_primitive().tensor(),
    );
    let client = o.client.clone();
    nsa_kernels::kernel::mma_backward::row_delta::launch::<WgpuRuntime>(
        &client,
        // 462 rows, 16 per cube.
        CubeCount::Static(29, 1, 1),
        CubeDim::new_2d(8, 16),
        nsa_kernels::kernel::mma_forward::VECTOR,
        o.into_tensor_arg(),
        g.into_tensor_arg(),
        d.clone().into_tensor_arg(),
        64,
        16,
        DType::F32.into(),
    );
    let got = Tensor::<B, 3>::from_primitive(burn::tensor::TensorPrimitive::Float(d));
    let want = (out * grad_out).sum_dim(3).squeeze_dim::<3>(3);
    let err = (got - want.clone()).abs().max().into_scalar();
    let scale = want.abs().max().into_scalar();
    assert!(err <= 1e-5 * scale.max(1.0), "row_delta off by {err} (values up to {scale})");
}
