//! The tensor-core plans' kernels expand in CubeCL (no GPU needed): every plan a CUDA device
//! would run is forced on WGPU through `nsa_kernels::sparse::launch`, whose WGSL compiler has no manual
//! MMA and panics on the device thread after expansion. A panic hook records every panic
//! message; a plan passes when it produced panics and all of them are that compiler's refusals,
//! so an expansion error (any other panic) fails the test. Their numerics are checked on the
//! H100 by `nsa-bench kernels`' parity check, plan by plan (docs/kernels.md). The panic hook is
//! process-wide, so the check runs in a process of its own.

use std::sync::{Mutex, Once};

use burn::backend::wgpu::{CubeBackend, WgpuDevice, WgpuRuntime};
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Int, Tensor};
use burn_cubecl::tensor::CubeTensor;
use nsa_kernels::sparse::launch::{backward_with, forward_with, problem};
use nsa_kernels::sparse::plan::{BackwardPlan, Capabilities, ForwardPlan};
use nsa_kernels::TokenKeys;

type B = CubeBackend<WgpuRuntime, f32, i32, u32>;

/// What WGSL's compiler says at the first manual MMA (`mma.sync`).
const NO_MANUAL_MMA: &str = "Cooperative matrix-multiply and accumulate isn't supported on wgpu";
/// And at a plane barrier (`sync_plane`).
const NO_PLANE_SYNC: &str = "Synchronization within a plane is not supported in WGSL";
/// And at an asynchronous copy (`cp.async`) of 8-wide vectors into shared memory, which WGSL's
/// vector unrolling (WGSL's vectors hold at most 4) cannot split: the key kernels' walks. All
/// four come from compiling the expanded kernel, so the expansion itself went through.
const NO_WIDE_ASYNC_COPY: &str = "Out must be local, found SharedArray";

fn expected(message: &str) -> bool {
    [NO_MANUAL_MMA, NO_PLANE_SYNC, NO_WIDE_ASYNC_COPY].iter().any(|known| message.contains(known))
}

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
            if !expected(&message) {
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
    assert!(!panics.is_empty(), "{kernel}: no panic, so WGSL compiled an MMA kernel or nothing ran");
    for p in panics {
        assert!(expected(p), "{kernel}: expansion failed: {p}");
    }
}

/// Zeros relabelled f16: the kernels are only compiled, never run, and lavapipe has no f16.
fn half(shape: [usize; 4], device: &WgpuDevice) -> CubeTensor<WgpuRuntime> {
    CubeTensor { dtype: DType::F16, ..Tensor::<B, 4>::zeros(shape, device).into_primitive().tensor() }
}

#[test]
fn tensor_core_plans_expand() {
    nsa_tests::in_own_process("tensor_core_expand::every_tensor_core_plan_expands");
}

// One test: the panic hook is process-wide, so the launches must not overlap.
#[test]
#[ignore = "runs in a process of its own, from tensor_core_plans_expand"]
fn every_tensor_core_plan_expands() {
    record_panics();
    let device = WgpuDevice::default();
    // q, dO: 2 heads; k, v: 1 head; d = 64, T = 64; blocks of 64 keys, block 0 listed.
    let (q, kv) = (|| half([1, 64, 2, 64], &device), || half([1, 64, 1, 64], &device));
    let blocks = Tensor::<B, 4, Int>::zeros([1, 64, 1, 2], &device).into_primitive();
    let starts = Tensor::<B, 2, Int>::zeros([1, 64], &device).into_primitive();
    let window: TokenKeys<'_, B> = TokenKeys::Window { w: 16, documents: None };
    let packed: TokenKeys<'_, B> = TokenKeys::Window { w: 16, documents: Some(&starts) };
    let selection = TokenKeys::Selected { blocks: &blocks, block_size: 64, index: None };
    let key_sets = [("window", window), ("packed window", packed), ("selection", selection)];
    let mut forced = 0;
    for (name, keys) in key_sets {
        let problem = problem(&q(), &kv(), &kv(), keys);
        for plan in ForwardPlan::candidates(&problem, &Capabilities::CUDA_SM90) {
            if matches!(plan, ForwardPlan::Portable(_)) {
                continue;
            }
            let panics = panics_of(&device, || {
                let _ = forward_with(q(), kv(), kv(), keys, &plan);
            });
            assert_expanded(&format!("{name} {plan:?}"), &panics);
            forced += 1;
        }
        for plan in BackwardPlan::candidates(&problem, &Capabilities::CUDA_SM90) {
            if matches!(plan, BackwardPlan::Portable { .. }) {
                continue;
            }
            let lse = Tensor::<B, 3>::zeros([1, 64, 2], &device).into_primitive().tensor();
            let panics = panics_of(&device, || {
                let _ = backward_with(q(), kv(), kv(), q(), lse, q(), keys, &plan);
            });
            assert_expanded(&format!("{name} {plan:?}"), &panics);
            forced += 1;
        }
    }
    // Window (with and without documents) and selection: one forward and two backward plans
    // each (dQ folded or not).
    assert_eq!(forced, 9);
}
