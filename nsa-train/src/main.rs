//! `nsa`: train NSA language models, benchmark the training run, and sample from them. The
//! kernel and GEMM benchmarks and the profiler are `nsa-bench`'s.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use burn::tensor::backend::AutodiffBackend;
use clap::{Parser, Subcommand};
use nsa_core::NsaLm;
use nsa_train::backends::{backend_and_data, resolve, use_kernel_cache};
use nsa_train::checkpoint;
use nsa_train::config::{BackendKind, RunConfig};
use nsa_train::dashboard::reporter;
use nsa_train::data::corpus::PackedSplit;
use nsa_train::data::tokenizer::Tokenizer;
use nsa_train::generate::{sample, SampleOptions};
use nsa_train::parallel::MemoryOf;
use nsa_train::run_args::{RunArgs, DEFAULT_CONFIG};
use nsa_train::signals::{Preemptible, StopSignals, PREEMPTED};
use nsa_train::trainer::{Finish, Trainer};
use nsa_train::with_backend;

#[derive(Parser)]
#[command(name = "nsa", about = "Native Sparse Attention language models")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Args)]
struct TrainArgs {
    #[command(flatten)]
    run: RunArgs,
    /// Continue the newest checkpoint of the run directory.
    #[arg(long)]
    resume: bool,
    #[arg(long)]
    steps: Option<usize>,
    /// Run directory (config, metrics.jsonl, checkpoints).
    #[arg(long)]
    out: Option<String>,
    /// Plain log lines even on a terminal (sets `train.dashboard = false`).
    #[arg(long)]
    no_dashboard: bool,
}

#[derive(clap::Args)]
struct BenchTrainArgs {
    #[command(flatten)]
    run: RunArgs,
    /// Timed steps.
    #[arg(long, default_value_t = 50)]
    steps: usize,
    /// Untimed steps first (kernel compilation, autotuning).
    #[arg(long, default_value_t = 10)]
    warmup: usize,
    /// Timed runs per phase of the step breakdown; 0 skips the breakdown.
    #[arg(long, default_value_t = 5)]
    breakdown_iters: usize,
    /// Compute the gate and selection statistics every step (as `log_every = 1` does).
    #[arg(long)]
    with_stats: bool,
    /// Also write the result as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Subcommand)]
enum Command {
    /// Train a model. Flags override the config file.
    Train(TrainArgs),
    /// The training run as a benchmark: steady tokens/s over the timed steps (stalls included),
    /// the median and worst step, peak device memory, and a breakdown of one step.
    BenchTrain(BenchTrainArgs),
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
        backend: Option<BackendKind>,
    },
}

fn main() -> ExitCode {
    nsa_train::failures::install();
    let cli = Cli::parse();
    // A device failure that panics outside the trainer's own catch still ends in one line.
    let hint = "lower --batch-size or the sequence length";
    let result = nsa_train::failures::catch_command(|| run_command(cli), hint, "the run");
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run_command(cli: Cli) -> Result<ExitCode, String> {
    match cli.command {
        Command::Train(args) => train(args),
        Command::BenchTrain(args) => bench_train::bench_train(args).map(|()| ExitCode::SUCCESS),
        Command::Generate { checkpoint, prompt, tokens, temperature, top_k, seed, backend } => {
            let opts = SampleOptions { tokens, temperature, top_k, seed };
            generate(checkpoint, prompt, opts, backend).map(|()| ExitCode::SUCCESS)
        }
    }
}

#[path = "cli/bench_train.rs"]
mod bench_train;

fn train(args: TrainArgs) -> Result<ExitCode, String> {
    let flags = |cfg: &mut RunConfig| {
        args.run.apply(cfg);
        if let Some(steps) = args.steps {
            cfg.train.steps = steps;
        }
        if args.no_dashboard {
            cfg.train.dashboard = false;
        }
    };
    let config = args.run.config.as_deref();
    let cfg = RunConfig::resolve(config, Path::new(DEFAULT_CONFIG), args.out.as_deref(), args.resume, flags)?;
    let (kind, train_split, valid_split) = backend_and_data(&cfg)?;
    eprintln!(
        "backend {} | {} train windows ({} tokens), {} validation windows | run directory {}",
        kind.name(),
        train_split.num_windows(),
        train_split.num_tokens(),
        valid_split.num_windows(),
        cfg.train.out
    );
    let indices = cfg.train.devices.clone();
    with_backend!(kind, cfg.train.activation_checkpointing, &indices, |B, devices, memory| run::<B>(
        cfg,
        train_split,
        valid_split,
        devices,
        memory,
        args.resume
    ))
}

fn run<B: nsa_train::TrainBackend>(
    cfg: RunConfig,
    train: PackedSplit,
    valid: PackedSplit,
    devices: Vec<B::Device>,
    memory: MemoryOf<B>,
    resume: bool,
) -> Result<ExitCode, String> {
    let total = cfg.train.steps;
    let dashboard = cfg.train.dashboard;
    let mut trainer = Trainer::<B>::new(cfg, train, valid, devices[0].clone(), resume)?;
    trainer.memory = memory(&devices[0]);
    trainer.spread(&devices, memory).map_err(|e| e.to_string())?;
    for line in &trainer.set_aside {
        eprintln!("warning: checkpoint {line}");
    }
    if let Some(dir) = &trainer.resumed_from {
        eprintln!("resumed from {} (step {})", dir.display(), trainer.step);
    }
    eprintln!("model: {} parameters", burn::module::Module::num_params(&trainer.replica.model));
    // The dashboard is dropped (and the terminal restored) before the result is printed.
    let signals = StopSignals::install()?;
    let finish = {
        let mut reporter = Preemptible { inner: reporter(dashboard, total), signals: signals.clone() };
        trainer.train_until(total, &mut reporter)
    };
    match finish.map_err(|e| e.to_string())? {
        Finish::Completed => eprintln!(
            "done: {} steps, checkpoints in {}",
            trainer.step,
            checkpoint::checkpoints_dir(trainer.run_dir()).display()
        ),
        Finish::Interrupted { step, checkpoint } if signals.received() => {
            eprintln!(
                "stopped at step {step} on a signal; checkpoint {} (continue with --resume; exit status {PREEMPTED})",
                checkpoint.display()
            );
            return Ok(ExitCode::from(PREEMPTED));
        }
        Finish::Interrupted { step, checkpoint } => {
            eprintln!("stopped at step {step} on request; checkpoint {} (continue with --resume)", checkpoint.display())
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn generate(path: PathBuf, prompt: String, opts: SampleOptions, backend: Option<BackendKind>) -> Result<(), String> {
    if prompt.is_empty() {
        return Err("--prompt is empty: give the text to continue (at least one character)".into());
    }
    // Accept a run directory (its newest intact checkpoint) or a checkpoint directory.
    let (newest, damaged) = checkpoint::newest_intact(&path);
    for (dir, why) in &damaged {
        eprintln!("warning: checkpoint {} is damaged ({why}); skipping it", dir.display());
    }
    let (run_dir, ckpt) = match newest {
        Some((_, dir)) => (path.clone(), dir),
        None if path.join("model.mpk").exists() => {
            checkpoint::verify(&path).map_err(|why| format!("checkpoint {} is damaged: {why}", path.display()))?;
            (path.parent().and_then(|p| p.parent()).map(PathBuf::from).unwrap_or_default(), path.clone())
        }
        None if !damaged.is_empty() => return Err(format!("{}: no intact checkpoint", path.display())),
        None => {
            return Err(format!(
                "{}: no checkpoint found (expected a run directory or a checkpoint directory)",
                path.display()
            ))
        }
    };
    let cfg = RunConfig::load(&run_dir.join("config.toml")).map_err(|e| e.to_string())?;
    let tokenizer = Tokenizer::from_spec(&cfg.data.tokenizer).map_err(|e| e.to_string())?;
    let _ = use_kernel_cache(&cfg.train.kernel_cache)?;
    let kind = resolve(backend.unwrap_or(cfg.train.backend))?;
    with_backend!(kind, false, &[0], |B, devices, _memory| {
        #[allow(clippy::clone_on_copy)] // `Copy` on the CPU backend's device only.
        let device = devices[0].clone();
        let model: NsaLm<<B as AutodiffBackend>::InnerBackend> = cfg.model.init(&device);
        let model = checkpoint::load_model(&ckpt, model, &device)?;
        checkpoint::check_phi(&ckpt, &model, cfg.model.attention.phi)?;
        let prompt_ids = tokenizer.encode(&prompt).map_err(|e| e.to_string())?;
        if prompt_ids.is_empty() {
            return Err(format!("--prompt {prompt:?} encodes to no tokens: give text the tokenizer keeps"));
        }
        let out = sample(&model, &prompt_ids, &opts, &device);
        println!("{prompt}{}", tokenizer.decode(&out));
        Ok(())
    })
}
