//! `nsa bench-decode`: generation with the decode cache as a benchmark.

use std::path::PathBuf;

use burn::tensor::FloatDType;
use nsa_core::DecodeAttentionBackend;
use nsa_train::backends::{resolve, use_kernel_cache};
use nsa_train::config::{BackendKind, Precision, RunConfig};
use nsa_train::measure::cpu_profile::CpuProfile;
use nsa_train::measure::decode::{self, DecodeBenchOptions, DecodeBenchResult};
use nsa_train::measure::decode_parity::decode_parity;
use nsa_train::metrics::MemoryProbe;
use nsa_train::run_args::DEFAULT_CONFIG;
use nsa_train::with_inference_backend;

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
    /// On CUDA, decode through Burn's fusion, as training runs (by default CUDA decodes without
    /// it, as `nsa generate` does: each op launched as it is queued).
    #[arg(long)]
    fusion: bool,
    /// Also decode this many tokens after the first context's prompt and compare every step
    /// with one forward over the whole sequence (logit error, equal block lists), in the run's
    /// dtype.
    #[arg(long, default_value_t = 0)]
    parity: usize,
    /// Also write the results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Sample the host's threads over the timed steps: a per-thread summary of the functions
    /// they spend their time in on stderr, and folded stacks (a flame graph's input) here.
    #[arg(long)]
    cpu_profile: Option<PathBuf>,
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
        cpu_profile: args.cpu_profile.is_some(),
    };
    eprintln!("bench-decode: {} on {}", args.config.display(), kind.name());
    let (results, profile) = with_inference_backend!(kind, args.fusion, |B, device, memory| {
        Ok::<_, String>(run_on::<B>(&cfg, &opts, parity, &device, memory))
    })?;
    print!("{}", decode::report(&results));
    if let (Some(path), Some(profile)) = (&args.cpu_profile, profile) {
        eprint!("{}", profile.summary(25));
        std::fs::write(path, profile.folded()).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    if let Some(path) = args.json {
        let text = serde_json::to_string_pretty(&results).expect("the results serialise");
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}

/// The parity check (when asked), then the benchmark, on backend `B`.
fn run_on<B: DecodeAttentionBackend>(
    cfg: &RunConfig,
    opts: &DecodeBenchOptions,
    parity: Option<(usize, usize)>,
    device: &B::Device,
    probe: Option<MemoryProbe>,
) -> (Vec<DecodeBenchResult>, Option<CpuProfile>) {
    if let Some((context, steps)) = parity {
        let check = decode_parity::<B>(&cfg.model, opts.dtype, context, steps, device);
        eprintln!(
            "parity: {} tokens after {}: logits within {:.2e} of the forward's scale, {:.1}% of block lists equal",
            check.steps,
            check.context,
            check.max_rel_err,
            100.0 * check.blocks_equal
        );
        if let (Some(forward), Some(decode)) = (check.forward_rel_err, check.decode_vs_f32_rel_err) {
            eprintln!(
                "parity against the f32 forward of the same weights: decoding within {decode:.2e}, the forward in this dtype within {forward:.2e}"
            );
        }
    }
    decode::bench_decode::<B>(&cfg.model, opts, device, probe)
}
