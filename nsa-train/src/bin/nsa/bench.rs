//! `nsa bench-train`: the training run as a benchmark, on the run setup `nsa train` uses.

use std::path::PathBuf;

use nsa_train::backends::backend_and_data;
use nsa_train::config::RunConfig;
use nsa_train::measure::bench::{self, TrainBenchOptions};
use nsa_train::run_args::RunArgs;
use nsa_train::with_backend;

#[derive(clap::Args)]
pub(crate) struct BenchTrainArgs {
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

pub(crate) fn bench_train(args: BenchTrainArgs) -> Result<(), String> {
    let mut cfg = RunConfig::load(&args.run.config_path()).map_err(|e| e.to_string())?;
    args.run.apply(&mut cfg);
    cfg.validate().map_err(|e| e.to_string())?;
    if args.steps == 0 {
        return Err("--steps must be at least 1".into());
    }
    let (kind, train_split, valid_split) = backend_and_data(&cfg)?;
    let scratch = std::env::temp_dir().join(format!("nsa-bench-train-{}", std::process::id()));
    let opts = TrainBenchOptions {
        warmup: args.warmup,
        steps: args.steps,
        breakdown_iters: args.breakdown_iters,
        with_stats: args.with_stats,
    };
    eprintln!("bench-train: {} on {}", args.run.config_path().display(), kind.name());
    let indices = cfg.train.devices.clone();
    let result = with_backend!(kind, cfg.train.activation_checkpointing, &indices, |B, devices, memory| {
        bench::bench_train::<B>(&cfg, train_split, valid_split, &devices, memory, &scratch, &opts)
    });
    let _ = std::fs::remove_dir_all(&scratch);
    let result = result?;
    print!("{}", bench::report(&result));
    if let Some(path) = args.json {
        let text = serde_json::to_string_pretty(&result).expect("the result serialises");
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}
