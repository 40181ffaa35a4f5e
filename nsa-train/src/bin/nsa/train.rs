//! `nsa train`: a training run from a config, flags laid over it, resumable, stopping cleanly on
//! a signal.

use std::path::Path;
use std::process::ExitCode;

use nsa_train::backends::backend_and_data;
use nsa_train::checkpoint;
use nsa_train::config::RunConfig;
use nsa_train::dashboard::reporter;
use nsa_train::data::corpus::PackedSplit;
use nsa_train::metrics::MemoryOf;
use nsa_train::run_args::{RunArgs, DEFAULT_CONFIG};
use nsa_train::signals::{Preemptible, StopSignals, PREEMPTED};
use nsa_train::trainer::{Finish, Trainer};
use nsa_train::with_backend;

#[derive(clap::Args)]
pub(crate) struct TrainArgs {
    #[command(flatten)]
    run: RunArgs,
    /// Continue the newest checkpoint of the run directory.
    #[arg(long)]
    resume: bool,
    #[arg(long)]
    steps: Option<usize>,
    /// Peak learning rate (`train.lr`).
    #[arg(long)]
    lr: Option<f64>,
    /// Start from this run's (or checkpoint directory's) weights, with a fresh optimiser and
    /// schedule (`train.init`): its model may differ only in `seq_len`.
    #[arg(long)]
    init: Option<String>,
    /// Run directory (config, metrics.jsonl, checkpoints).
    #[arg(long)]
    out: Option<String>,
    /// Plain log lines even on a terminal (sets `train.dashboard = false`).
    #[arg(long)]
    no_dashboard: bool,
}

pub(crate) fn train(args: TrainArgs) -> Result<ExitCode, String> {
    let flags = |cfg: &mut RunConfig| {
        args.run.apply(cfg);
        if let Some(steps) = args.steps {
            cfg.train.steps = steps;
        }
        if let Some(lr) = args.lr {
            cfg.train.lr = lr;
        }
        if let Some(init) = &args.init {
            cfg.train.init = init.clone();
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
    if let Some(dir) = &trainer.initialised_from {
        eprintln!("weights from {}", dir.display());
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
