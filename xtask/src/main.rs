//! `cargo xtask`: the project's entry points. Each task is a thin wrapper over cargo, so the
//! commands it runs are printed and can be copied.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use clap::{Parser, Subcommand, ValueEnum};
use nsa_backend_kind::BackendKind;

mod bench_decode;
mod bench_needle;
mod bench_train;
mod decode_kernels;
mod test;
mod vulkan;

#[derive(Parser)]
#[command(name = "cargo xtask", about = "NSA project tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Run every test of the workspace (what CI runs). The kernel tests run on WGPU; without a
    /// Vulkan driver this installs Mesa's (root with apt-get) or says which packages to install.
    Test {
        /// Extra arguments for `cargo test`, e.g. a test name filter.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Build and run `nsa train` for a backend (default: the best one this machine has).
    /// Arguments after `--` go to `nsa train`: --config, --data, --resume, --steps, --out.
    Train(NsaArgs),
    /// `bench profile` under its old name: time each phase of a training step on a config's
    /// shapes (release build; results in `runs/bench/profile.json`).
    Profile(NsaArgs),
    /// Benchmarks, built in release mode; each writes its JSON under `--out`.
    ///
    /// `train`: the training run (`nsa bench-train`; after `--`: --config, --seq-len,
    /// --batch-size, --precision, --steps, --warmup, --kernel-cache, --devices), with `--anchor`
    /// beside PyTorch's dense model of the same shape and length (`bench/train_anchor.py`).
    /// `kernels`: the fused sparse-attention op (`nsa-bench kernels`; after `--`: --lengths,
    /// --iters, --precision, --check-len, --shapes).
    /// `gemm`: the linear layers' products (`nsa-bench gemm`; after `--`: --rows, --precision,
    /// --iters).
    /// `profile`: each phase of a training step (`nsa-bench profile`; after `--`: --config,
    /// --iters, --warmup, --precision, --batch-size).
    /// `selection`: the block selection kernel (`nsa-bench selection`; after `--`: --lengths,
    /// --check-len, --iters): its lists against the f64 reference, bf16 against f32.
    /// `decode`: generation with the decode cache (`nsa bench-decode`; after `--`: --config,
    /// --contexts, --batches, --tokens, --warmup, --precision), with `--anchor` beside PyTorch's
    /// dense model decoding with a static KV cache (`bench/decode_anchor.py`); with `--kernels`
    /// (one context and batch), each kernel's device time under Nsight Compute's `ncu` and the
    /// attention's per layer, beside the anchor's SDPA (torch.profiler) with `--anchor`.
    /// `launch`: what one kernel launch costs the host (`nsa-bench launch`; after `--`:
    /// --launches).
    /// `needle`: a recipe trained with NSA and then with dense attention (`nsa train`; after
    /// `--`: its arguments, e.g. --config configs/nsa-125m-passkey-16k.toml), each asked for keys
    /// by `nsa eval needle` (--lengths, --context, --trials), side by side per length; the runs,
    /// their JSON and heat maps under `--out` (`nsa/`, `dense/`, `needle-nsa.json`, ...).
    Bench {
        #[arg(value_enum)]
        what: BenchKind,
        /// `train`, `decode`: also run the PyTorch anchor (needs python3 with torch and a CUDA
        /// GPU) and print ours over it.
        #[arg(long)]
        anchor: bool,
        /// `train` with `--devices A,B,..` after `--`: first the same benchmark on device A alone,
        /// then on all of them, and the data-parallel speed-up.
        #[arg(long)]
        scaling: bool,
        /// `decode`: the step's kernels' device times instead of its wall clock (needs `ncu`).
        #[arg(long)]
        kernels: bool,
        /// `needle`: the haystack lengths asked (`nsa eval needle --lengths`, e.g. 1k,4k,16376).
        #[arg(long)]
        lengths: Option<String>,
        /// `needle`: the context the runs are asked at (`nsa eval needle --context`, e.g. 32k).
        #[arg(long)]
        context: Option<String>,
        /// `needle`: keys per length and depth.
        #[arg(long, default_value_t = 4)]
        trials: usize,
        /// `needle`: an earlier `bench needle`'s `--out`; each run starts from its run of the same
        /// attention (`nsa train --init`), e.g. the 16k recipe's for the 64k one.
        #[arg(long)]
        init_from: Option<PathBuf>,
        /// Where results go (`bench-train.json`, `anchor.jsonl`, `bench-train-1.json`,
        /// `kernels.json`, `gemm.json`, `profile.json`, `selection.json`, `launch.json`, `bench-decode.json`,
        /// `decode-anchor.jsonl`, `decode-kernels.csv`).
        #[arg(long, default_value = DEFAULT_OUT)]
        out: PathBuf,
        #[command(flatten)]
        nsa: NsaArgs,
    },
    /// Build and run `nsa generate`: sample from a checkpoint. Arguments after `--` go to
    /// `nsa generate`: --checkpoint, --prompt or --prompt-file, --max-tokens, --temperature, --top-k,
    /// --top-p, --seed, --batch.
    Generate(NsaArgs),
    /// Build and run `nsa eval`: a checkpoint's held-out loss, perplexity and bits per byte.
    /// Arguments after `--` go to `nsa eval`: --checkpoint, --data, --batch-size, --max-windows,
    /// --precision, --json.
    Eval(NsaArgs),
    /// Build and run `nsa plot`: runs' loss, tokens/s and gate shares as PNG charts. Arguments
    /// after `--` go to `nsa plot`: run directories, --out.
    Plot(NsaArgs),
}

/// Where `bench` writes its results unless told.
const DEFAULT_OUT: &str = "runs/bench";

/// How to build `nsa` (or `nsa-bench`), and the arguments passed on to it.
#[derive(clap::Args, Clone)]
pub(crate) struct NsaArgs {
    #[arg(long, value_enum, default_value_t = BackendKind::Auto)]
    pub(crate) backend: BackendKind,
    /// Build with optimisations for our own crates too (dependencies are always optimised).
    #[arg(long)]
    pub(crate) release: bool,
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub(crate) args: Vec<String>,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum BenchKind {
    Train,
    Gemm,
    Kernels,
    Profile,
    Selection,
    Decode,
    Launch,
    Needle,
}

fn main() -> ExitCode {
    match Cli::parse().task {
        Task::Test { args } => {
            if let Err(e) = vulkan::ensure_driver() {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
            announce_build(
                "the tests: after `cargo xtask train` only the test crates, about a minute on 2 cores; \
                 from nothing, Burn and its GPU stacks too, about 6 minutes more",
            );
            test::run(args)
        }
        Task::Train(a) => nsa("train", a),
        Task::Generate(a) => nsa("generate", a),
        Task::Eval(a) => nsa("eval", a),
        Task::Plot(a) => nsa("plot", a),
        Task::Profile(a) => nsa_bench("profile", a, Path::new(DEFAULT_OUT)),
        Task::Bench { what: BenchKind::Kernels, nsa: a, out, .. } => nsa_bench("kernels", a, &out),
        Task::Bench { what: BenchKind::Gemm, nsa: a, out, .. } => nsa_bench("gemm", a, &out),
        Task::Bench { what: BenchKind::Profile, nsa: a, out, .. } => nsa_bench("profile", a, &out),
        Task::Bench { what: BenchKind::Selection, nsa: a, out, .. } => nsa_bench("selection", a, &out),
        Task::Bench { what: BenchKind::Launch, nsa: a, out, .. } => nsa_bench("launch", a, &out),
        Task::Bench { what: BenchKind::Decode, nsa: a, anchor, kernels: true, out, .. } => {
            decode_kernels::run(a, anchor, &out)
        }
        Task::Bench { what: BenchKind::Decode, nsa: a, anchor, out, .. } => bench_decode::run(a, anchor, &out),
        Task::Bench { what: BenchKind::Train, nsa: a, anchor, scaling, out, .. } => {
            bench_train::run(a, anchor, scaling, &out)
        }
        Task::Bench { what: BenchKind::Needle, nsa: a, lengths, context, trials, init_from, out, .. } => {
            bench_needle::run(a, bench_needle::NeedleAsk { lengths, context, trials, init_from }, &out)
        }
    }
}

/// The `nsa-train` features every task builds with for `backend`: the CPU and WGPU always (so
/// `train` and `test` share one build of Burn), CUDA where the backend is or detects it, and
/// Burn's autotuning where the machine has a GPU. Without one, WGPU runs on a software Vulkan
/// driver, where autotuning would only multiply the kernels compiled.
pub(crate) fn features(backend: BackendKind) -> Vec<&'static str> {
    let mut features = vec!["cpu", "wgpu"];
    if backend.detect() == BackendKind::Cuda {
        features.push("cuda");
    }
    if BackendKind::Auto.detect() != BackendKind::Cpu {
        features.push("autotune");
    }
    features
}

/// Says what the build about to start compiles: a first build prints cargo's progress for
/// many minutes, and a user should know that is expected.
fn announce_build(what: &str) {
    eprintln!("building {what} (cargo's progress follows)");
}

/// `cargo run --bin nsa` with the backend's features (and the CPU as fallback).
pub(crate) fn nsa(command: &str, args: NsaArgs) -> ExitCode {
    cargo_run("nsa-train", "nsa", command, args, &[])
}

/// `nsa-bench COMMAND --out OUT` in release mode, with the backend's features.
fn nsa_bench(command: &str, args: NsaArgs, out: &Path) -> ExitCode {
    let out = ["--out".to_string(), out.display().to_string()];
    cargo_run("nsa-bench", "nsa-bench", command, NsaArgs { release: true, ..args }, &out)
}

/// `cargo run --bin BIN --features PACKAGE/F.. -- COMMAND --backend B ARGS.. EXTRA..`, built with
/// the features of [`features`] (both packages name their backend features alike). Built from
/// the workspace root, as `cargo xtask test` builds, so the features of every member resolve
/// the same way for both: the test build then reuses this build's `nsa-train` and `nsa`
/// instead of compiling them again.
fn cargo_run(package: &str, bin: &str, command: &str, a: NsaArgs, extra: &[String]) -> ExitCode {
    cargo_command(package, bin, command, a, extra, None)
}

/// `nsa COMMAND ..` as [`nsa`] runs it, with one more environment variable set for cargo (a
/// target runner, say).
pub(crate) fn cargo_run_with(command: &str, args: NsaArgs, env: (&str, &str)) -> ExitCode {
    cargo_command("nsa-train", "nsa", command, args, &[], Some(env))
}

fn cargo_command(
    package: &str,
    bin: &str,
    command: &str,
    a: NsaArgs,
    extra: &[String],
    env: Option<(&str, &str)>,
) -> ExitCode {
    let backend = a.backend.detect();
    let features: Vec<String> = features(backend).iter().map(|f| format!("{package}/{f}")).collect();
    let mut cmd = Command::new(cargo());
    if let Some((key, value)) = env {
        cmd.env(key, value);
    }
    cmd.args(["run", "--bin", bin, "--features", &features.join(",")]);
    if a.release {
        cmd.arg("--release");
    }
    cmd.arg("--").args(command_line(command, backend, &a.args)).args(extra);
    announce_build(&format!(
        "`{bin}`: the first build compiles Burn and its GPU stacks, about 7 minutes on 2 cores; \
         later ones take seconds"
    ));
    run(&mut cmd)
}

/// `nsa COMMAND`'s arguments with `--backend`: after a subcommand (`eval needle`), where clap
/// takes it, and left out for `plot`, which runs on no device.
fn command_line(command: &str, backend: BackendKind, args: &[String]) -> Vec<String> {
    let backend = ["--backend".to_string(), backend.name().to_string()];
    let mut line = vec![command.to_string()];
    match (command, args.first()) {
        ("plot", _) => line.extend_from_slice(args),
        ("eval", Some(sub)) if !sub.starts_with('-') => {
            line.push(sub.clone());
            line.extend(backend);
            line.extend_from_slice(&args[1..]);
        }
        _ => {
            line.extend(backend);
            line.extend_from_slice(args);
        }
    }
    line
}

pub(crate) fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}

fn run(command: &mut Command) -> ExitCode {
    status(command).err().unwrap_or(ExitCode::SUCCESS)
}

/// Runs `command` to its end: `Err` with the exit code to pass on when it fails.
pub(crate) fn status(command: &mut Command) -> Result<(), ExitCode> {
    eprintln!("+ {command:?}");
    match command.status() {
        Ok(status) => exit_code(status),
        Err(e) => {
            eprintln!("error: cannot run {:?}: {e}", command.get_program());
            Err(ExitCode::FAILURE)
        }
    }
}

/// The exit code to pass on: `Err` for a failure.
pub(crate) fn exit_code(status: std::process::ExitStatus) -> Result<(), ExitCode> {
    match status.code() {
        Some(0) => Ok(()),
        code => Err(ExitCode::from(code.unwrap_or(1).clamp(1, 255) as u8)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(command: &str, args: &str) -> String {
        let args: Vec<String> = args.split_whitespace().map(String::from).collect();
        command_line(command, BackendKind::Cpu, &args).join(" ")
    }

    #[test]
    fn the_backend_goes_where_each_command_takes_it() {
        assert_eq!(line("train", "--config c.toml"), "train --backend cpu --config c.toml");
        assert_eq!(line("eval", "--checkpoint r --data d"), "eval --backend cpu --checkpoint r --data d");
        assert_eq!(line("eval", "needle --checkpoint r"), "eval needle --backend cpu --checkpoint r");
        assert_eq!(line("plot", "runs/a runs/b --out p"), "plot runs/a runs/b --out p");
        assert_eq!(line("generate", ""), "generate --backend cpu");
    }
}
