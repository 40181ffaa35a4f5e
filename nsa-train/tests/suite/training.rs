//! End-to-end training on the CPU: learning, exact resume, stop on NaN or out of memory, activation
//! checkpointing, the CPU backend's gradients against float64.

use crate::common::{self, weights};

use burn::backend::autodiff::checkpoint::strategy::BalancedCheckpointing;
use burn::backend::{Autodiff, Flex, NdArray};
use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Int, Tensor, TensorData};
use nsa_core::{NsaLm, Phi};
use nsa_train::checkpoint::{self, CheckpointRecorder};
use nsa_train::config::{DataConfig, Packing, RunConfig, TrainConfig};
use nsa_train::dashboard::{Collect, Reporter};
use nsa_train::metrics::StepMetrics;
use nsa_train::parallel::{Fault, FaultKind, INJECTED_ALLOCATION};
use nsa_train::splits::load_splits;
use nsa_train::trainer::{lm_loss, Finish, Stop, Trainer};

type B = Autodiff<Flex>;

fn trainer(cfg: RunConfig, resume: bool) -> Trainer<B> {
    common::new_trainer(cfg, resume).unwrap()
}

/// A fresh tiny run of `steps` in a scratch directory `name`, its train settings changed by
/// `train`: the directory, the config and the trainer.
fn tiny_trainer(
    name: &str,
    steps: usize,
    train: impl FnOnce(TrainConfig) -> TrainConfig,
) -> (std::path::PathBuf, RunConfig, Trainer<B>) {
    let dir = common::scratch(name);
    let cfg = common::tiny_run(&dir, steps);
    let cfg = cfg.clone().with_train(train(cfg.train));
    let t = trainer(cfg.clone(), false);
    (dir, cfg, t)
}

fn losses(t: &mut Trainer<B>, until: usize) -> Vec<f64> {
    let mut seen = Collect::default();
    t.train_until(until, &mut seen).unwrap();
    seen.steps.iter().map(|m| m.loss).collect()
}

#[test]
fn copy_task_loss_falls_below_half_its_start() {
    let dir = common::scratch("learn");
    let mut t = trainer(common::tiny_run(&dir, 160), false);
    let l = losses(&mut t, 160);
    let (start, end) = (l[0], l[l.len() - 5..].iter().sum::<f64>() / 5.0);
    assert!(end < start / 2.0, "loss {start:.3} -> {end:.3}: not below half");
}

#[test]
fn packed_documents_train_validate_and_refuse_what_they_cannot_pack() {
    let dir = common::scratch("documents");
    let text = dir.join("docs.txt");
    let docs: Vec<String> = (0..80)
        .map(|i| format!("document {i}: {}", "the quick brown fox jumps over the lazy dog. ".repeat(1 + i % 4)))
        .collect();
    std::fs::write(&text, docs.join("\n\n\n")).unwrap();
    let cfg = common::tiny_run(&dir, 40);
    let data = DataConfig::new().with_pack(Packing::Documents).with_valid_permille(100);
    let cfg = cfg.clone().with_data(data).with_train(cfg.train.with_valid_batches(1));
    cfg.validate().unwrap();
    let (train, valid, _) = load_splits(&cfg, &[text]).unwrap();
    let mut t = Trainer::<B>::new(cfg.clone(), train, valid, Default::default(), false).unwrap();
    let l = losses(&mut t, 40);
    let end = l[l.len() - 5..].iter().sum::<f64>() / 5.0;
    assert!(l.iter().all(|x| x.is_finite()) && end < l[0] * 0.7, "loss {:.3} -> {end:.3}", l[0]);
    let valid = t.validate().expect("held-out documents");
    assert!(valid.is_finite(), "validation loss {valid}");

    // A synthetic window is one document whatever `pack` says; a length the documents' starts
    // cannot tile is refused in one line.
    let synthetic = cfg.clone().with_data(cfg.data.clone().with_synthetic("copy".into()));
    synthetic.validate().expect("synthetic windows need no packing");
    let misaligned = cfg.clone().with_model(cfg.model.clone().with_seq_len(60));
    let err = misaligned.validate().expect_err("refused").to_string();
    assert!(err.contains("data.pack") && err.contains("stream") && !err.contains('\n'), "{err}");
    let streamed = misaligned.clone().with_data(misaligned.data.clone().with_pack(Packing::Stream));
    streamed.validate().expect("a stream cuts windows at any length");
}

#[test]
fn resume_gives_the_same_losses_and_weights_as_an_uninterrupted_run() {
    let (n, dir_a, dir_b) = (6, common::scratch("resume-a"), common::scratch("resume-b"));
    let cfg_a = common::tiny_run(&dir_a, 2 * n);
    let cfg_a = cfg_a.clone().with_train(cfg_a.train.with_grad_accumulation(2).with_checkpoint_every(100));
    let mut uninterrupted = trainer(cfg_a, false);
    // Both runs start from the same weights: B resumes A's step-0 checkpoint.
    let initial = uninterrupted.save_checkpoint().unwrap();
    let expected = losses(&mut uninterrupted, 2 * n);

    let cfg_b = common::tiny_run(&dir_b, 2 * n);
    let cfg_b = cfg_b.clone().with_train(cfg_b.train.with_grad_accumulation(2).with_checkpoint_every(n));
    common::seed_checkpoint(&initial, &dir_b);
    let mut first = trainer(cfg_b.clone(), true);
    assert_eq!(first.step, 0);
    let mut got = losses(&mut first, n);
    drop(first);
    let mut second = trainer(cfg_b, true);
    assert_eq!(second.step, n);
    got.extend(losses(&mut second, 2 * n));

    assert_eq!(got, expected, "losses differ after resume");
    assert_eq!(weights(&second.replica.model), weights(&uninterrupted.replica.model), "weights differ after resume");
}

/// Running out of device memory stops the run with one line naming the step, the batch and the
/// allocation that failed, keeps the last good checkpoint, and prints no panic: CubeCL's
/// allocation failure (a panic on the device's thread) injected at step 5, seen through the panic
/// hook `nsa` installs ([`nsa_train::failures::install`]). The hook is the whole process's, so
/// the run goes in a process of its own.
#[test]
fn running_out_of_device_memory_is_one_line_and_keeps_the_last_checkpoint() {
    let stderr = common::in_own_process("training::out_of_memory_at_step_5");
    assert!(!stderr.contains("panicked"), "a panic message reached the output:\n{stderr}");
}

#[test]
#[ignore = "runs in a process of its own, from running_out_of_device_memory_is_one_line_and_keeps_the_last_checkpoint"]
fn out_of_memory_at_step_5() {
    nsa_train::failures::install();
    let dir = common::scratch("oom");
    let cfg = common::tiny_run(&dir, 10);
    let cfg = cfg.clone().with_train(cfg.train.with_checkpoint_every(2));
    let mut t = trainer(cfg, false);
    t.fault = Some(Fault { step: 5, rank: 0, kind: FaultKind::OutOfMemory });
    let err = t.train_until(10, &mut Collect::default()).expect_err("the run must stop");
    match &err {
        Stop::OutOfMemory { step: 5, batch: 8, seq_len: 64, requested, last_good } => {
            assert_eq!(*requested, Some(INJECTED_ALLOCATION), "{err}");
            assert!(last_good.as_ref().is_some_and(|p| p.ends_with("step-00000004")), "{err}");
        }
        other => panic!("unexpected stop: {other}"),
    }
    let line = err.to_string();
    assert!(
        line.starts_with("out of device memory at step 5: a batch of 8 x 64 tokens asked for 64.00 GiB more"),
        "{line}"
    );
    assert_eq!(line.lines().count(), 1, "{line}");
}

#[test]
fn a_nan_at_step_k_stops_there_and_earlier_checkpoints_load() {
    let dir = common::scratch("nan");
    let cfg = common::tiny_run(&dir, 20);
    let cfg = cfg.clone().with_train(cfg.train.with_checkpoint_every(2).with_keep_checkpoints(10).with_log_every(3));
    let mut t = trainer(cfg.clone(), false);
    t.fault = Some(Fault::nan_at(7));
    let err = t.train_until(20, &mut Collect::default()).expect_err("the run must stop");
    match &err {
        Stop::NonFinite { step, last_good, .. } => {
            assert_eq!(*step, 7, "{err}");
            assert!(last_good.as_ref().is_some_and(|p| p.ends_with("step-00000006")), "{err}");
        }
        other => panic!("unexpected stop: {other}"),
    }
    assert!(t.step <= 8, "ran {} steps past the fault", t.step - 7);
    let kept: Vec<usize> = checkpoint::list(&dir).into_iter().map(|(s, _)| s).collect();
    assert_eq!(kept, vec![2, 4, 6]);
    for (_, path) in checkpoint::list(&dir) {
        let model: NsaLm<Flex> =
            checkpoint::load_model(&path, cfg.model.init(&Default::default()), &Default::default()).unwrap();
        assert!(weights(&model).iter().all(|w| w.is_finite()));
    }
}

#[test]
fn checkpoints_keep_only_the_newest_k() {
    let (dir, cfg, mut t) = tiny_trainer("keep", 9, |t| t.with_checkpoint_every(2).with_keep_checkpoints(2));
    t.train_until(9, &mut Collect::default()).unwrap();
    let kept: Vec<usize> = checkpoint::list(&dir).into_iter().map(|(s, _)| s).collect();
    assert_eq!(kept, vec![8, 9]);
    // A fresh run refuses to overwrite them.
    let refused = common::new_trainer::<B>(cfg, false).err().unwrap();
    assert!(refused.contains("--resume"), "{refused}");
}

/// A checkpoint of `phi = "linear"` (what `"mlp"` named before the MLP existed) resumed under
/// `phi = "mlp"` stops with one line naming `"linear"` and sets nothing aside; under its own
/// `phi` it resumes.
#[test]
fn a_checkpoint_of_another_phi_is_refused_with_the_fix() {
    let dir = common::scratch("phi-mismatch");
    let cfg = common::tiny_run(&dir, 2);
    let with_phi = |phi| {
        let mut cfg = cfg.clone().with_train(cfg.train.clone().with_checkpoint_every(2));
        cfg.model.attention.phi = phi;
        cfg
    };
    trainer(with_phi(Phi::Linear), false).train_until(2, &mut Collect::default()).unwrap();
    let refused = common::new_trainer::<B>(with_phi(Phi::Mlp), true).err().unwrap();
    assert!(refused.contains("phi = \"linear\"") && !refused.contains('\n'), "{refused}");
    assert_eq!(checkpoint::list(&dir).len(), 1, "the checkpoint was set aside");
    assert_eq!(trainer(with_phi(Phi::Linear), true).step, 2);
}

/// One set of initial weights, shared by every backend of a test through a file.
fn weights_file(cfg: &RunConfig) -> std::path::PathBuf {
    static FILE: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    FILE.get_or_init(|| {
        let path = common::scratch("shared-weights").join("model");
        let model: NsaLm<Flex> = cfg.model.init(&Default::default());
        model.save_file(path.clone(), &CheckpointRecorder::new()).unwrap();
        path
    })
    .clone()
}

/// Every parameter's gradient of the loss on a fixed batch, from [`weights_file`]'s weights.
fn gradients<A: AutodiffBackend + nsa_core::SparseAttentionBackend>(cfg: &RunConfig) -> Vec<Vec<f64>> {
    let device = Default::default();
    let model: NsaLm<A> =
        cfg.model.init(&device).load_file(weights_file(cfg), &CheckpointRecorder::new(), &device).unwrap();
    let tokens: Vec<i64> = (0..2 * 64).map(|i| (i * 37 % 251) as i64).collect();
    let x = Tensor::<A, 2, Int>::from_data(TensorData::new(tokens.clone(), [2, 64]), &device);
    let y = Tensor::<A, 2, Int>::from_data(
        TensorData::new(tokens.iter().map(|t| (t + 1) % 256).collect::<Vec<_>>(), [2, 64]),
        &device,
    );
    let grads = lm_loss(model.forward(x), y).backward();
    struct G<'a, A: AutodiffBackend>(&'a A::Gradients, Vec<Vec<f64>>);
    impl<A: AutodiffBackend> ModuleVisitor<A> for G<'_, A> {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<A, D>>) {
            let g = p.val().grad(self.0).expect("every parameter has a gradient");
            self.1.push(g.into_data().convert::<f64>().to_vec::<f64>().unwrap());
        }
    }
    let mut v = G::<A>(&grads, Vec::new());
    model.visit(&mut v);
    v.1
}

#[test]
fn activation_checkpointing_gives_the_same_gradients() {
    let cfg = common::tiny_run(&common::scratch("ckpt"), 1);
    let plain = gradients::<Autodiff<Flex>>(&cfg).concat();
    let recomputed = gradients::<Autodiff<Flex, BalancedCheckpointing>>(&cfg).concat();
    assert_eq!(plain.len(), recomputed.len());
    let max = plain.iter().zip(&recomputed).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
    assert!(max <= 1e-6, "gradients differ by {max:e}");
    assert!(plain.iter().any(|g| *g != 0.0));
}

/// The CPU backend that training runs on (Burn's `Flex`, f32) against the float64 model from the
/// same weights: each parameter's gradient within f32's rounding of the float64 one.
#[test]
fn the_cpu_backend_gives_the_float64_gradients() {
    let cfg = common::tiny_run(&common::scratch("cpu-f64"), 1);
    // The first backend to touch the `NdArray` device in a process fixes its default float dtype;
    // a reference that silently ran in f32 would pass for the wrong reason.
    let probe = Tensor::<NdArray<f64>, 1>::zeros([1], &Default::default());
    assert_eq!(probe.dtype(), burn::tensor::DType::F64, "another test fixed the NdArray device's dtype first");
    let narrow = gradients::<Autodiff<Flex>>(&cfg);
    let wide = gradients::<Autodiff<NdArray<f64>>>(&cfg);
    assert_eq!(narrow.len(), wide.len());
    for (i, (g, reference)) in narrow.iter().zip(&wide).enumerate() {
        assert_eq!(g.len(), reference.len());
        let scale = reference.iter().fold(1e-12, |m: f64, v| m.max(v.abs()));
        let err = g.iter().zip(reference).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max) / scale;
        assert!(err < 1e-5, "gradient {i} differs from the float64 one by {err:.2e} of its largest");
    }
}

/// Asks to stop once it has seen `after` logged steps, as the dashboard's `q` does.
struct StopAfter {
    after: usize,
    seen: Collect,
}

impl Reporter for StopAfter {
    fn step(&mut self, m: &StepMetrics) {
        self.seen.step(m);
    }
    fn valid(&mut self, step: usize, loss: f64) {
        self.seen.valid(step, loss);
    }
    fn event(&mut self, message: &str) {
        self.seen.event(message);
    }
    fn stop_requested(&self) -> bool {
        self.seen.steps.len() >= self.after
    }
}

#[test]
fn a_stop_request_checkpoints_the_current_step_and_the_run_resumes_from_it() {
    let (_, cfg, mut t) = tiny_trainer("interrupt", 12, |t| t.with_checkpoint_every(100).with_log_every(1));
    let mut reporter = StopAfter { after: 3, seen: Collect::default() };
    let finish = t.train_until(12, &mut reporter).unwrap();
    // The request is seen before step 4 is queued: step 4 runs, is checkpointed, and the run ends.
    let Finish::Interrupted { step, checkpoint } = finish else { panic!("expected an interruption, got {finish:?}") };
    assert_eq!(step, 4);
    assert!(checkpoint.ends_with("step-00000004"), "{}", checkpoint.display());
    let mut resumed = trainer(cfg, true);
    assert_eq!(resumed.step, 4);
    assert_eq!(resumed.train_until(12, &mut Collect::default()).unwrap(), Finish::Completed);
    assert_eq!(resumed.step, 12);
}
