//! `nsa eval`: a checkpoint's held-out loss, perplexity and bits per byte over text files.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use burn::tensor::FloatDType;
use nsa_core::{cast_params, NsaLm, SparseAttentionBackend};
use nsa_train::backends::{resolve, use_kernel_cache};
use nsa_train::checkpoint;
use nsa_train::config::{BackendKind, Precision, RunConfig};
use nsa_train::data::tokenizer::Tokenizer;
use nsa_train::evaluate::{evaluate, EvalText, Evaluation};
use nsa_train::with_inference_backend;

#[derive(clap::Args)]
pub(crate) struct EvalArgs {
    /// A run directory (its newest checkpoint) or one checkpoint directory.
    #[arg(long)]
    checkpoint: PathBuf,
    /// Held-out text: `.txt`, `.jsonl` or `.parquet` files, or directories of them.
    #[arg(long, required = true, num_args = 1..)]
    data: Vec<PathBuf>,
    /// Windows of the model's length per forward (default: the run's `train.batch_size`).
    #[arg(long)]
    batch_size: Option<usize>,
    /// Evaluate only the first N windows.
    #[arg(long)]
    max_windows: Option<usize>,
    #[arg(long, value_enum)]
    precision: Option<Precision>,
    #[arg(long, value_enum)]
    backend: Option<BackendKind>,
    /// Also write the result as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

pub(crate) fn eval(args: EvalArgs) -> Result<(), String> {
    if args.batch_size == Some(0) || args.max_windows == Some(0) {
        return Err("--batch-size and --max-windows take numbers of at least 1".into());
    }
    let (run_dir, ckpt) = checkpoint::locate(&args.checkpoint)?;
    let cfg = RunConfig::load(&run_dir.join("config.toml")).map_err(|e| e.to_string())?;
    let tokenizer = Tokenizer::from_spec(&cfg.data.tokenizer).map_err(|e| e.to_string())?;
    let text = EvalText::read(&args.data, &tokenizer, cfg.model.seq_len).map_err(|e| e.to_string())?;
    let _ = use_kernel_cache(&cfg.train.kernel_cache)?;
    let kind = resolve(args.backend.unwrap_or(cfg.train.backend))?;
    // bf16 where the run trained in it on CUDA; the other backends evaluate in f32.
    let dtype = match (args.precision, kind) {
        (Some(Precision::Bf16), BackendKind::Cuda) => Some(FloatDType::BF16),
        (Some(Precision::Bf16), _) => {
            return Err(format!("--precision bf16 needs the CUDA backend, not {}", kind.name()))
        }
        (None, BackendKind::Cuda) if cfg.train.precision == Precision::Bf16 => Some(FloatDType::BF16),
        _ => None,
    };
    let job = Job {
        cfg: &cfg,
        ckpt: &ckpt,
        text: &text,
        batch_size: args.batch_size.unwrap_or(cfg.train.batch_size),
        max_windows: args.max_windows,
        dtype,
    };
    let result = with_inference_backend!(kind, true, |B, device, _memory| job.run::<B>(&device))?;
    println!(
        "loss {:.4} nats/token, perplexity {:.3}, {:.4} bits/byte over {} tokens ({} windows of {})",
        result.loss, result.perplexity, result.bits_per_byte, result.tokens, result.windows, cfg.model.seq_len
    );
    if let Some(path) = args.json {
        let text = serde_json::to_string_pretty(&result).expect("the result serialises");
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}

/// What one `nsa eval` scores.
struct Job<'a> {
    cfg: &'a RunConfig,
    ckpt: &'a std::path::Path,
    text: &'a EvalText,
    batch_size: usize,
    max_windows: Option<usize>,
    dtype: Option<FloatDType>,
}

impl Job<'_> {
    fn run<B: SparseAttentionBackend>(&self, device: &B::Device) -> Result<Evaluation, String> {
        let model: NsaLm<B> = self.cfg.model.init(device);
        let model = checkpoint::load_model(self.ckpt, model, device)?;
        checkpoint::check_phi(self.ckpt, &model, self.cfg.model.attention.phi)?;
        let model = match self.dtype {
            Some(dtype) => cast_params(model, dtype),
            None => model,
        };
        // A line every few seconds and a last one: a large file takes minutes on the CPU.
        let mut last = Instant::now();
        let progress = |done: usize, total: usize, loss: f64| {
            if done == total || last.elapsed() >= Duration::from_secs(5) {
                eprintln!("eval: {done}/{total} windows, loss so far {loss:.4}");
                last = Instant::now();
            }
        };
        Ok(evaluate(&model, self.text, self.batch_size, self.max_windows, device, progress))
    }
}
