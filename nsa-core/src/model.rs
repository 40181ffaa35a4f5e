//! `NsaLm`: token embedding, pre-norm blocks (attention, MLP), final norm, LM head.
//!
//! Initialisation (GPT-2 style, scaled with depth): embeddings, projections and the LM head are
//! drawn from `N(0, init_std)` (0.02 by default; not Burn's default `N(0, 1)` embeddings, which
//! would start the residual stream 50x louder than the blocks write into it). The two projections that write into the
//! residual stream, attention `W_o` and the MLP's down projection, use
//! `init_std / sqrt(2 * n_layers)`, so the stream's variance does not grow with depth. Norm gains
//! start at 1, gates at `gate_init`, and `phi = mlp` starts equal to `avg`.

use burn::config::Config;
use burn::module::Module;
use burn::nn::{Embedding, EmbeddingConfig, Initializer, Linear, RmsNorm, RmsNormConfig};
use burn::tensor::{backend::Backend, Int, Tensor};
use nsa_kernels::{
    linear_matmul, rms_norm, silu, silu_linear_matmul, ActivationBackend, Documents, GemmBackend,
    SparseAttentionBackend,
};
use serde::{Deserialize, Serialize};

use crate::attention::projection::{apply, linear};
use crate::attention::{DenseAttention, DenseAttentionConfig, NsaAttention, NsaAttentionConfig, NsaAux};
use crate::config::{AttentionKind, ConfigError, NsaConfig};

/// The feed-forward block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MlpKind {
    /// `down(silu(up(x)))`, the production shape.
    Silu,
    /// `down(silu(gate(x)) * up(x))`.
    Swiglu,
}

#[derive(Config, Debug, PartialEq)]
pub struct NsaLmConfig {
    /// Vocabulary size (256 for bytes).
    #[config(default = 256)]
    pub vocab_size: usize,
    #[config(default = 12)]
    pub n_layers: usize,
    /// Longest sequence the model accepts (RoPE tables are built for it).
    #[config(default = 2048)]
    pub seq_len: usize,
    #[config(default = "MlpKind::Silu")]
    pub mlp: MlpKind,
    /// MLP hidden width as a multiple of `dim`.
    #[config(default = 4)]
    pub mlp_ratio: usize,
    #[config(default = 1e-6)]
    pub norm_eps: f64,
    /// Standard deviation of the initial weights (see the module docs).
    #[config(default = 0.02)]
    pub init_std: f64,
    /// The attention layer; its `dim` is the model width.
    #[config(default = "NsaConfig::new()")]
    pub attention: NsaConfig,
}

impl NsaLmConfig {
    pub fn dim(&self) -> usize {
        self.attention.dim
    }

    /// What packed documents' starts must be multiples of (see [`NsaConfig::document_alignment`];
    /// any position for dense attention).
    pub fn document_alignment(&self) -> usize {
        match self.attention.attention {
            AttentionKind::Nsa => self.attention.document_alignment(),
            AttentionKind::Dense => 1,
        }
    }

    /// Checks every field; the error names the first bad one.
    pub fn validate(&self) -> Result<(), ConfigError> {
        ConfigError::ensure(self.vocab_size >= 1, "vocab_size", || format!("must be >= 1, got {}", self.vocab_size))?;
        ConfigError::ensure(self.n_layers >= 1, "n_layers", || format!("must be >= 1, got {}", self.n_layers))?;
        ConfigError::ensure(self.seq_len >= 1, "seq_len", || format!("must be >= 1, got {}", self.seq_len))?;
        ConfigError::ensure(self.mlp_ratio >= 1, "mlp_ratio", || format!("must be >= 1, got {}", self.mlp_ratio))?;
        ConfigError::ensure(self.norm_eps > 0.0, "norm_eps", || format!("must be > 0, got {}", self.norm_eps))?;
        ConfigError::ensure(self.init_std.is_finite() && self.init_std > 0.0, "init_std", || {
            format!("must be a finite number > 0, got {}", self.init_std)
        })?;
        self.attention.validate().map_err(|e| e.under("attention."))
    }

    /// The model on `device`. Call [`validate`](Self::validate) first: shapes are trusted here.
    pub fn init<B: Backend>(&self, device: &B::Device) -> NsaLm<B> {
        let dim = self.dim();
        let out_std = self.init_std / (2.0 * self.n_layers as f64).sqrt();
        let norm = || RmsNormConfig::new(dim).with_epsilon(self.norm_eps).init(device);
        let blocks = (0..self.n_layers)
            .map(|_| Block {
                attention_norm: norm(),
                attention: match self.attention.attention {
                    AttentionKind::Nsa => Attention::Nsa(
                        NsaAttentionConfig::new(self.attention.clone(), self.seq_len)
                            .with_std(self.init_std)
                            .with_out_std(out_std)
                            .init(device),
                    ),
                    AttentionKind::Dense => Attention::Dense(
                        DenseAttentionConfig::new(self.attention.clone(), self.seq_len)
                            .with_std(self.init_std)
                            .with_out_std(out_std)
                            .init(device),
                    ),
                },
                mlp_norm: norm(),
                mlp: MlpConfig::new(dim, dim * self.mlp_ratio)
                    .with_kind(self.mlp)
                    .with_std(self.init_std)
                    .with_out_std(out_std)
                    .init(device),
            })
            .collect();
        crate::materialize(NsaLm {
            embedding: EmbeddingConfig::new(self.vocab_size, dim)
                .with_initializer(Initializer::Normal { mean: 0.0, std: self.init_std })
                .init(device),
            blocks,
            norm: norm(),
            lm_head: linear(dim, self.vocab_size, self.init_std, device),
            seq_len: self.seq_len,
        })
    }
}

// Few of these exist (one per layer), so the variants' size difference costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Module, Debug)]
pub enum Attention<B: Backend> {
    Nsa(NsaAttention<B>),
    Dense(DenseAttention<B>),
}

impl<B: SparseAttentionBackend> Attention<B> {
    /// `x: [B, T, dim]` -> `[B, T, dim]`.
    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        match self {
            Attention::Nsa(nsa) => nsa.forward(x),
            Attention::Dense(dense) => dense.forward(x, None),
        }
    }
}

#[derive(Module, Debug)]
pub struct Mlp<B: Backend> {
    pub up: Linear<B>,
    /// Present for SwiGLU.
    pub gate: Option<Linear<B>>,
    pub down: Linear<B>,
}

/// The feed-forward block `dim -> hidden -> dim`: up (and gate) projections from `N(0, std)`,
/// the down projection from `N(0, out_std)`.
#[derive(Config, Debug)]
pub struct MlpConfig {
    pub dim: usize,
    pub hidden: usize,
    #[config(default = "MlpKind::Silu")]
    pub kind: MlpKind,
    #[config(default = 0.02)]
    pub std: f64,
    #[config(default = 0.02)]
    pub out_std: f64,
}

impl MlpConfig {
    pub fn init<B: Backend>(&self, device: &B::Device) -> Mlp<B> {
        let MlpConfig { dim, hidden, kind, std, out_std } = *self;
        Mlp {
            up: linear(dim, hidden, std, device),
            gate: (kind == MlpKind::Swiglu).then(|| linear(dim, hidden, std, device)),
            down: linear(hidden, dim, out_std, device),
        }
    }
}

impl<B: Backend> Mlp<B> {
    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3>
    where
        B: GemmBackend + ActivationBackend,
    {
        // `nsa_kernels::silu`: its backward keeps only its input, not `sigmoid(x)` beside it; with
        // no gate, the down projection takes `silu` in and keeps only the up projection's output.
        let out = match &self.gate {
            None => silu_linear_matmul(apply(&self.up, x), self.down.weight.val()),
            Some(gate) => linear_matmul(silu(apply(gate, x.clone())) * apply(&self.up, x), self.down.weight.val()),
        };
        match &self.down.bias {
            Some(bias) => out + bias.val().unsqueeze(),
            None => out,
        }
    }
}

#[derive(Module, Debug)]
pub struct Block<B: Backend> {
    pub attention_norm: RmsNorm<B>,
    pub attention: Attention<B>,
    pub mlp_norm: RmsNorm<B>,
    pub mlp: Mlp<B>,
}

impl<B: SparseAttentionBackend> Block<B> {
    fn forward(&self, x: Tensor<B, 3>, documents: Option<&Documents<B>>) -> (Tensor<B, 3>, Option<NsaAux<B>>) {
        let normed = norm(&self.attention_norm, x.clone());
        let (attended, aux) = match &self.attention {
            Attention::Nsa(nsa) => {
                let (out, aux) = nsa.forward_with_aux(normed, documents);
                (out, Some(aux))
            }
            Attention::Dense(dense) => (dense.forward(normed, documents), None),
        };
        let x = x + attended;
        let x = x.clone() + self.mlp.forward(norm(&self.mlp_norm, x));
        (x, aux)
    }
}

/// A Burn `RmsNorm`'s function through `nsa_kernels::rms_norm`, whose forward keeps only its
/// input and one statistic per row for the backward (Burn's keeps about three activations).
pub(crate) fn norm<B: SparseAttentionBackend>(layer: &RmsNorm<B>, x: Tensor<B, 3>) -> Tensor<B, 3> {
    rms_norm(x, layer.gamma.val(), layer.epsilon)
}

#[derive(Module, Debug)]
pub struct NsaLm<B: Backend> {
    pub embedding: Embedding<B>,
    pub blocks: Vec<Block<B>>,
    pub norm: RmsNorm<B>,
    pub lm_head: Linear<B>,
    seq_len: usize,
}

/// Vocabularies up to this size are embedded as a product of one-hot rows with the table.
pub const ONE_HOT_VOCAB: usize = 1024;

/// Token embeddings `[B, T, dim]` for `tokens: [B, T]`.
///
/// A gather's backward is a scatter-add of every token's gradient row into its table row; with a
/// small vocabulary (the byte model's 256 rows) tens of thousands of rows land on the same few
/// hundred, and the atomic adds contend. So a small vocabulary is looked up as `one_hot(tokens)
/// W`, whose backward is a product too. It is exact: each output sums one table entry times one
/// and zeros, accumulated in f32 or wider.
pub fn embed<B: GemmBackend>(embedding: &Embedding<B>, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3> {
    let weight = embedding.weight.val();
    let [vocab, _] = weight.dims();
    if vocab > ONE_HOT_VOCAB {
        return embedding.forward(tokens);
    }
    let [b, t] = tokens.dims();
    let device = tokens.device();
    let ids = crate::constants::cached::<B, _>("vocab_ids", &[vocab], &device, || {
        Tensor::<B, 1, Int>::arange(0..vocab as i64, &device).reshape([1, 1, vocab])
    });
    let one_hot = tokens.reshape([b, t, 1]).expand([b, t, vocab]).equal(ids.expand([b, t, vocab]));
    linear_matmul(one_hot.float().cast(weight.dtype()), weight)
}

impl<B: Backend> NsaLm<B> {
    /// The `phi` whose parameters the NSA layers hold (`None` for dense attention). A
    /// checkpoint loaded into a model of another `phi` leaves that `phi`'s parameters out, so
    /// this tells what a loaded model computes.
    pub fn phi(&self) -> Option<crate::config::Phi> {
        self.blocks.iter().find_map(|block| match &block.attention {
            Attention::Nsa(layer) => Some(layer.compressor.phi()),
            Attention::Dense(_) => None,
        })
    }
}

impl<B: SparseAttentionBackend> NsaLm<B> {
    /// `tokens: [B, T]` -> logits `[B, T, vocab]`.
    pub fn forward(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        self.forward_with_aux(tokens, None).0
    }

    /// Logits and, per NSA layer, its gates and selection (empty for dense attention). With
    /// `documents`, each row is packed documents, each computed as if alone.
    pub fn forward_with_aux(
        &self,
        tokens: Tensor<B, 2, Int>,
        documents: Option<&Documents<B>>,
    ) -> (Tensor<B, 3>, Vec<NsaAux<B>>) {
        let t = tokens.dims()[1];
        assert!(t <= self.seq_len, "input of {t} tokens is longer than the model's seq_len {}", self.seq_len);
        let mut x = embed(&self.embedding, tokens);
        let mut aux = Vec::new();
        for block in &self.blocks {
            let (next, layer_aux) = block.forward(x, documents);
            x = next;
            aux.extend(layer_aux);
        }
        (apply(&self.lm_head, norm(&self.norm, x)), aux)
    }
}

impl<B: Backend> NsaLm<B> {
    pub fn seq_len(&self) -> usize {
        self.seq_len
    }
}
