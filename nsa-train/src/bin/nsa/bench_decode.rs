//! `nsa bench-decode`: generation with the decode cache as a benchmark.

use std::path::PathBuf;

use burn::tensor::backend::AutodiffBackend;
use burn::tensor::FloatDType;
use nsa_train::backends::{resolve, use_kernel_cache};
use nsa_train::config::{BackendKind, Precision, RunConfig};
use nsa_train::measure::decode::{self, DecodeBenchOptions, DecodeBenchResult};
use nsa_train::measure::decode_parity::decode_parity;
use nsa_train::run_args::DEFAULT_CONFIG;
use nsa_train::with_backend;

#[derive(clap::Args)]
pub(crate) struct BenchDecodeArgs {
    /// The model's shape (its `[model]`; `[train]` gives the backend, precision and kernel cache).
    #[arg(long, default_value = DEFAULT_CONFIG)]
    config: PathBuf,
    /// Prompt lengths.
    #[arg(long, value_delimiter = ',', default_value = "2048,16384,65536")]
    contexts: Vec<usize>,
    /// Sequences decoded together.
    #[arg(long, value_delimiter = ',', default_value = "1,16")]
    batches: Vec<usize>,
    /// Timed decode steps per configuration.
    #[arg(long, default_value_t = 64)]
    tokens: usize,
    /// Untimed steps first (kernel compilation, autotuning).
    #[arg(long, default_value_t = 8)]
    warmup: usize,
    #[arg(long, value_enum)]
    precision: Option<Precision>,
    #[arg(long, value_enum)]
    backend: Option<BackendKind>,
    /// Compiled kernels and autotune results (overrides `train.kernel_cache`; "" disables).
    #[arg(long)]
    kernel_cache: Option<String>,
    /// Decode on CubeCL's backend without Burn's fusion (CUDA): each op is launched as it is
    /// queued, with no fusion stream between the model and the device.
    #[arg(long)]
    no_fusion: bool,
    /// Also decode this many tokens after the first context's prompt and compare every step
    /// with one forward over the whole sequence (logit error, equal block lists), in the run's
    /// dtype.
    #[arg(long, default_value_t = 0)]
    parity: usize,
    /// Also write the results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

pub(crate) fn bench_decode(args: BenchDecodeArgs) -> Result<(), String> {
    let cfg = RunConfig::load(&args.config).map_err(|e| e.to_string())?;
    if args.tokens == 0 || args.contexts.contains(&0) || args.batches.contains(&0) {
        return Err("--tokens, --contexts and --batches take numbers of at least 1".into());
    }
    let _ = use_kernel_cache(args.kernel_cache.as_ref().unwrap_or(&cfg.train.kernel_cache))?;
    let kind = resolve(args.backend.unwrap_or(cfg.train.backend))?;
    let dtype = match args.precision.unwrap_or(cfg.train.precision) {
        Precision::F32 => None,
        Precision::Bf16 if kind == BackendKind::Cuda => Some(FloatDType::BF16),
        Precision::Bf16 => return Err(format!("--precision bf16 needs the CUDA backend, not {}", kind.name())),
    };
    let parity = (args.parity > 0).then(|| (args.contexts[0], args.parity));
    let opts = DecodeBenchOptions {
        contexts: args.contexts,
        batches: args.batches,
        tokens: args.tokens,
        warmup: args.warmup,
        dtype,
    };
    eprintln!("bench-decode: {} on {}", args.config.display(), kind.name());
    let results = match args.no_fusion {
        true => unfused(kind, &cfg, &opts)?,
        false => fused(kind, &cfg, &opts, parity)?,
    };
    print!("{}", decode::report(&results));
    if let Some(path) = args.json {
        let text = serde_json::to_string_pretty(&results).expect("the results serialise");
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}

fn fused(
    kind: BackendKind,
    cfg: &RunConfig,
    opts: &DecodeBenchOptions,
    parity: Option<(usize, usize)>,
) -> Result<Vec<DecodeBenchResult>, String> {
    with_backend!(kind, false, &[0], |B, devices, memory| {
        #[allow(clippy::clone_on_copy)] // `Copy` on the CPU backend's device only.
        let device = devices[0].clone();
        if let Some((context, steps)) = parity {
            type Inner = <B as AutodiffBackend>::InnerBackend;
            let check = decode_parity::<Inner>(&cfg.model, opts.dtype, context, steps, &device);
            eprintln!(
                "parity: {} tokens after {}: logits within {:.2e} of the forward's scale, {:.1}% of block lists equal",
                check.steps,
                check.context,
                check.max_rel_err,
                100.0 * check.blocks_equal
            );
        }
        let probe = memory(&device);
        Ok(decode::bench_decode::<<B as AutodiffBackend>::InnerBackend>(&cfg.model, opts, &device, probe))
    })
}

#[cfg(feature = "cuda")]
fn unfused(kind: BackendKind, cfg: &RunConfig, opts: &DecodeBenchOptions) -> Result<Vec<DecodeBenchResult>, String> {
    use burn::cubecl::cuda::CudaRuntime;
    use nsa_train::backends::{cubecl_memory, cuda_devices};
    if kind != BackendKind::Cuda {
        return Err(format!("--no-fusion runs on the CUDA backend, not {}", kind.name()));
    }
    let device = cuda_devices(&[0]).remove(0);
    let probe = cubecl_memory::<CudaRuntime>(&device);
    Ok(decode::bench_decode::<nsa_kernels::CubeBackend<CudaRuntime, f32, i32, u8>>(&cfg.model, opts, &device, probe))
}

#[cfg(not(feature = "cuda"))]
fn unfused(_: BackendKind, _: &RunConfig, _: &DecodeBenchOptions) -> Result<Vec<DecodeBenchResult>, String> {
    Err("--no-fusion runs on the CUDA backend, which this build does not have".into())
}
