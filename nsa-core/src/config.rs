//! Typed configuration of the NSA attention layer, with the validity rules of the spec.

use burn::config::Config;
use serde::{Deserialize, Serialize};

/// How the `l` keys (values) of a compression block become one compressed key (value).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phi {
    /// The mean of the block.
    Avg,
    /// Intra-block position embedding, flatten, one linear map `l*d -> d`; starts equal to `Avg`.
    Linear,
    /// Intra-block position embedding, flatten, `Linear(l*d -> hidden)`, GELU,
    /// `Linear(hidden -> d)`: the paper's learnable MLP.
    Mlp,
}

/// Which attention the model's blocks use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AttentionKind {
    /// Native Sparse Attention: compressed, selected and sliding-window branches.
    Nsa,
    /// Full causal GQA attention, for A/B comparisons on the same model.
    Dense,
}

/// One invalid configuration value. Displays as a single line naming the field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// Dotted path of the offending field, e.g. `model.attention.l`.
    pub field: String,
    /// What is wrong with it.
    pub message: String,
}

impl ConfigError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self { field: field.into(), message: message.into() }
    }

    /// `Ok` when `ok`, else this error: the one-line form every config rule uses.
    pub fn ensure(ok: bool, field: &str, message: impl FnOnce() -> String) -> Result<(), ConfigError> {
        if ok {
            Ok(())
        } else {
            Err(ConfigError::new(field, message()))
        }
    }

    /// The same error, with its field placed under `prefix` (e.g. `model.`).
    pub fn under(mut self, prefix: &str) -> Self {
        self.field = format!("{prefix}{}", self.field);
        self
    }
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "invalid config `{}`: {}", self.field, self.message)
    }
}

impl std::error::Error for ConfigError {}

/// The NSA attention layer. Field names follow the paper; the defaults are the production shape
/// (`configs/nsa-125m.toml`).
#[derive(Config, Debug, PartialEq)]
pub struct NsaConfig {
    /// Model (residual stream) width.
    #[config(default = 768)]
    pub dim: usize,
    /// Query heads `H_q`.
    #[config(default = 12)]
    pub n_heads: usize,
    /// Key/value heads `H_kv`; `n_heads / n_kv_heads` query heads share one selection.
    #[config(default = 2)]
    pub n_kv_heads: usize,
    /// Query/key head dim `d_k` (even: RoPE rotates pairs).
    #[config(default = 64)]
    pub d_k: usize,
    /// Value head dim `d_v`.
    #[config(default = 64)]
    pub d_v: usize,
    /// Compression block length `l`.
    #[config(default = 32)]
    pub l: usize,
    /// Compression stride `d`.
    #[config(default = 16)]
    pub d: usize,
    /// Selection block length `l'`.
    #[config(default = 64)]
    pub l_sel: usize,
    /// Selected blocks per query `n`, forced blocks included.
    #[config(default = 16)]
    pub n: usize,
    /// Sliding window `w`.
    #[config(default = 512)]
    pub w: usize,
    /// Compression function.
    #[config(default = "Phi::Avg")]
    pub phi: Phi,
    /// `phi = mlp`'s hidden width (`None`: twice the head dim, of keys and values each).
    #[config(default = "None")]
    pub phi_hidden: Option<usize>,
    /// One K/V projection for all three branches (what fla does) instead of one per branch.
    #[config(default = false)]
    pub shared_kv: bool,
    /// RoPE base.
    #[config(default = 10000.0)]
    pub rope_base: f64,
    /// Sparse (NSA) or dense attention.
    #[config(default = "AttentionKind::Nsa")]
    pub attention: AttentionKind,
    /// Value every branch gate starts at (the gate bias is its logit, the gate weight zero).
    #[config(default = 0.5)]
    pub gate_init: f64,
    /// The selected and window branches through the fused kernels where the backend has them
    /// (CUDA, WGPU); false: the reference path (masked dense attention) on every backend. Both
    /// compute the same function; this only trades speed and memory (docs/benchmarks.md).
    #[config(default = true)]
    pub fused_kernels: bool,
}

impl NsaConfig {
    /// Query heads per KV head.
    pub fn group_size(&self) -> usize {
        self.n_heads / self.n_kv_heads
    }

    /// What packed documents' starts must be multiples of: `lcm(d, l_sel)`, so that each
    /// document's compression and selection blocks are the row's blocks that start in it.
    pub fn document_alignment(&self) -> usize {
        let gcd = |mut a: usize, mut b: usize| {
            while b != 0 {
                (a, b) = (b, a % b);
            }
            a
        };
        self.d / gcd(self.d, self.l_sel).max(1) * self.l_sel
    }

    /// Checks every rule of the spec; the first broken one is returned.
    pub fn validate(&self) -> Result<(), ConfigError> {
        ConfigError::ensure(self.dim >= 1, "dim", || format!("must be >= 1, got {}", self.dim))?;
        ConfigError::ensure(self.n_heads >= 1, "n_heads", || format!("must be >= 1, got {}", self.n_heads))?;
        ConfigError::ensure(self.n_kv_heads >= 1, "n_kv_heads", || format!("must be >= 1, got {}", self.n_kv_heads))?;
        ConfigError::ensure(self.n_heads.is_multiple_of(self.n_kv_heads), "n_heads", || {
            format!("{} must be a multiple of n_kv_heads = {}", self.n_heads, self.n_kv_heads)
        })?;
        ConfigError::ensure(self.d_k >= 2 && self.d_k.is_multiple_of(2), "d_k", || {
            format!("must be even and >= 2 (RoPE rotates pairs), got {}", self.d_k)
        })?;
        ConfigError::ensure(self.d_v >= 1, "d_v", || format!("must be >= 1, got {}", self.d_v))?;
        ConfigError::ensure(self.rope_base.is_finite() && self.rope_base > 1.0, "rope_base", || {
            format!("must be a finite number > 1, got {}", self.rope_base)
        })?;
        ConfigError::ensure(self.gate_init > 0.0 && self.gate_init < 1.0, "gate_init", || {
            format!("must lie strictly between 0 and 1, got {}", self.gate_init)
        })?;
        if self.attention == AttentionKind::Dense {
            return Ok(());
        }
        ConfigError::ensure(self.d >= 1, "d", || format!("must be >= 1, got {}", self.d))?;
        ConfigError::ensure(self.l >= self.d, "l", || format!("{} must be >= d = {}", self.l, self.d))?;
        ConfigError::ensure(self.l.is_multiple_of(self.d), "l", || {
            format!("{} must be a multiple of d = {}", self.l, self.d)
        })?;
        ConfigError::ensure(self.l_sel >= 1, "l_sel", || format!("must be >= 1, got {}", self.l_sel))?;
        ConfigError::ensure(self.l_sel.is_multiple_of(self.d), "l_sel", || {
            format!("{} must be a multiple of d = {}", self.l_sel, self.d)
        })?;
        ConfigError::ensure(self.n >= 3, "n", || {
            format!("must be >= 3 (block 0 and two local blocks are forced), got {}", self.n)
        })?;
        ConfigError::ensure(self.w >= 1, "w", || format!("must be >= 1, got {}", self.w))?;
        ConfigError::ensure(self.phi_hidden != Some(0), "phi_hidden", || "must be >= 1".to_string())
    }
}
