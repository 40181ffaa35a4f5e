//! The flags that select and override a run's configuration, for the binaries that run one.

use std::path::PathBuf;

use nsa_core::AttentionKind;

use crate::config::{BackendKind, Precision, RunConfig};
use crate::data::corpus::Packing;

/// What selects and overrides a run's configuration: shared by `nsa train`, `nsa bench-train`
/// and `nsa-bench profile`.
#[derive(clap::Args)]
pub struct RunArgs {
    /// The run's TOML config [default: configs/tiny.toml; with --resume, the run's saved one].
    #[arg(long)]
    pub config: Option<PathBuf>,
    #[arg(long, value_enum)]
    pub backend: Option<BackendKind>,
    /// Training data (files or directories); repeatable. Overrides `data.paths`.
    #[arg(long)]
    pub data: Vec<PathBuf>,
    /// Overrides `train.precision` (bf16: bf16 compute with f32 master weights; CUDA).
    #[arg(long, value_enum)]
    pub precision: Option<Precision>,
    /// Overrides `train.batch_size` (sequences per micro-batch).
    #[arg(long)]
    pub batch_size: Option<usize>,
    /// Overrides `model.seq_len` (tokens per sequence: the context a run trains at).
    #[arg(long)]
    pub seq_len: Option<usize>,
    /// Overrides `train.kernel_cache` (compiled kernels and autotune results; "" disables).
    #[arg(long)]
    pub kernel_cache: Option<String>,
    /// Overrides `train.devices`: device indices, one model replica each (e.g. `0,1`:
    /// data-parallel over two GPUs, `batch_size` sequences on each).
    #[arg(long, value_delimiter = ',')]
    pub devices: Option<Vec<usize>>,
    /// The selected and window branches on the reference path instead of the fused kernels
    /// (sets `model.attention.fused_kernels = false`).
    #[arg(long)]
    pub reference_attention: bool,
    /// Overrides `model.attention.attention` (`nsa` or `dense`): the same run with full causal
    /// attention, for comparisons.
    #[arg(long, value_parser = parse_attention)]
    pub attention: Option<AttentionKind>,
    /// Overrides `data.pack`: `documents` (each document attends only itself) or `stream` (one
    /// token stream cut into windows: a context as long as the window, across documents).
    #[arg(long, value_enum)]
    pub pack: Option<Packing>,
}

fn parse_attention(name: &str) -> Result<AttentionKind, String> {
    match name {
        "nsa" => Ok(AttentionKind::Nsa),
        "dense" => Ok(AttentionKind::Dense),
        other => Err(format!("unknown attention `{other}` (nsa, dense)")),
    }
}

/// The config a command runs without `--config` (a fresh clone's tiny model).
pub const DEFAULT_CONFIG: &str = "configs/tiny.toml";

impl RunArgs {
    pub fn config_path(&self) -> PathBuf {
        self.config.clone().unwrap_or_else(|| PathBuf::from(DEFAULT_CONFIG))
    }

    /// Applies the flags to `cfg` (loaded from `--config`, or from a run being resumed).
    pub fn apply(&self, cfg: &mut RunConfig) {
        if let Some(b) = self.backend {
            cfg.train.backend = b;
        }
        if !self.data.is_empty() {
            cfg.data.paths = self.data.iter().map(|p| p.display().to_string()).collect();
        }
        if let Some(p) = self.precision {
            cfg.train.precision = p;
        }
        if let Some(b) = self.batch_size {
            cfg.train.batch_size = b;
        }
        if let Some(t) = self.seq_len {
            cfg.model.seq_len = t;
        }
        if let Some(dir) = &self.kernel_cache {
            cfg.train.kernel_cache = dir.clone();
        }
        if let Some(devices) = &self.devices {
            cfg.train.devices = devices.clone();
        }
        if self.reference_attention {
            cfg.model.attention.fused_kernels = false;
        }
        if let Some(kind) = self.attention {
            cfg.model.attention.attention = kind;
        }
        if let Some(pack) = self.pack {
            cfg.data.pack = pack;
        }
    }
}
