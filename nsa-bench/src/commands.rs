//! The commands of `nsa-bench`: each resolves its backend, runs its benchmark there, and keeps
//! what it printed as JSON under `--out`.

use nsa_backend_kind::BackendKind;
use nsa_train::backends::{backend_and_data, resolve};
use nsa_train::config::{Precision, RunConfig};
use nsa_train::with_backend;
use serde::Serialize;

use crate::{gemm, kernels, plans, selection, write_json, GemmArgs, KernelArgs, ProfileArgs, SelectionArgs};

/// `kernels --shapes`: [`kernels::SHAPES`] in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BenchShape {
    Production,
    Paper,
    Wide,
    Mha,
}

/// The backend `backend` resolves to, which must be CUDA for bf16.
fn backend_for(backend: Option<BackendKind>, precision: Precision) -> Result<BackendKind, String> {
    let kind = resolve(backend.unwrap_or(BackendKind::Auto))?;
    if precision == Precision::Bf16 && kind != BackendKind::Cuda {
        return Err(format!("--precision bf16 needs the cuda backend (this run resolved to {})", kind.name()));
    }
    Ok(kind)
}

pub fn kernels(args: KernelArgs) -> Result<(), String> {
    let KernelArgs { backend, lengths, iters, precision, check_len, shapes, out } = args;
    let kind = backend_for(backend, precision)?;
    if lengths.contains(&0) {
        return Err("sequence lengths must be at least 1".into());
    }
    let dtype = match precision {
        Precision::F32 => burn::tensor::DType::F32,
        Precision::Bf16 => burn::tensor::DType::BF16,
    };
    let shapes = kernels::SHAPES
        .into_iter()
        .zip([BenchShape::Production, BenchShape::Paper, BenchShape::Wide, BenchShape::Mha])
        .filter(|(_, name)| shapes.contains(name))
        .map(|(shape, _)| shape)
        .collect();
    let opts = kernels::BenchOptions { lengths, iters: iters.max(1), dtype, check_len, shapes };
    eprintln!("benchmarking sparse attention on {} in {precision:?}", kind.name());
    let report = with_backend!(kind, false, &[0], |B, devices, _memory| {
        #[allow(clippy::clone_on_copy)] // the CPU's device is `Copy`, the GPUs' are not
        let device = devices[0].clone();
        // Every plan is forced on the inner `CubeBackend` of the same device; the CPU has none.
        let check_plans = move |case: &plans::PlanCase| plan_check(kind, &device, case);
        Ok(kernels::bench_kernels::<B>(&devices[0], &opts, &check_plans))
    })?;
    write_json(&out.out, "kernels.json", &report)?;
    match report.ok() {
        true => Ok(()),
        false => Err("a parity check against the reference failed (see above)".into()),
    }
}

/// What `nsa-bench gemm` prints, kept for `gemm.json`.
#[derive(Serialize)]
struct GemmReport {
    /// A linear layer's gradients against Burn's autodiff matmul: the largest relative error.
    grad_error: f64,
    tolerance: f64,
    rows: Vec<gemm::GemmResult>,
}

pub fn gemm(args: GemmArgs) -> Result<(), String> {
    let GemmArgs { backend, rows, precision, iters, out } = args;
    let kind = backend_for(backend, precision)?;
    let (dtype, tolerance) = match precision {
        Precision::F32 => (burn::tensor::DType::F32, 5e-3),
        Precision::Bf16 => (burn::tensor::DType::BF16, 2e-2),
    };
    // The 125M model's layers: q and o, one K or V, the MLP's two, the gates, the head.
    let layers = [(768, 768), (768, 128), (768, 3072), (3072, 768), (768, 36), (768, 256)];
    let cases: Vec<_> = layers.iter().flat_map(|&(d_in, d_out)| gemm::linear_cases(rows, d_in, d_out)).collect();
    let (report, ok) = with_backend!(kind, false, &[0], |B, devices, _memory| {
        #[allow(clippy::clone_on_copy)] // `Copy` on the CPU backend's device only.
        #[allow(clippy::clone_on_copy)] // the CPU's device is `Copy`, the GPUs' are not
        let device = devices[0].clone();
        let grad_error = gemm::linear_grad_error::<B>(&device, 1000, 200, 300, dtype);
        println!("gradients of a linear layer against Burn's autodiff matmul: error {grad_error:.2e}");
        let (rows, ok) = gemm::bench_gemm::<B>(&device, &cases, dtype, iters.max(1), tolerance);
        Ok::<_, String>((GemmReport { grad_error, tolerance, rows }, ok && grad_error <= tolerance))
    })?;
    write_json(&out.out, "gemm.json", &report)?;
    match ok {
        true => Ok(()),
        false => Err("a product differs from Burn's matmul beyond the tolerance (see above)".into()),
    }
}

pub fn profile(args: ProfileArgs) -> Result<(), String> {
    let mut cfg = RunConfig::load(&args.run.config_path()).map_err(|e| e.to_string())?;
    args.run.apply(&mut cfg);
    cfg.validate().map_err(|e| e.to_string())?;
    let (kind, train_split, valid_split) = backend_and_data(&cfg)?;
    let (iters, warmup) = (args.iters.max(1), args.warmup);
    let scratch = std::env::temp_dir().join(format!("nsa-profile-{}", std::process::id()));
    eprintln!(
        "profiling {} on {} ({warmup} warm-up + {iters} timed runs per phase)",
        args.run.config_path().display(),
        kind.name()
    );
    let phases = with_backend!(kind, cfg.train.activation_checkpointing, &[0], |B, devices, memory| {
        nsa_train::measure::profile::profile::<B>(
            &cfg,
            train_split,
            valid_split,
            &devices[0],
            memory,
            &scratch,
            warmup,
            iters,
        )
    });
    let _ = std::fs::remove_dir_all(&scratch);
    let phases = phases?;
    let dtype = (cfg.train.precision == Precision::Bf16).then_some(burn::tensor::FloatDType::BF16);
    print!("{}", nsa_train::measure::profile::table(&phases, dtype));
    write_json(&args.out.out, "profile.json", &phases)
}

pub fn selection(args: SelectionArgs) -> Result<(), String> {
    let SelectionArgs { backend, lengths, check_len, iters, document_len, out } = args;
    let kind = resolve(backend.unwrap_or(BackendKind::Auto))?;
    if kind == BackendKind::Cpu {
        return Err("the selection kernel runs on the cuda or wgpu backend, not the CPU".into());
    }
    if lengths.iter().any(|&t| t < 32) {
        return Err("sequence lengths must be at least one compressed block (32 tokens)".into());
    }
    if let Some(len) = document_len.filter(|&len| len == 0 || len % selection::BLOCK != 0) {
        return Err(format!("--document-len {len} must be a positive multiple of {}", selection::BLOCK));
    }
    eprintln!("checking and timing the block selection on {}", kind.name());
    let bf16 = kind == BackendKind::Cuda;
    let rows = with_backend!(kind, false, &[0], |B, devices, _memory| {
        Ok::<_, String>(selection::bench_selection::<B>(
            &devices[0],
            &lengths,
            check_len,
            iters.max(1),
            bf16,
            document_len,
        ))
    })?;
    write_json(&out.out, "selection.json", &rows)?;
    match rows.iter().all(|r| r.ok()) {
        true => Ok(()),
        false => Err("the selection differs from the f64 reference (see above)".into()),
    }
}

/// [`plans::check`] on the device `device` of backend `kind` (a device type that is not the
/// backend's own cannot occur: `with_backend!` picks both).
fn plan_check<D: std::any::Any>(kind: BackendKind, device: &D, case: &plans::PlanCase) -> Vec<plans::PlanParity> {
    let any = device as &dyn std::any::Any;
    match kind {
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => {
            let device = any.downcast_ref::<burn::backend::cuda::CudaDevice>().expect("a CUDA device");
            plans::check::<burn::cubecl::cuda::CudaRuntime>(device, case)
        }
        #[cfg(feature = "wgpu")]
        BackendKind::Wgpu => {
            let device = any.downcast_ref::<burn::backend::wgpu::WgpuDevice>().expect("a WGPU device");
            plans::check::<burn::cubecl::wgpu::WgpuRuntime>(device, case)
        }
        _ => {
            let _ = (any, case);
            Vec::new()
        }
    }
}
