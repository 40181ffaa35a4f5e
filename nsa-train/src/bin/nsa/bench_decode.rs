//! `nsa bench-decode`: generation with the decode cache as a benchmark.

use std::path::PathBuf;

use burn::tensor::backend::AutodiffBackend;
use burn::tensor::FloatDType;
use nsa_train::backends::{resolve, use_kernel_cache};
use nsa_train::config::{Precision, RunConfig};
use nsa_train::measure::decode::{self, DecodeBenchOptions};
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
    backend: Option<nsa_train::config::BackendKind>,
    /// Compiled kernels and autotune results (overrides `train.kernel_cache`; "" disables).
    #[arg(long)]
    kernel_cache: Option<String>,
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
        Precision::Bf16 if kind == nsa_train::config::BackendKind::Cuda => Some(FloatDType::BF16),
        Precision::Bf16 => return Err(format!("--precision bf16 needs the CUDA backend, not {}", kind.name())),
    };
    let opts = DecodeBenchOptions {
        contexts: args.contexts,
        batches: args.batches,
        tokens: args.tokens,
        warmup: args.warmup,
        dtype,
    };
    eprintln!("bench-decode: {} on {}", args.config.display(), kind.name());
    let results = with_backend!(kind, false, &[0], |B, devices, memory| {
        #[allow(clippy::clone_on_copy)] // `Copy` on the CPU backend's device only.
        let device = devices[0].clone();
        let probe = memory(&device);
        Ok(decode::bench_decode::<<B as AutodiffBackend>::InnerBackend>(&cfg.model, &opts, &device, probe))
    })?;
    print!("{}", decode::report(&results));
    if let Some(path) = args.json {
        let text = serde_json::to_string_pretty(&results).expect("the results serialise");
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}
