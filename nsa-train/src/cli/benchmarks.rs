//! The benchmark and profiling commands of `nsa`: `bench-train`, `bench-gemm`, `bench-kernels`
//! and `profile`, on the run setup the other commands share (`super`).

use super::*;

/// `bench-kernels --shapes`: [`nsa_train::bench::SHAPES`] in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(super) enum BenchShape {
    Production,
    Paper,
    Wide,
    Mha,
}

pub(super) fn bench_kernels(
    backend: Option<BackendKind>,
    lengths: Vec<usize>,
    iters: usize,
    precision: Precision,
    check_len: usize,
    shapes: Vec<BenchShape>,
) -> Result<(), String> {
    let kind = resolve(backend.unwrap_or(BackendKind::Auto))?;
    if precision == Precision::Bf16 && kind != BackendKind::Cuda {
        return Err(format!("--precision bf16 needs the cuda backend (this run resolved to {})", name(kind)));
    }
    if lengths.contains(&0) {
        return Err("sequence lengths must be at least 1".into());
    }
    let dtype = match precision {
        Precision::F32 => burn::tensor::DType::F32,
        Precision::Bf16 => burn::tensor::DType::BF16,
    };
    let shapes = nsa_train::bench::SHAPES
        .into_iter()
        .zip([BenchShape::Production, BenchShape::Paper, BenchShape::Wide, BenchShape::Mha])
        .filter(|(_, name)| shapes.contains(name))
        .map(|(shape, _)| shape)
        .collect();
    let opts = nsa_train::bench::BenchOptions { lengths, iters: iters.max(1), dtype, check_len, shapes };
    eprintln!("benchmarking sparse attention on {} in {precision:?}", name(kind));
    let ok = with_backend!(kind, false, &[0], |B, devices, _memory| {
        Ok(nsa_train::bench::bench_kernels::<B>(&devices[0], &opts))
    })?;
    if ok {
        Ok(())
    } else {
        Err("a parity check against the reference failed (see above)".into())
    }
}

pub(super) fn profile(args: ProfileArgs) -> Result<(), String> {
    let mut cfg = RunConfig::load(&args.run.config_path()).map_err(|e| e.to_string())?;
    args.run.apply(&mut cfg);
    cfg.validate().map_err(|e| e.to_string())?;
    let (kind, train_split, valid_split) = backend_and_data(&cfg)?;
    let (iters, warmup) = (args.iters.max(1), args.warmup);
    let scratch = std::env::temp_dir().join(format!("nsa-profile-{}", std::process::id()));
    eprintln!(
        "profiling {} on {} ({warmup} warm-up + {iters} timed runs per phase)",
        args.run.config_path().display(),
        name(kind)
    );
    let phases = with_backend!(kind, cfg.train.activation_checkpointing, &[0], |B, devices, memory| {
        nsa_train::profile::profile::<B>(&cfg, train_split, valid_split, &devices[0], memory, &scratch, warmup, iters)
    });
    let _ = std::fs::remove_dir_all(&scratch);
    let phases = phases?;
    let dtype = (cfg.train.precision == Precision::Bf16).then_some(burn::tensor::FloatDType::BF16);
    print!("{}", nsa_train::profile::table(&phases, dtype));
    if let Some(path) = args.json {
        let text = serde_json::to_string_pretty(&phases).expect("phases serialise");
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}

pub(super) fn bench_gemm(
    backend: Option<BackendKind>,
    rows: usize,
    precision: Precision,
    iters: usize,
) -> Result<(), String> {
    let kind = resolve(backend.unwrap_or(BackendKind::Auto))?;
    if precision == Precision::Bf16 && kind != BackendKind::Cuda {
        return Err(format!("--precision bf16 needs the cuda backend (this run resolved to {})", name(kind)));
    }
    let (dtype, tolerance) = match precision {
        Precision::F32 => (burn::tensor::DType::F32, 5e-3),
        Precision::Bf16 => (burn::tensor::DType::BF16, 2e-2),
    };
    // The 125M model's layers: q and o, one K or V, the MLP's two, the gates, the head.
    let layers = [(768, 768), (768, 128), (768, 3072), (3072, 768), (768, 36), (768, 256)];
    let cases: Vec<_> =
        layers.iter().flat_map(|&(d_in, d_out)| nsa_train::bench_gemm::linear_cases(rows, d_in, d_out)).collect();
    let ok = with_backend!(kind, false, &[0], |B, devices, _memory| {
        #[allow(clippy::clone_on_copy)] // `Copy` on the CPU backend's device only.
        let device = devices[0].clone();
        let grad_error = nsa_train::bench_gemm::linear_grad_error::<B>(&device, 1000, 200, 300, dtype);
        println!("gradients of a linear layer against Burn's autodiff matmul: error {grad_error:.2e}");
        let (_, ok) = nsa_train::bench_gemm::bench_gemm::<B>(&device, &cases, dtype, iters.max(1), tolerance);
        Ok::<bool, String>(ok && grad_error <= tolerance)
    })?;
    match ok {
        true => Ok(()),
        false => Err("a product differs from Burn's matmul beyond the tolerance (see above)".into()),
    }
}

pub(super) fn bench_train(args: BenchTrainArgs) -> Result<(), String> {
    let mut cfg = RunConfig::load(&args.run.config_path()).map_err(|e| e.to_string())?;
    args.run.apply(&mut cfg);
    cfg.validate().map_err(|e| e.to_string())?;
    if args.steps == 0 {
        return Err("--steps must be at least 1".into());
    }
    let (kind, train_split, valid_split) = backend_and_data(&cfg)?;
    let scratch = std::env::temp_dir().join(format!("nsa-bench-train-{}", std::process::id()));
    let opts = nsa_train::bench_train::TrainBenchOptions {
        warmup: args.warmup,
        steps: args.steps,
        breakdown_iters: args.breakdown_iters,
        with_stats: args.with_stats,
    };
    eprintln!("bench-train: {} on {}", args.run.config_path().display(), name(kind));
    let indices = cfg.train.devices.clone();
    let result = with_backend!(kind, cfg.train.activation_checkpointing, &indices, |B, devices, memory| {
        nsa_train::bench_train::bench_train::<B>(&cfg, train_split, valid_split, &devices, memory, &scratch, &opts)
    });
    let _ = std::fs::remove_dir_all(&scratch);
    let result = result?;
    print!("{}", nsa_train::bench_train::report(&result));
    if let Some(path) = args.json {
        let text = serde_json::to_string_pretty(&result).expect("the result serialises");
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}
