//! Starting a run from another run's weights (`train.init`): its model as that checkpoint left
//! it, everything else fresh.

use std::path::{Path, PathBuf};

use nsa_core::NsaLm;

use crate::checkpoint;
use crate::config::RunConfig;
use crate::TrainBackend;

/// `model` (a fresh one of `cfg`) with the weights of the checkpoint `path` names (a run
/// directory or one checkpoint directory), and that checkpoint's directory. Errors are one line:
/// no checkpoint there, a damaged one, or another model than `cfg`'s.
pub(super) fn weights_from<B: TrainBackend>(
    path: &Path,
    model: NsaLm<B>,
    cfg: &RunConfig,
    device: &B::Device,
) -> Result<(NsaLm<B>, PathBuf), String> {
    let (run_dir, dir) = checkpoint::locate(path).map_err(|e| format!("train.init: {e}"))?;
    let config = run_dir.join("config.toml");
    let theirs = RunConfig::load(&config).map_err(|e| format!("train.init: {}: {e}", config.display()))?;
    cfg.check_init_from(&theirs)?;
    let model = checkpoint::load_model(&dir, model, device).map_err(|e| format!("train.init: {e}"))?;
    checkpoint::check_phi(&dir, &model, cfg.model.attention.phi).map_err(|e| format!("train.init: {e}"))?;
    Ok((model, dir))
}
