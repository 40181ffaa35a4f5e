//! Starting a run from another run's weights (`train.init`): they land at another length with a
//! fresh step; another model, or a path with no checkpoint, is refused in one line.

use crate::common::{self, weights};

use burn::backend::{Autodiff, Flex};
use nsa_train::config::RunConfig;
use nsa_train::dashboard::Collect;
use nsa_train::trainer::Trainer;

type B = Autodiff<Flex>;

fn trainer(cfg: RunConfig) -> Result<Trainer<B>, String> {
    common::new_trainer(cfg, false)
}

/// A tiny run of `steps` in `name` (checkpointed at its last step), with `init` as `train.init`.
fn tiny(name: &str, steps: usize, init: &str) -> RunConfig {
    let cfg = common::tiny_run(&common::scratch(name), steps);
    cfg.clone().with_train(cfg.train.with_checkpoint_every(steps).with_init(init.into()))
}

#[test]
fn a_run_starts_from_another_runs_weights_at_another_length() {
    let first = tiny("init-first", 2, "");
    let mut trained = trainer(first.clone()).unwrap();
    trained.train_until(2, &mut Collect::default()).unwrap();
    let want = weights(&trained.replica.model);
    drop(trained);

    let mut longer = tiny("init-longer", 2, &first.train.out);
    longer.model.seq_len *= 2;
    let started = trainer(longer.clone()).unwrap();
    assert_eq!(started.step, 0);
    assert!(started.initialised_from.is_some());
    assert_eq!(weights(&started.replica.model), want, "the run did not start from the checkpoint's weights");
    assert_ne!(weights(&trainer(tiny("init-fresh", 2, "")).unwrap().replica.model), want);

    let mut deeper = tiny("init-deeper", 2, &first.train.out);
    deeper.model.n_layers += 1;
    let refused = trainer(deeper).err().unwrap();
    assert!(refused.contains("model.n_layers") && !refused.contains('\n'), "{refused}");

    let nowhere = tiny("init-nowhere", 2, &longer.train.out);
    let refused = trainer(nowhere).err().unwrap();
    assert!(
        refused.starts_with("train.init:") && refused.contains("no checkpoint") && !refused.contains('\n'),
        "{refused}"
    );
}
