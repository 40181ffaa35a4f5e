//! `nsa-bench`: the sparse-attention kernels' and the GEMMs' benchmarks, and the training step's
//! profiler. Each prints its table and writes it as JSON under `--out`. The training benchmark is
//! the training job itself, so it is `nsa bench-train`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use nsa_backend_kind::BackendKind;
use nsa_train::config::Precision;
use nsa_train::run_args::RunArgs;

mod commands;
mod gemm;
mod kernels;
mod launch;
mod parity;
mod plans;
mod selection;
mod timing;

#[derive(Parser)]
#[command(name = "nsa-bench", about = "Benchmarks of NSA's kernels, its GEMMs and its training step")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Where every command writes its JSON.
#[derive(clap::Args)]
struct Out {
    /// Directory for the results (`kernels.json`, `gemm.json`, `profile.json`, `selection.json`).
    #[arg(long, default_value = "runs/bench")]
    out: PathBuf,
}

#[derive(clap::Args)]
struct KernelArgs {
    #[arg(long, value_enum)]
    backend: Option<BackendKind>,
    /// Sequence lengths to time.
    #[arg(long, value_delimiter = ',', default_value = "2048,8192,16384,32768,65536")]
    lengths: Vec<usize>,
    /// Timed runs per case: the median of synced runs, and the mean of as many queued back to
    /// back (pipelined).
    #[arg(long, default_value_t = 10)]
    iters: usize,
    /// Storage dtype of q, k, v (bf16 needs CUDA).
    #[arg(long, value_enum, default_value_t = Precision::F32)]
    precision: Precision,
    /// Length of the parity check against the reference path in f64 on the CPU (O(T^2) there:
    /// minutes at the paper shape from about 2k); 0 skips it (a memcheck run).
    #[arg(long, default_value_t = 500)]
    check_len: usize,
    /// Shapes to check and time (production: H_q 12, H_kv 2, d 64; paper: 64, 4, 128;
    /// wide: 16, 1, d_k 192, d_v 128; mha: 4, 4, 64).
    #[arg(long, value_delimiter = ',', default_value = "production,paper")]
    shapes: Vec<commands::BenchShape>,
    #[command(flatten)]
    out: Out,
}

#[derive(clap::Args)]
struct GemmArgs {
    #[arg(long, value_enum)]
    backend: Option<BackendKind>,
    /// Rows of the activations (batch x sequence length).
    #[arg(long, default_value_t = 32768)]
    rows: usize,
    #[arg(long, value_enum, default_value_t = Precision::Bf16)]
    precision: Precision,
    /// Timed runs per product.
    #[arg(long, default_value_t = 20)]
    iters: usize,
    #[command(flatten)]
    out: Out,
}

#[derive(clap::Args)]
struct ProfileArgs {
    #[command(flatten)]
    run: RunArgs,
    /// Timed runs per phase (the median is reported).
    #[arg(long, default_value_t = 10)]
    iters: usize,
    /// Untimed runs first (kernel compilation, autotuning).
    #[arg(long, default_value_t = 3)]
    warmup: usize,
    #[command(flatten)]
    out: Out,
}

#[derive(clap::Args)]
struct SelectionArgs {
    #[arg(long, value_enum)]
    backend: Option<BackendKind>,
    /// Sequence lengths.
    #[arg(long, value_delimiter = ',', default_value = "4096,16384,65536")]
    lengths: Vec<usize>,
    /// Lengths up to this are checked against the f64 reference on the CPU.
    #[arg(long, default_value_t = 4096)]
    check_len: usize,
    /// Timed runs per length (the median of synced runs).
    #[arg(long, default_value_t = 10)]
    iters: usize,
    /// Packed documents of this many tokens (a multiple of the selection block, 64) instead of
    /// one document per row: each query's blocks then come from its document.
    #[arg(long)]
    document_len: Option<usize>,
    #[command(flatten)]
    out: Out,
}

#[derive(Subcommand)]
enum Command {
    /// Time the fused sparse-attention op (window, selected and compressed, forward and
    /// forward+backward)
    /// at the benchmark shapes, after a parity check against the reference on the same device.
    Kernels(KernelArgs),
    /// The linear layers' matrix products (the 125M model's shapes): parity with Burn's matmul,
    /// forward and gradients, then TFLOP/s of ours and Burn's.
    Gemm(GemmArgs),
    /// The block selection kernel at the production shape: its lists against the f64
    /// reference, the bf16 selection's flips against the f32 one (CUDA), and its time.
    Selection(SelectionArgs),
    /// Time each phase of a training step (data, forward/backward, attention, MLP, matmuls,
    /// optimiser) on the config's shapes.
    Profile(ProfileArgs),
    /// What one kernel launch costs the host (a no-op kernel queued many times, with tensor or
    /// array arguments, with and without an output allocated per launch).
    Launch(LaunchArgs),
}

#[derive(clap::Args)]
struct LaunchArgs {
    #[arg(long, value_enum)]
    backend: Option<BackendKind>,
    /// Launches queued per form.
    #[arg(long, default_value_t = 5000)]
    launches: usize,
    #[command(flatten)]
    out: Out,
}

fn main() -> ExitCode {
    nsa_train::failures::install();
    let cli = Cli::parse();
    // A device failure that panics still ends in one line.
    let result = nsa_train::failures::catch_command(|| run(cli), "lower the sizes", "the benchmark");
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<(), String> {
    match cli.command {
        Command::Kernels(args) => commands::kernels(args),
        Command::Gemm(args) => commands::gemm(args),
        Command::Profile(args) => commands::profile(args),
        Command::Selection(args) => commands::selection(args),
        Command::Launch(args) => launch_costs(args),
    }
}

/// [`launch::measure_on`] as a table and `launch.json`.
fn launch_costs(args: LaunchArgs) -> Result<(), String> {
    let kind = nsa_train::backends::resolve(args.backend.unwrap_or(BackendKind::Auto))?;
    let rows = launch::measure_on(kind, args.launches.max(1))?;
    println!("{:<34}  {:>10}  {:>12}", "form", "us/launch", "queue us");
    for r in &rows {
        println!("{:<34}  {:>10.2}  {:>12.2}", r.form, r.us_per_launch, r.queue_us_per_launch);
    }
    write_json(&args.out.out, "launch.json", &rows)
}

/// Writes `value` as pretty JSON to `dir/file` (creating `dir`) and says where.
fn write_json(dir: &Path, file: &str, value: &impl serde::Serialize) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let path = dir.join(file);
    let text = serde_json::to_string_pretty(value).expect("results serialise");
    std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    eprintln!("wrote {}", path.display());
    Ok(())
}
