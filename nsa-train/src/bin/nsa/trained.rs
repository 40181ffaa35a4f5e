//! A trained checkpoint opened for inference (`nsa generate`, `nsa eval`): its run config, the
//! backend and dtype to run it on, and its model.

use std::path::{Path, PathBuf};

use burn::tensor::FloatDType;
use nsa_core::{cast_params, NsaLm, SparseAttentionBackend};
use nsa_train::backends::{resolve, use_kernel_cache};
use nsa_train::checkpoint;
use nsa_train::config::{BackendKind, Precision, RunConfig};
use nsa_train::data::tokenizer::Tokenizer;

/// Where and in what dtype a checkpoint runs (default: the run's backend and, on CUDA, its
/// precision).
#[derive(clap::Args)]
pub(crate) struct RunOn {
    #[arg(long, value_enum)]
    pub(crate) precision: Option<Precision>,
    #[arg(long, value_enum)]
    pub(crate) backend: Option<BackendKind>,
}

/// A checkpoint's run config and directory, and the backend and dtype to run it on.
pub(crate) struct Loaded {
    pub(crate) cfg: RunConfig,
    pub(crate) ckpt: PathBuf,
    pub(crate) kind: BackendKind,
    dtype: Option<FloatDType>,
}

impl Loaded {
    pub(crate) fn open(path: &Path, run_on: &RunOn) -> Result<Self, String> {
        let RunOn { precision, backend } = *run_on;
        let (run_dir, ckpt) = checkpoint::locate(path)?;
        let cfg = RunConfig::load(&run_dir.join("config.toml")).map_err(|e| e.to_string())?;
        let _ = use_kernel_cache(&cfg.train.kernel_cache)?;
        let kind = resolve(backend.unwrap_or(cfg.train.backend))?;
        // bf16 where the run trained in it on CUDA; the other backends evaluate in f32.
        let dtype = match (precision, kind) {
            (Some(Precision::Bf16), BackendKind::Cuda) => Some(FloatDType::BF16),
            (Some(Precision::Bf16), _) => {
                return Err(format!("--precision bf16 needs the CUDA backend, not {}", kind.name()))
            }
            (None, BackendKind::Cuda) if cfg.train.precision == Precision::Bf16 => Some(FloatDType::BF16),
            _ => None,
        };
        Ok(Self { cfg, ckpt, kind, dtype })
    }

    /// The backend and dtype the model runs on, e.g. `cuda bf16`.
    pub(crate) fn runs_on(&self) -> String {
        let dtype = match self.dtype {
            Some(FloatDType::BF16) => "bf16",
            _ => "f32",
        };
        format!("{} {dtype}", self.kind.name())
    }

    pub(crate) fn tokenizer(&self) -> Result<Tokenizer, String> {
        Tokenizer::from_spec(&self.cfg.data.tokenizer).map_err(|e| e.to_string())
    }

    /// The checkpoint's model on `B`, in the dtype chosen.
    pub(crate) fn model<B: SparseAttentionBackend>(&self, device: &B::Device) -> Result<NsaLm<B>, String> {
        let model: NsaLm<B> = self.cfg.model.init(device);
        let model = checkpoint::load_model(&self.ckpt, model, device)?;
        checkpoint::check_phi(&self.ckpt, &model, self.cfg.model.attention.phi)?;
        Ok(match self.dtype {
            Some(dtype) => cast_params(model, dtype),
            None => model,
        })
    }
}
