//! The run configuration: `[model]`, `[train]` and `[data]` tables of one TOML file, typed, with
//! command-line flags laid over them.

use std::path::Path;

use burn::config::Config;
use nsa_core::toml_config::{merge_over, read_table};
use nsa_core::{ConfigError, NsaLmConfig};
use serde::{Deserialize, Serialize};
use toml::Value;

pub use crate::data::corpus::Packing;
use crate::data::synthetic::SyntheticTask;

pub use nsa_backend_kind::BackendKind;

/// Storage precision of activations and weights used in compute.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    F32,
    /// bf16 compute with f32 master weights and optimiser state (CUDA).
    Bf16,
}

#[derive(Config, Debug, PartialEq)]
pub struct TrainConfig {
    /// Optimiser steps to run in total (a resumed run continues to this count).
    #[config(default = 300)]
    pub steps: usize,
    /// Sequences per micro-batch.
    #[config(default = 8)]
    pub batch_size: usize,
    /// Micro-batches accumulated into one optimiser step.
    #[config(default = 1)]
    pub grad_accumulation: usize,
    /// Peak learning rate, reached after `warmup_steps`, then cosine decay to `lr * min_lr_ratio`.
    #[config(default = 2e-3)]
    pub lr: f64,
    #[config(default = 0.1)]
    pub min_lr_ratio: f64,
    #[config(default = 30)]
    pub warmup_steps: usize,
    /// AdamW decoupled weight decay; not applied to norms, biases and embeddings.
    #[config(default = 0.1)]
    pub weight_decay: f64,
    #[config(default = 0.9)]
    pub beta1: f64,
    #[config(default = 0.95)]
    pub beta2: f64,
    #[config(default = 1e-8)]
    pub epsilon: f64,
    /// Clip the global L2 norm of the gradient to this (0 disables).
    #[config(default = 1.0)]
    pub grad_clip: f64,
    #[config(default = 42)]
    pub seed: u64,
    /// Write a checkpoint every this many steps (and at the end).
    #[config(default = 100)]
    pub checkpoint_every: usize,
    /// Checkpoints kept; older ones are deleted.
    #[config(default = 3)]
    pub keep_checkpoints: usize,
    /// Log (and record metrics) every this many steps.
    #[config(default = 10)]
    pub log_every: usize,
    /// Validate every this many steps (0 disables).
    #[config(default = 100)]
    pub valid_every: usize,
    #[config(default = 4)]
    pub valid_batches: usize,
    #[config(default = "BackendKind::Auto")]
    pub backend: BackendKind,
    #[config(default = "Precision::F32")]
    pub precision: Precision,
    /// burn-train's terminal dashboard when stdout is a terminal (plain lines otherwise).
    #[config(default = true)]
    pub dashboard: bool,
    /// Recompute activations in backward instead of storing them (Burn's balanced strategy).
    #[config(default = false)]
    pub activation_checkpointing: bool,
    /// Where CUDA/WGPU keep compiled kernels and autotune results between runs (`~` expands to
    /// the home directory; empty: CubeCL's defaults, no compiled-kernel cache). Without it every
    /// run on a fresh process recompiles and re-autotunes before its first step.
    #[config(default = "String::from(\"~/.cache/nsa/kernels\")")]
    pub kernel_cache: String,
    /// Run directory: config, metrics log and checkpoints.
    #[config(default = "String::from(\"runs/default\")")]
    pub out: String,
    /// Weights to start from (empty: a fresh model): another run's directory (its newest intact
    /// checkpoint) or one checkpoint directory, whose model is this one but for
    /// [`INIT_MAY_CHANGE`]. The optimiser, step, data order and learning-rate schedule start
    /// fresh, so a recipe trained at one length goes on at a longer one. `--resume` continues the
    /// run's own checkpoint instead.
    #[config(default = "String::new()")]
    pub init: String,
    /// Device indices, one model replica each (data-parallel when more than one): every global
    /// batch is `batch_size x devices x grad_accumulation` sequences, each device reading its own
    /// share. The CPU backend runs every replica on the host.
    #[config(default = "vec![0]")]
    pub devices: Vec<usize>,
    /// Seconds a data-parallel replica may take to reach a step's gradient all-reduce before the
    /// run stops with an error naming it (the first step compiles kernels: minutes on a cold cache).
    #[config(default = 900)]
    pub peer_timeout_s: u64,
}

#[derive(Config, Debug, PartialEq)]
pub struct DataConfig {
    /// Files or directories of `.txt`, `.jsonl` (`text` field) or `.parquet` (`text` column).
    #[config(default = "vec![String::from(\"data/corpus\")]")]
    pub paths: Vec<String>,
    /// `"bytes"` or the path of a Hugging Face `tokenizer.json`.
    #[config(default = "String::from(\"bytes\")")]
    pub tokenizer: String,
    /// Documents (by text hash) held out for validation, per thousand.
    #[config(default = 20)]
    pub valid_permille: u32,
    /// `"none"`, or a synthetic task to train on instead of `paths`.
    #[config(default = "String::from(\"none\")")]
    pub synthetic: String,
    /// Share of training windows that are passkey windows (`synthetic = "passkey"`'s, in this
    /// run's tokenizer) mixed among the text's: retrieval taught beside language. 0 for none.
    #[config(default = 0.0)]
    pub passkey_share: f64,
    /// How documents fill the windows: `"documents"` (every document attends only itself, from
    /// a position of its own; each starts at a multiple of the layer's `lcm(d, l_sel)`, the gap
    /// before it padded and left out of the loss) or `"stream"` (one token stream cut into
    /// windows; a query attends across document boundaries). Text only: a synthetic window is
    /// one document either way.
    #[config(default = "Packing::Documents")]
    pub pack: Packing,
}

impl DataConfig {
    pub fn synthetic_task(&self) -> Result<Option<SyntheticTask>, ConfigError> {
        match self.synthetic.as_str() {
            "none" => Ok(None),
            "copy" => Ok(Some(SyntheticTask::Copy)),
            "recall" => Ok(Some(SyntheticTask::Recall)),
            "passkey" => Ok(Some(SyntheticTask::Passkey)),
            other => {
                Err(ConfigError::new("data.synthetic", format!("unknown task `{other}` (none, copy, recall, passkey)")))
            }
        }
    }
}

/// Everything a run needs, as saved in its run directory.
#[derive(Config, Debug, PartialEq)]
pub struct RunConfig {
    #[config(default = "NsaLmConfig::new()")]
    pub model: NsaLmConfig,
    #[config(default = "TrainConfig::new()")]
    pub train: TrainConfig,
    #[config(default = "DataConfig::new()")]
    pub data: DataConfig,
}

/// Settings a resumed run may change: none alters the model, the optimiser's state, the batch or
/// the data order (`fused_kernels` picks another path to the same function; `train.init` is read
/// only when a run starts). `train.steps` stretches the learning-rate schedule from the resumed
/// step on.
pub const RESUME_MAY_CHANGE: [&str; 14] = [
    "train.steps",
    "train.init",
    "train.backend",
    "train.precision",
    "train.kernel_cache",
    "train.dashboard",
    "train.out",
    "train.log_every",
    "train.valid_every",
    "train.valid_batches",
    "train.checkpoint_every",
    "train.keep_checkpoints",
    "train.peer_timeout_s",
    "model.attention.fused_kernels",
];

/// Model settings a run started from another run's weights (`train.init`) may set apart from
/// that run's: the length (no parameter depends on it), and what only draws a fresh model's
/// initial weights or picks a path to the same function.
pub const INIT_MAY_CHANGE: [&str; 4] = ["seq_len", "init_std", "attention.gate_init", "attention.fused_kernels"];

/// The first setting (dotted name) where `a` and `b` differ outside `allowed`, and its value in
/// each (`unset` where it is absent).
fn first_change(a: &Value, b: &Value, allowed: &[&str]) -> Option<(String, String, String)> {
    let mut changed = Vec::new();
    differences(a, b, "", &mut changed);
    let name = changed.into_iter().find(|name| !allowed.contains(&name.as_str()))?;
    let show = |v: &Value| {
        let leaf = name.split('.').try_fold(v, |v, part| v.get(part));
        leaf.map_or_else(|| "unset".to_string(), Value::to_string)
    };
    let (x, y) = (show(a), show(b));
    Some((name, x, y))
}

/// The dotted names of the leaves where two TOML values differ, in key order.
fn differences(a: &Value, b: &Value, at: &str, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Table(a), Value::Table(b)) => {
            let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for key in keys {
                let name = if at.is_empty() { key.clone() } else { format!("{at}.{key}") };
                match (a.get(key), b.get(key)) {
                    (Some(x), Some(y)) => differences(x, y, &name, out),
                    _ => out.push(name),
                }
            }
        }
        (a, b) if a != b => out.push(at.to_string()),
        _ => {}
    }
}

impl RunConfig {
    /// The config `nsa train` runs with. A new run loads `config` (`default` when none is given)
    /// and lays `flags` over it. A resumed run (`resume`) continues with the config it started
    /// with, `<out>/config.toml`: `flags`, and a `config` given explicitly, are laid over that
    /// one and may change only [`RESUME_MAY_CHANGE`]. `out` (the run directory) overrides
    /// `train.out` in every case. Errors are one line: a config that does not load, nothing to
    /// resume, a change a resume refuses, an invalid result.
    pub fn resolve(
        config: Option<&Path>,
        default: &Path,
        out: Option<&str>,
        resume: bool,
        flags: impl FnOnce(&mut RunConfig),
    ) -> Result<RunConfig, String> {
        // `--resume --out DIR` alone needs no config file: the run's saved one is used.
        let saved_decides = resume && config.is_none() && out.is_some();
        let mut cfg = match saved_decides {
            true => RunConfig::new(),
            false => RunConfig::load(config.unwrap_or(default)).map_err(|e| e.to_string())?,
        };
        if let Some(out) = out {
            cfg.train.out = out.to_string();
        }
        let saved = match resume {
            true => {
                let path = Path::new(&cfg.train.out).join("config.toml");
                if !path.exists() {
                    return Err(format!("nothing to resume: {} holds no run (no config.toml)", cfg.train.out));
                }
                let saved = RunConfig::load(&path).map_err(|e| e.to_string())?;
                if config.is_none() {
                    let out = std::mem::take(&mut cfg.train.out);
                    cfg = saved.clone();
                    cfg.train.out = out;
                }
                Some(saved)
            }
            false => None,
        };
        flags(&mut cfg);
        if let Some(saved) = saved {
            saved.check_resume_with(&cfg)?;
        }
        cfg.validate().map_err(|e| e.to_string())?;
        Ok(cfg)
    }

    /// `Ok` when `requested` (a resume's flags and config laid over this, the run's saved config)
    /// changes only [`RESUME_MAY_CHANGE`]; else an error naming the first other setting that
    /// differs.
    pub fn check_resume_with(&self, requested: &RunConfig) -> Result<(), String> {
        let value = |c: &RunConfig| Value::try_from(c).expect("a config serialises");
        match first_change(&value(self), &value(requested), &RESUME_MAY_CHANGE) {
            None => Ok(()),
            Some((name, run, asked)) => Err(format!(
                "--resume cannot change `{name}` ({run} in the run, {asked} requested): a resumed run keeps its \
                 model, batch and data; start a new run (--out) to change it"
            )),
        }
    }

    /// `Ok` when this run's model is `init`'s (the run whose weights it starts from) but for
    /// [`INIT_MAY_CHANGE`]; else an error naming the first other setting that differs.
    pub fn check_init_from(&self, init: &RunConfig) -> Result<(), String> {
        let value = |c: &RunConfig| Value::try_from(&c.model).expect("a model config serialises");
        match first_change(&value(init), &value(self), &INIT_MAY_CHANGE) {
            None => Ok(()),
            Some((name, theirs, ours)) => Err(format!(
                "train.init: the checkpoint's model has model.{name} = {theirs}, this config {ours}: a run \
                 starts from another's weights only with the same model (its seq_len may differ)"
            )),
        }
    }

    /// Reads a TOML file; missing keys take their defaults, unknown keys are errors.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let table = read_table(path)?;
        let model = NsaLmConfig::from_table(&table, &["train", "data"])?;
        let section = |name: &str| match table.get(name) {
            None => Ok(toml::Table::new()),
            Some(Value::Table(t)) => Ok(t.clone()),
            Some(other) => Err(ConfigError::new(name, format!("expected a table, found {}", other.type_str()))),
        };
        let train = merge_over(&TrainConfig::new(), &section("train")?, "train.")?;
        let data = merge_over(&DataConfig::new(), &section("data")?, "data.")?;
        let config = Self { model, train, data };
        config.validate()?;
        Ok(config)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        self.model.validate().map_err(|e| e.under("model."))?;
        let t = &self.train;
        ConfigError::ensure(t.steps >= 1, "train.steps", || format!("must be >= 1, got {}", t.steps))?;
        ConfigError::ensure(t.batch_size >= 1, "train.batch_size", || format!("must be >= 1, got {}", t.batch_size))?;
        ConfigError::ensure(t.grad_accumulation >= 1, "train.grad_accumulation", || {
            format!("must be >= 1, got {}", t.grad_accumulation)
        })?;
        ConfigError::ensure(t.lr.is_finite() && t.lr > 0.0, "train.lr", || {
            format!("must be a finite number > 0, got {}", t.lr)
        })?;
        ConfigError::ensure((0.0..=1.0).contains(&t.min_lr_ratio), "train.min_lr_ratio", || {
            format!("must lie in [0, 1], got {}", t.min_lr_ratio)
        })?;
        ConfigError::ensure(t.weight_decay >= 0.0, "train.weight_decay", || {
            format!("must be >= 0, got {}", t.weight_decay)
        })?;
        ConfigError::ensure((0.0..1.0).contains(&t.beta1), "train.beta1", || {
            format!("must lie in [0, 1), got {}", t.beta1)
        })?;
        ConfigError::ensure((0.0..1.0).contains(&t.beta2), "train.beta2", || {
            format!("must lie in [0, 1), got {}", t.beta2)
        })?;
        ConfigError::ensure(t.epsilon > 0.0, "train.epsilon", || format!("must be > 0, got {}", t.epsilon))?;
        ConfigError::ensure(t.grad_clip >= 0.0, "train.grad_clip", || format!("must be >= 0, got {}", t.grad_clip))?;
        ConfigError::ensure(t.checkpoint_every >= 1, "train.checkpoint_every", || {
            format!("must be >= 1, got {}", t.checkpoint_every)
        })?;
        ConfigError::ensure(t.keep_checkpoints >= 1, "train.keep_checkpoints", || {
            format!("must be >= 1, got {}", t.keep_checkpoints)
        })?;
        ConfigError::ensure(t.log_every >= 1, "train.log_every", || format!("must be >= 1, got {}", t.log_every))?;
        ConfigError::ensure(!t.out.is_empty(), "train.out", || "must not be empty".into())?;
        ConfigError::ensure(!t.devices.is_empty(), "train.devices", || "must name at least one device".into())?;
        let distinct: std::collections::BTreeSet<_> = t.devices.iter().collect();
        ConfigError::ensure(distinct.len() == t.devices.len(), "train.devices", || {
            format!("names a device twice: {:?}", t.devices)
        })?;
        ConfigError::ensure(t.peer_timeout_s >= 1, "train.peer_timeout_s", || {
            format!("must be >= 1, got {}", t.peer_timeout_s)
        })?;
        ConfigError::ensure(self.data.valid_permille < 1000, "data.valid_permille", || {
            format!("must be < 1000, got {}", self.data.valid_permille)
        })?;
        let shortest = crate::data::passkey::shortest_window();
        if self.data.synthetic_task()? == Some(SyntheticTask::Passkey) {
            ConfigError::ensure(self.model.seq_len >= shortest, "data.synthetic", || {
                format!("`passkey` puts a haystack and its answer in each window: needs model.seq_len >= {shortest}")
            })?;
        }
        if self.data.pack == Packing::Documents && self.data.synthetic == "none" {
            let align = self.model.document_alignment();
            ConfigError::ensure(self.model.seq_len.is_multiple_of(align), "data.pack", || {
                format!(
                    "`documents` starts each document at a multiple of {align}: needs model.seq_len a multiple of \
                     it (or pack = \"stream\")"
                )
            })?;
        }
        let share = self.data.passkey_share;
        ConfigError::ensure((0.0..1.0).contains(&share), "data.passkey_share", || {
            format!("must be at least 0 and below 1, got {share}")
        })?;
        if share > 0.0 {
            ConfigError::ensure(self.data.synthetic == "none", "data.passkey_share", || {
                format!("mixes passkey windows into text, not into `synthetic = \"{}\"`", self.data.synthetic)
            })?;
            ConfigError::ensure(self.model.seq_len >= shortest, "data.passkey_share", || {
                format!("a passkey window holds a haystack and its answer: needs model.seq_len >= {shortest}")
            })?;
        }
        Ok(())
    }
}
