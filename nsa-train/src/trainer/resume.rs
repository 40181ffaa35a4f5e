//! Continuing a run from its newest intact checkpoint.

use std::path::Path;

use nsa_core::NsaLm;

use super::Trainer;
use crate::checkpoint;
use crate::TrainBackend;

/// Why a checkpoint was not resumed from.
enum Refusal {
    /// It does not verify or load: set aside, and an older one tried.
    Damaged(String),
    /// It loads but holds another model than the config's: the run stops with this line.
    OtherModel(String),
}

impl<B: TrainBackend> Trainer<B> {
    /// Loads the newest checkpoint that verifies and loads; each newer one that does not is set
    /// aside (and listed in `set_aside`), so nothing is deleted and the run goes on from the
    /// newest good state.
    pub(super) fn resume_newest_intact(&mut self, model: NsaLm<B>) -> Result<(), String> {
        let mut why_not = Vec::new();
        for (_, dir) in checkpoint::list(&self.run_dir).into_iter().rev() {
            match self.load_checkpoint(&dir, model.clone()) {
                Ok(()) => {
                    self.resumed_from = Some(dir);
                    return Ok(());
                }
                // The checkpoint is sound but not of this config: nothing is set aside.
                Err(Refusal::OtherModel(why)) => return Err(why),
                Err(Refusal::Damaged(why)) => {
                    let moved = checkpoint::set_aside(&dir)?;
                    why_not.push(format!("{}: {why}", dir.display()));
                    self.set_aside.push(format!("{} is damaged ({why}); moved to {}", dir.display(), moved.display()));
                }
            }
        }
        match why_not.is_empty() {
            true => Err(format!("nothing to resume: {} holds no checkpoint", self.run_dir.display())),
            false => Err(format!("nothing to resume: no intact checkpoint ({})", why_not.join("; "))),
        }
    }

    fn load_checkpoint(&mut self, dir: &Path, model: NsaLm<B>) -> Result<(), Refusal> {
        checkpoint::verify(dir).map_err(Refusal::Damaged)?;
        let state = checkpoint::load_state(dir).map_err(Refusal::Damaged)?;
        let device = &self.replica.device;
        let model = checkpoint::load_model(dir, model, device).map_err(Refusal::Damaged)?;
        checkpoint::check_phi(dir, &model, self.cfg.model.attention.phi).map_err(Refusal::OtherModel)?;
        let optimiser = checkpoint::load_optimizer::<B, _>(dir, device).map_err(Refusal::Damaged)?;
        self.replica.restore(model, optimiser);
        self.step = state.step;
        self.cursor = state.cursor;
        Ok(())
    }
}
