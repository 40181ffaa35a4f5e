//! Per-step metrics: printed as plain log lines and appended to `metrics.jsonl` in the run
//! directory. Metric names are valid file names (`[a-z0-9_]`).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use nsa_core::{AttentionKind, NsaLmConfig};
use serde::Serialize;

use crate::failures::gib;

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct StepMetrics {
    pub step: usize,
    pub loss: f64,
    pub perplexity: f64,
    pub grad_norm: f64,
    pub lr: f64,
    pub tokens_per_s: f64,
    /// Mean gate per branch, compressed / selected / window (NSA only).
    pub gate_cmp: Option<f64>,
    pub gate_slc: Option<f64>,
    pub gate_win: Option<f64>,
    /// Entropy of the gates normalised over the three branches (max ln 3 = 1.0986).
    pub gate_entropy: Option<f64>,
    /// Mean distinct selected blocks per query.
    pub sel_blocks_per_query: Option<f64>,
    /// Share of the selected blocks that are forced (block 0 and the two local blocks).
    pub sel_forced_share: Option<f64>,
    /// Device memory held by live tensors, and reserved by the allocator (GPU backends).
    pub memory_in_use_gib: Option<f64>,
    pub memory_reserved_gib: Option<f64>,
    /// In a data-parallel run, the memory reserved on each other device (rank 1 first).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub peer_memory_reserved_gib: Vec<f64>,
}

/// Device memory as the backend's allocator reports it, in bytes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DeviceMemory {
    pub in_use: u64,
    pub reserved: u64,
}

/// Reads the device memory of the calling thread's stream (CubeCL tracks it per stream, so it is
/// called from the training thread).
pub type MemoryProbe = Box<dyn Fn() -> Option<DeviceMemory>>;

/// Makes the memory probe of a device (a probe reads the calling thread's stream, so each
/// data-parallel replica makes its own on its own thread).
pub type MemoryOf<B> = fn(&burn::tensor::Device<B>) -> Option<MemoryProbe>;

/// Mean number of forced blocks per query over positions `0..seq_len`.
fn mean_forced_blocks(model: &NsaLmConfig) -> f64 {
    let l_sel = model.attention.l_sel;
    let n = model.seq_len;
    (0..n).map(|t| ((t / l_sel).min(2) + 1) as f64).sum::<f64>() / n as f64
}

impl StepMetrics {
    #[allow(clippy::too_many_arguments)] // One value per logged field.
    pub fn new(
        step: usize,
        loss: f64,
        grad_norm: f64,
        lr: f64,
        tokens_per_s: f64,
        stats: Option<Vec<f64>>,
        memory: Option<DeviceMemory>,
        model: &NsaLmConfig,
    ) -> Self {
        let stat = |i: usize| stats.as_ref().map(|s| s[i]);
        let nsa = model.attention.attention == AttentionKind::Nsa;
        Self {
            step,
            loss,
            perplexity: loss.exp(),
            grad_norm,
            lr,
            tokens_per_s,
            gate_cmp: stat(0),
            gate_slc: stat(1),
            gate_win: stat(2),
            gate_entropy: stat(3),
            sel_blocks_per_query: stat(4),
            sel_forced_share: stat(4).filter(|_| nsa).map(|s| mean_forced_blocks(model) / s),
            memory_in_use_gib: memory.map(|m| gib(m.in_use)),
            memory_reserved_gib: memory.map(|m| gib(m.reserved)),
            peer_memory_reserved_gib: Vec::new(),
        }
    }

    /// Adds the other replicas' device memory (those that reported it).
    pub fn with_peer_memory(mut self, peers: &[Option<DeviceMemory>]) -> Self {
        self.peer_memory_reserved_gib = peers.iter().flatten().map(|m| gib(m.reserved)).collect();
        self
    }

    /// One plain log line.
    pub fn line(&self, total_steps: usize) -> String {
        let mut line = format!(
            "step {}/{} | loss {:.4} | ppl {:.2} | lr {:.2e} | grad norm {:.3} | {:.0} tok/s",
            self.step, total_steps, self.loss, self.perplexity, self.lr, self.grad_norm, self.tokens_per_s
        );
        if let (Some(c), Some(s), Some(w), Some(h)) = (self.gate_cmp, self.gate_slc, self.gate_win, self.gate_entropy) {
            line += &format!(" | gates cmp/slc/win {c:.3}/{s:.3}/{w:.3} entropy {h:.3}");
        }
        if let (Some(b), Some(f)) = (self.sel_blocks_per_query, self.sel_forced_share) {
            line += &format!(" | selected {b:.2} blocks/query, {:.0}% forced", 100.0 * f);
        }
        if let (Some(used), Some(reserved)) = (self.memory_in_use_gib, self.memory_reserved_gib) {
            line += &format!(" | memory {used:.2} GiB in use, {reserved:.2} GiB reserved");
        }
        if !self.peer_memory_reserved_gib.is_empty() {
            let each: Vec<String> = self.peer_memory_reserved_gib.iter().map(|g| format!("{g:.2}")).collect();
            line += &format!(" | other devices {} GiB reserved", each.join("/"));
        }
        line
    }
}

/// `metrics.jsonl`: one JSON object per logged step or validation.
pub struct MetricsLog {
    path: PathBuf,
    file: File,
}

impl MetricsLog {
    pub fn open(run_dir: &Path, append: bool) -> Result<Self, String> {
        let path = run_dir.join("metrics.jsonl");
        let file = Self::open_file(&path, append)?;
        Ok(Self { path, file })
    }

    fn open_file(path: &Path, append: bool) -> Result<File, String> {
        OpenOptions::new()
            .create(true)
            .write(true)
            .append(append)
            .truncate(!append)
            .open(path)
            .map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Drops the entries of steps after `step` (a resumed run redoes them), so the log holds
    /// each step once, and any line a kill cut short. The shortened log replaces the old one atomically.
    pub fn cut_after(&mut self, step: usize) -> Result<(), String> {
        let err = |path: &Path, e: std::io::Error| format!("{}: {e}", path.display());
        let text = std::fs::read_to_string(&self.path).map_err(|e| err(&self.path, e))?;
        let kept: String = text
            .lines()
            // A line cut short by a kill does not parse: it goes too.
            .filter(|line| match serde_json::from_str::<serde_json::Value>(line) {
                Ok(entry) => entry.get("step").and_then(serde_json::Value::as_u64).is_none_or(|s| s as usize <= step),
                Err(_) => false,
            })
            .map(|line| format!("{line}\n"))
            .collect();
        if kept.len() == text.len() {
            return Ok(());
        }
        crate::files::replace(&self.path, &kept).map_err(|e| err(&self.path, e))?;
        self.file = Self::open_file(&self.path, true)?;
        Ok(())
    }

    pub fn write(&mut self, m: &StepMetrics) -> Result<(), String> {
        let line = serde_json::to_string(m).expect("metrics serialise");
        writeln!(self.file, "{line}").map_err(|e| e.to_string())
    }

    pub fn write_valid(&mut self, step: usize, loss: f64) -> Result<(), String> {
        writeln!(self.file, "{{\"step\":{step},\"valid_loss\":{loss},\"valid_perplexity\":{}}}", loss.exp())
            .map_err(|e| e.to_string())
    }
}
