//! `cargo xtask`: the project's entry points. Each task is a thin wrapper over cargo, so the
//! commands it runs are printed and can be copied.

use std::path::Path;
use std::process::{Command, ExitCode};

use clap::{Parser, Subcommand, ValueEnum};

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
    /// Build and run `nsa profile`: time each phase of a training step on a config's shapes.
    /// Arguments after `--` go to `nsa profile`: --config, --iters, --warmup, --json, --precision.
    Profile(NsaArgs),
    /// Benchmarks, built in release mode. `kernels`: the fused sparse-attention op
    /// (`nsa bench-kernels`; arguments after `--`: --lengths, --iters, --precision, --check-len).
    Bench {
        #[arg(value_enum)]
        what: BenchKind,
        #[command(flatten)]
        nsa: NsaArgs,
    },
    /// Build and run `nsa generate`: sample from a checkpoint.
    /// Arguments after `--` go to `nsa generate`: --checkpoint, --prompt, --tokens, --temperature, --top-k.
    Generate(NsaArgs),
}

/// How to build `nsa`, and the arguments passed on to it.
#[derive(clap::Args)]
struct NsaArgs {
    #[arg(long, value_enum, default_value_t = Backend::Auto)]
    backend: Backend,
    /// Build with optimisations for our own crates too (dependencies are always optimised).
    #[arg(long)]
    release: bool,
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    args: Vec<String>,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum BenchKind {
    Kernels,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Backend {
    Auto,
    Cuda,
    Wgpu,
    Cpu,
}

impl Backend {
    fn name(self) -> &'static str {
        match self {
            Backend::Auto => "auto",
            Backend::Cuda => "cuda",
            Backend::Wgpu => "wgpu",
            Backend::Cpu => "cpu",
        }
    }

    /// `auto` becomes the best backend this machine has a driver for: an NVIDIA driver means
    /// CUDA, a GPU render node (or macOS) means WGPU, else the CPU.
    fn detect(self) -> Backend {
        if self != Backend::Auto {
            return self;
        }
        let nvidia = Path::new("/dev/nvidiactl").exists() || Path::new("/proc/driver/nvidia").exists();
        let gpu_node = Path::new("/dev/dri/renderD128").exists() || cfg!(target_os = "macos");
        if nvidia {
            Backend::Cuda
        } else if gpu_node {
            Backend::Wgpu
        } else {
            Backend::Cpu
        }
    }
}

fn main() -> ExitCode {
    match Cli::parse().task {
        Task::Test { args } => {
            if let Err(e) = vulkan::ensure_driver() {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
            run(Command::new(cargo()).args(["test", "--workspace"]).args(args))
        }
        Task::Train(a) => nsa("train", a),
        Task::Generate(a) => nsa("generate", a),
        Task::Profile(a) => nsa("profile", a),
        Task::Bench { what: BenchKind::Kernels, nsa: a } => nsa("bench-kernels", NsaArgs { release: true, ..a }),
    }
}

/// `cargo run -p nsa-train --bin nsa` with the backend's feature (and the CPU as fallback).
fn nsa(command: &str, NsaArgs { backend, release, args }: NsaArgs) -> ExitCode {
    let backend = backend.detect();
    let features = if backend == Backend::Cpu { "cpu".to_string() } else { format!("{},cpu", backend.name()) };
    let mut cmd = Command::new(cargo());
    cmd.args(["run", "--quiet", "-p", "nsa-train", "--bin", "nsa", "--no-default-features", "--features", &features]);
    if release {
        cmd.arg("--release");
    }
    cmd.args(["--", command, "--backend", backend.name()]).args(args);
    run(&mut cmd)
}

fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}

fn run(command: &mut Command) -> ExitCode {
    eprintln!("+ {command:?}");
    match command.status() {
        Ok(status) if status.success() => ExitCode::SUCCESS,
        Ok(status) => ExitCode::from(status.code().unwrap_or(1).clamp(1, 255) as u8),
        Err(e) => {
            eprintln!("error: cannot run cargo: {e}");
            ExitCode::FAILURE
        }
    }
}
