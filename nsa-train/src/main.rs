//! `nsa`: train NSA language models and sample from them.

use std::path::PathBuf;
use std::process::ExitCode;

use burn::backend::Autodiff;
use burn::tensor::backend::{AutodiffBackend, Backend};
use clap::{Parser, Subcommand};
use nsa_core::NsaLm;
use nsa_train::checkpoint;
use nsa_train::config::{BackendKind, Precision, RunConfig};
use nsa_train::data::load_splits;
use nsa_train::data::tokenizer::Tokenizer;
use nsa_train::generate::{sample, SampleOptions};
use nsa_train::trainer::Trainer;

#[derive(Parser)]
#[command(name = "nsa", about = "Native Sparse Attention language models")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Train a model. Flags override the config file.
    Train {
        #[arg(long, default_value = "configs/tiny.toml")]
        config: PathBuf,
        #[arg(long, value_enum)]
        backend: Option<BackendArg>,
        /// Training data (files or directories); repeatable. Overrides `data.paths`.
        #[arg(long)]
        data: Vec<PathBuf>,
        /// Continue the newest checkpoint of the run directory.
        #[arg(long)]
        resume: bool,
        #[arg(long)]
        steps: Option<usize>,
        /// Run directory (config, metrics.jsonl, checkpoints).
        #[arg(long)]
        out: Option<String>,
    },
    /// Sample text from a checkpoint.
    Generate {
        /// A run directory (its newest checkpoint) or one checkpoint directory.
        #[arg(long)]
        checkpoint: PathBuf,
        #[arg(long)]
        prompt: String,
        #[arg(long, default_value_t = 200)]
        tokens: usize,
        #[arg(long, default_value_t = 0.8)]
        temperature: f64,
        #[arg(long, default_value_t = 40)]
        top_k: usize,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        #[arg(long, value_enum)]
        backend: Option<BackendArg>,
    },
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum BackendArg {
    Auto,
    Cuda,
    Wgpu,
    Cpu,
}

impl From<BackendArg> for BackendKind {
    fn from(b: BackendArg) -> Self {
        match b {
            BackendArg::Auto => BackendKind::Auto,
            BackendArg::Cuda => BackendKind::Cuda,
            BackendArg::Wgpu => BackendKind::Wgpu,
            BackendArg::Cpu => BackendKind::Cpu,
        }
    }
}

fn main() -> ExitCode {
    let result = match Cli::parse().command {
        Command::Train { config, backend, data, resume, steps, out } => {
            train(config, backend, data, resume, steps, out)
        }
        Command::Generate { checkpoint, prompt, tokens, temperature, top_k, seed, backend } => {
            let opts = SampleOptions { tokens, temperature, top_k, seed };
            generate(checkpoint, prompt, opts, backend)
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The backend compiled in that `kind` resolves to on this machine.
fn resolve(kind: BackendKind) -> Result<BackendKind, String> {
    let compiled = |k: BackendKind| match k {
        BackendKind::Cuda => cfg!(feature = "cuda"),
        BackendKind::Wgpu => cfg!(feature = "wgpu"),
        BackendKind::Cpu => cfg!(feature = "cpu"),
        BackendKind::Auto => true,
    };
    match kind {
        BackendKind::Auto => [BackendKind::Cuda, BackendKind::Wgpu, BackendKind::Cpu]
            .into_iter()
            .find(|k| compiled(*k) && usable(*k))
            .ok_or_else(|| "no backend compiled in is usable here".to_string()),
        k if !compiled(k) => Err(format!(
            "this binary was built without the `{}` feature; run it through `cargo xtask train --backend {0}`",
            name(k)
        )),
        k => Ok(k),
    }
}

fn name(k: BackendKind) -> &'static str {
    match k {
        BackendKind::Auto => "auto",
        BackendKind::Cuda => "cuda",
        BackendKind::Wgpu => "wgpu",
        BackendKind::Cpu => "cpu",
    }
}

/// Whether a backend can run a tiny op here (a missing driver panics inside Burn).
fn usable(kind: BackendKind) -> bool {
    fn probe<B: Backend>(device: B::Device) -> bool {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            burn::tensor::Tensor::<B, 1>::ones([1], &device).into_data()
        }))
        .is_ok()
    }
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let ok = match kind {
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => probe::<burn::backend::Cuda>(Default::default()),
        #[cfg(feature = "wgpu")]
        BackendKind::Wgpu => probe::<burn::backend::Wgpu>(Default::default()),
        #[cfg(feature = "cpu")]
        BackendKind::Cpu => probe::<burn::backend::NdArray>(Default::default()),
        _ => false,
    };
    std::panic::set_hook(previous);
    ok
}

/// Runs `$body` with `$B` bound to the autodiff backend of `$kind`.
macro_rules! with_backend {
    ($kind:expr, $checkpointing:expr, |$B:ident, $device:ident| $body:expr) => {
        match ($kind, $checkpointing) {
            #[cfg(feature = "cuda")]
            (BackendKind::Cuda, false) => {
                type $B = Autodiff<burn::backend::Cuda>;
                let $device = Default::default();
                $body
            }
            #[cfg(feature = "cuda")]
            (BackendKind::Cuda, true) => {
                type $B =
                    Autodiff<burn::backend::Cuda, burn::backend::autodiff::checkpoint::strategy::BalancedCheckpointing>;
                let $device = Default::default();
                $body
            }
            #[cfg(feature = "wgpu")]
            (BackendKind::Wgpu, false) => {
                type $B = Autodiff<burn::backend::Wgpu>;
                let $device = Default::default();
                $body
            }
            #[cfg(feature = "wgpu")]
            (BackendKind::Wgpu, true) => {
                type $B =
                    Autodiff<burn::backend::Wgpu, burn::backend::autodiff::checkpoint::strategy::BalancedCheckpointing>;
                let $device = Default::default();
                $body
            }
            #[cfg(feature = "cpu")]
            (BackendKind::Cpu, false) => {
                type $B = Autodiff<burn::backend::NdArray>;
                let $device = Default::default();
                $body
            }
            #[cfg(feature = "cpu")]
            (BackendKind::Cpu, true) => {
                type $B = Autodiff<
                    burn::backend::NdArray,
                    burn::backend::autodiff::checkpoint::strategy::BalancedCheckpointing,
                >;
                let $device = Default::default();
                $body
            }
            (kind, _) => Err(format!("backend `{}` is not compiled in", name(kind))),
        }
    };
}

fn train(
    config: PathBuf,
    backend: Option<BackendArg>,
    data: Vec<PathBuf>,
    resume: bool,
    steps: Option<usize>,
    out: Option<String>,
) -> Result<(), String> {
    let mut cfg = RunConfig::load(&config).map_err(|e| e.to_string())?;
    if let Some(out) = out {
        cfg.train.out = out;
    }
    if resume {
        // A resumed run continues with the config it started with; only its length may change.
        let saved = PathBuf::from(&cfg.train.out).join("config.toml");
        let out = cfg.train.out.clone();
        if !saved.exists() {
            return Err(format!("nothing to resume: {out} holds no run (no config.toml)"));
        }
        cfg = RunConfig::load(&saved).map_err(|e| e.to_string())?;
        cfg.train.out = out;
    }
    if let Some(b) = backend {
        cfg.train.backend = b.into();
    }
    if let Some(steps) = steps {
        cfg.train.steps = steps;
    }
    if !data.is_empty() {
        cfg.data.paths = data.iter().map(|p| p.display().to_string()).collect();
    }
    cfg.validate().map_err(|e| e.to_string())?;
    if cfg.train.precision == Precision::Bf16 {
        return Err(
            "train.precision = \"bf16\" (bf16 compute with f32 master weights) is not implemented yet; use \"f32\""
                .into(),
        );
    }
    let kind = resolve(cfg.train.backend)?;
    let paths: Vec<PathBuf> = cfg.data.paths.iter().map(PathBuf::from).collect();
    let (train_split, valid_split, _) = load_splits(&cfg, &paths).map_err(|e| e.to_string())?;
    eprintln!(
        "backend {} | {} train windows ({} tokens), {} validation windows | run directory {}",
        name(kind),
        train_split.num_windows(),
        train_split.num_tokens(),
        valid_split.num_windows(),
        cfg.train.out
    );
    with_backend!(kind, cfg.train.activation_checkpointing, |B, device| run::<B>(
        cfg,
        train_split,
        valid_split,
        device,
        resume
    ))
}

fn run<B: AutodiffBackend>(
    cfg: RunConfig,
    train: nsa_train::data::corpus::PackedSplit,
    valid: nsa_train::data::corpus::PackedSplit,
    device: B::Device,
    resume: bool,
) -> Result<(), String> {
    let total = cfg.train.steps;
    let mut trainer = Trainer::<B>::new(cfg, train, valid, device, resume)?;
    eprintln!("model: {} parameters", burn::module::Module::num_params(&trainer.model));
    trainer.train_until(total, |m| println!("{}", m.line(total))).map_err(|e| e.to_string())?;
    eprintln!(
        "done: {} steps, checkpoints in {}",
        trainer.step,
        checkpoint::checkpoints_dir(trainer.run_dir()).display()
    );
    Ok(())
}

fn generate(path: PathBuf, prompt: String, opts: SampleOptions, backend: Option<BackendArg>) -> Result<(), String> {
    // Accept a run directory (newest checkpoint) or a checkpoint directory.
    let (run_dir, ckpt) = match checkpoint::latest(&path) {
        Some((_, dir)) => (path.clone(), dir),
        None if path.join("model.mpk").exists() => {
            (path.parent().and_then(|p| p.parent()).map(PathBuf::from).unwrap_or_default(), path.clone())
        }
        None => {
            return Err(format!(
                "{}: no checkpoint found (expected a run directory or a checkpoint directory)",
                path.display()
            ))
        }
    };
    let cfg = RunConfig::load(&run_dir.join("config.toml")).map_err(|e| e.to_string())?;
    let tokenizer = match cfg.data.tokenizer.as_str() {
        "bytes" => Tokenizer::Bytes,
        p => Tokenizer::load(Some(std::path::Path::new(p))).map_err(|e| e.to_string())?,
    };
    let kind = resolve(backend.map(Into::into).unwrap_or(cfg.train.backend))?;
    with_backend!(kind, false, |B, device| {
        let model: NsaLm<<B as AutodiffBackend>::InnerBackend> = cfg.model.init(&device);
        let model = checkpoint::load_model(&ckpt, model, &device)?;
        let prompt_ids = tokenizer.encode(&prompt).map_err(|e| e.to_string())?;
        let out = sample(&model, &prompt_ids, &opts, &device);
        println!("{prompt}{}", tokenizer.decode(&out));
        Ok(())
    })
}
