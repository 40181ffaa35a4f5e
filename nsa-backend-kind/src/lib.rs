//! The compute backend a command runs on. Its own crate, without Burn, so that `cargo xtask`
//! (which picks the build's features by it) and the binaries built with those features (`nsa`,
//! `nsa-bench`) take the same `--backend` values.

use std::path::Path;

/// Compute backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize), serde(rename_all = "lowercase"))]
pub enum BackendKind {
    /// CUDA if a driver loads, else WGPU if an adapter exists, else CPU.
    Auto,
    Cuda,
    Wgpu,
    Cpu,
}

impl BackendKind {
    /// The name `--backend` takes.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Auto => "auto",
            BackendKind::Cuda => "cuda",
            BackendKind::Wgpu => "wgpu",
            BackendKind::Cpu => "cpu",
        }
    }

    /// `auto` becomes the best backend this machine has a driver for: an NVIDIA driver means
    /// CUDA, a GPU render node (or macOS) means WGPU, else the CPU. This looks at driver files
    /// only, before anything is built; a binary built with a backend's feature probes the
    /// device itself.
    pub fn detect(self) -> BackendKind {
        if self != BackendKind::Auto {
            return self;
        }
        let nvidia = Path::new("/dev/nvidiactl").exists() || Path::new("/proc/driver/nvidia").exists();
        let gpu_node = Path::new("/dev/dri/renderD128").exists() || cfg!(target_os = "macos");
        if nvidia {
            BackendKind::Cuda
        } else if gpu_node {
            BackendKind::Wgpu
        } else {
            BackendKind::Cpu
        }
    }
}
