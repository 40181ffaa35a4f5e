//! `nsa`: train NSA language models, benchmark the training run, sample from them and evaluate
//! them. The kernel and GEMM benchmarks and the profiler are `nsa-bench`'s.

mod bench;
mod bench_decode;
mod eval;
mod generate;
mod plot;
mod train;
mod trained;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "nsa", about = "Native Sparse Attention language models")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Train a model. Flags override the config file.
    Train(train::TrainArgs),
    /// The training run as a benchmark: steady tokens/s over the timed steps (stalls included),
    /// the median and worst step, peak device memory, and a breakdown of one step.
    BenchTrain(bench::BenchTrainArgs),
    /// Generation with the decode cache as a benchmark: prefill time, per-token latency and
    /// tokens/s per context length and batch, on a model of the config's shape.
    BenchDecode(bench_decode::BenchDecodeArgs),
    /// Sample text from a checkpoint.
    Generate(generate::GenerateArgs),
    /// A checkpoint's held-out loss, perplexity and bits per byte over text files.
    Eval(eval::EvalArgs),
    /// Charts of runs' loss, tokens/s and gate shares (PNG), several runs on each chart.
    Plot(plot::PlotArgs),
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
        Command::Train(args) => train::train(args),
        Command::BenchTrain(args) => bench::bench_train(args).map(|()| ExitCode::SUCCESS),
        Command::BenchDecode(args) => bench_decode::bench_decode(args).map(|()| ExitCode::SUCCESS),
        Command::Generate(args) => generate::generate(args).map(|()| ExitCode::SUCCESS),
        Command::Eval(args) => eval::eval(args),
        Command::Plot(args) => plot::plot(args).map(|()| ExitCode::SUCCESS),
    }
}
