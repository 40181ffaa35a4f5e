//! Data-parallel training on the CPU: two replicas (both on the host's one device) through
//! burn-collective's all-reduce must train exactly as one device on the same global batch, resume
//! exactly, and stop every rank cleanly on a non-finite value or a failed rank.

use std::sync::Mutex;

use crate::common::{self, weights};

use burn::backend::{Autodiff, Flex};
use nsa_train::checkpoint;
use nsa_train::config::RunConfig;
use nsa_train::dashboard::Collect;
use nsa_train::metrics::MemoryOf;
use nsa_train::parallel::{Fault, FaultKind};
use nsa_train::splits::load_splits;
use nsa_train::trainer::{Finish, Stop, Trainer};

type B = Autodiff<Flex>;

/// burn-collective keeps one collective per backend type in the process: one run at a time.
static COLLECTIVE: Mutex<()> = Mutex::new(());

const NO_MEMORY: MemoryOf<B> = |_| None;

/// A trainer over `devices` replicas that starts from the checkpoint in `start` (so every run
/// compared starts from the same weights, whatever else the process initialises meanwhile).
fn trainer(cfg: RunConfig, devices: usize, start: Option<&std::path::Path>) -> Trainer<B> {
    if let Some(start) = start {
        common::seed_checkpoint(start, std::path::Path::new(&cfg.train.out));
    }
    let resume = checkpoint::latest(std::path::Path::new(&cfg.train.out)).is_some();
    let (train, valid, _) = load_splits(&cfg, &[]).unwrap();
    let mut t = Trainer::<B>::new(cfg, train, valid, Default::default(), resume).unwrap();
    t.spread(&vec![Default::default(); devices], NO_MEMORY).unwrap();
    t
}

fn run(
    cfg: &RunConfig,
    per_device_batch: usize,
    devices: usize,
    start: &std::path::Path,
    steps: usize,
) -> (Vec<f64>, Vec<f64>) {
    let cfg = cfg
        .clone()
        .with_train(cfg.train.clone().with_batch_size(per_device_batch).with_devices((0..devices).collect()));
    let mut t = trainer(cfg, devices, Some(start));
    let mut seen = Collect::default();
    t.train_until(steps, &mut seen).unwrap();
    (seen.steps.iter().map(|m| m.loss).collect(), weights(&t.replica.model))
}

fn max_difference(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max)
}

/// A fresh run's step-0 checkpoint: the shared starting weights.
fn initial_checkpoint(name: &str) -> (RunConfig, std::path::PathBuf) {
    let dir = common::scratch(name);
    let cfg = common::tiny_run(&dir.join("init"), 6);
    let cfg = cfg.clone().with_train(cfg.train.with_grad_accumulation(2));
    let (train, valid, _) = load_splits(&cfg, &[]).unwrap();
    let t = Trainer::<B>::new(cfg.clone(), train, valid, Default::default(), false).unwrap();
    let path = t.save_checkpoint().unwrap();
    let runs = cfg.clone().with_train(cfg.train.clone().with_out(dir.join("run").display().to_string()));
    (runs, path)
}

fn with_out(cfg: &RunConfig, out: &str) -> RunConfig {
    let dir = std::path::Path::new(&cfg.train.out).parent().unwrap().join(out);
    cfg.clone().with_train(cfg.train.clone().with_out(dir.display().to_string()))
}

/// A fresh two-replica run at batch 4 per replica.
fn two_replicas(name: &str) -> Trainer<B> {
    let (cfg, start) = initial_checkpoint(name);
    let cfg = cfg.clone().with_train(cfg.train.clone().with_batch_size(4).with_devices(vec![0, 1]));
    trainer(cfg, 2, Some(&start))
}

#[test]
fn two_replicas_train_as_one_device_on_the_same_global_batch() {
    let _one_at_a_time = COLLECTIVE.lock().unwrap_or_else(|e| e.into_inner());
    let (cfg, start) = initial_checkpoint("dp-equal");
    let (one_losses, one_weights) = run(&with_out(&cfg, "one"), 8, 1, &start, 6);
    let (two_losses, two_weights) = run(&with_out(&cfg, "two"), 4, 2, &start, 6);
    let loss_gap = max_difference(&one_losses, &two_losses);
    let weight_gap = max_difference(&one_weights, &two_weights);
    assert!(loss_gap < 1e-5, "losses differ by {loss_gap:e}: {one_losses:?} vs {two_losses:?}");
    assert!(weight_gap < 1e-5, "weights differ by {weight_gap:e}");
    // And the comparison can fail: a different global batch gives other weights.
    let (_, other_weights) = run(&with_out(&cfg, "other"), 2, 2, &start, 6);
    assert!(max_difference(&one_weights, &other_weights) > 1e-4, "a smaller global batch trained the same");
}

#[test]
fn a_resumed_two_replica_run_matches_the_uninterrupted_one() {
    let _one_at_a_time = COLLECTIVE.lock().unwrap_or_else(|e| e.into_inner());
    let (cfg, start) = initial_checkpoint("dp-resume");
    let (expected_losses, expected_weights) = run(&with_out(&cfg, "whole"), 4, 2, &start, 6);

    let cut = with_out(&cfg, "cut");
    let cut =
        cut.clone().with_train(cut.train.clone().with_batch_size(4).with_devices(vec![0, 1]).with_checkpoint_every(3));
    let mut first = trainer(cut.clone(), 2, Some(&start));
    let mut seen = Collect::default();
    first.train_until(3, &mut seen).unwrap();
    drop(first);
    let mut second = trainer(cut, 2, None);
    assert_eq!(second.step, 3);
    second.train_until(6, &mut seen).unwrap();
    let losses: Vec<f64> = seen.steps.iter().map(|m| m.loss).collect();
    assert_eq!(losses, expected_losses, "losses differ after resume");
    assert_eq!(weights(&second.replica.model), expected_weights, "weights differ after resume");
}

/// Two replicas trained toward step 6 with `fault` injected.
fn two_replicas_with(name: &str, fault: Fault) -> (Trainer<B>, Result<Finish, Stop>) {
    let mut t = two_replicas(name);
    t.fault = Some(fault);
    let finish = t.train_until(6, &mut Collect::default());
    (t, finish)
}

#[test]
fn a_non_finite_loss_on_one_rank_stops_every_rank_at_that_step() {
    let _one_at_a_time = COLLECTIVE.lock().unwrap_or_else(|e| e.into_inner());
    match two_replicas_with("dp-nan", Fault { step: 4, rank: 1, kind: FaultKind::NonFinite }).1 {
        Err(Stop::NonFinite { step, .. }) => assert_eq!(step, 4),
        other => panic!("expected a non-finite stop at step 4, got {other:?}"),
    }
}

#[test]
fn a_rank_that_fails_stops_the_run_with_its_rank_named() {
    let _one_at_a_time = COLLECTIVE.lock().unwrap_or_else(|e| e.into_inner());
    let (t, finish) = two_replicas_with("dp-fail", Fault { step: 2, rank: 1, kind: FaultKind::Panic });
    match finish {
        Err(Stop::Error(line)) => {
            assert!(line.contains("rank 1") && line.contains("step 2") && line.contains("injected"), "{line}")
        }
        other => panic!("expected an error naming rank 1, got {other:?}"),
    }
    drop(t);
    // The collective is left clean: a later run in this process trains.
    let (cfg, start) = initial_checkpoint("dp-after-fail");
    let (losses, _) = run(&with_out(&cfg, "after"), 4, 2, &start, 2);
    assert_eq!(losses.len(), 2);
}
