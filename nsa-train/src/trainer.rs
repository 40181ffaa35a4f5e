//! The training loop: micro-batches, accumulation, global-norm clipping, AdamW with decoupled
//! decay on matrices only, warm-up + cosine schedule, metrics, checkpoints, and a stop on the
//! first non-finite loss or gradient.
//!
//! Host reads: none inside a step. After step k is queued, the loss and gradient norm of step k-1
//! (two floats) are read to catch non-finite values, so a bad step is caught at most one step
//! late; log, validation and checkpoint steps read their own values, and a checkpoint is only
//! written after its step was checked finite.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Instant;

use burn::module::{AutodiffModule, Module, ParamId};
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{AdamW, AdamWConfig, GradientsAccumulator, GradientsParams, Optimizer};
use burn::tensor::backend::Backend;
use burn::tensor::{activation, DType, ElementConversion, FloatDType, Int, Tensor, TensorData};
use nsa_core::{cast_params, NsaAux, NsaLm};

use crate::checkpoint::{self, TrainState};
use crate::config::{Precision, RunConfig};
use crate::dashboard::Reporter;
use crate::data::corpus::{BatchOrder, DataCursor, PackedSplit};
use crate::grads::{clip_global_norm, weight_decay_ids, DecayWeights};
use crate::host_times::{HostClock, HostTimes};
use crate::metrics::{MemoryProbe, MetricsLog, StepMetrics};
use crate::schedule::learning_rate;
pub use crate::stop::{Finish, Stop};
use crate::TrainBackend;

/// Mean next-token cross-entropy, computed in f32 whatever the storage dtype.
pub fn lm_loss<B: Backend>(logits: Tensor<B, 3>, targets: Tensor<B, 2, Int>) -> Tensor<B, 1> {
    let [b, t, v] = logits.dims();
    let logits = logits.reshape([b * t, v]);
    let logits = if matches!(logits.dtype(), DType::F16 | DType::BF16) { logits.cast(DType::F32) } else { logits };
    activation::log_softmax(logits, 1).gather(1, targets.reshape([b * t, 1])).mean().neg()
}

/// A panic's message, for an error line.
fn panic_text(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

/// Inputs and next-token targets `[B, T]` for the given windows of a split.
pub fn batch<B: Backend>(
    split: &PackedSplit,
    windows: &[usize],
    device: &B::Device,
) -> (Tensor<B, 2, Int>, Tensor<B, 2, Int>) {
    let t = split.seq_len();
    let mut inputs = Vec::with_capacity(windows.len() * t);
    let mut targets = Vec::with_capacity(windows.len() * t);
    for &w in windows {
        let tokens = split.window(w);
        inputs.extend(tokens[..t].iter().map(|&x| i64::from(x)));
        targets.extend(tokens[1..].iter().map(|&x| i64::from(x)));
    }
    let shape = [windows.len(), t];
    (
        Tensor::from_data(TensorData::new(inputs, shape), device),
        Tensor::from_data(TensorData::new(targets, shape), device),
    )
}

/// Gate and selection statistics of one forward pass, averaged over layers, on the device:
/// `[gate_cmp, gate_slc, gate_win, gate_entropy, selected_blocks_per_query]`.
fn aux_stats<B: Backend>(aux: &[NsaAux<B>]) -> Option<Tensor<B, 1>> {
    // Plain (non-autodiff) tensors: see `Trainer::queue_step`.
    let per_layer: Vec<Tensor<B, 1>> = aux
        .iter()
        .map(|a| {
            let gates = a.gates.clone().cast(DType::F32); // [B, T, 3, H]
            let means = gates.clone().mean_dim(0).mean_dim(1).mean_dim(3).reshape([3]);
            let shares = gates.clone() / gates.sum_dim(2);
            let entropy = (shares.clone() * shares.clamp_min(1e-12).log()).sum_dim(2).mean().neg();
            let selected = a.selected.clone().float().cast(DType::F32).sum_dim(3).mean();
            Tensor::cat(vec![means, entropy, selected], 0)
        })
        .collect();
    let n = per_layer.len();
    (n > 0).then(|| Tensor::stack::<2>(per_layer, 0).mean_dim(0).reshape([5]))
}

/// What one step queued on the device.
pub(crate) struct PendingStep<B: TrainBackend> {
    step: usize,
    /// `[loss, grad_norm]`.
    health: Tensor<B::InnerBackend, 1>,
    stats: Option<Tensor<B::InnerBackend, 1>>,
    lr: f64,
}

type Adam<B> = OptimizerAdaptor<AdamW, NsaLm<B>, B>;

pub struct Trainer<B: TrainBackend> {
    pub cfg: RunConfig,
    device: B::Device,
    pub model: NsaLm<B>,
    optim: Adam<B>,
    decay_ids: HashSet<ParamId>,
    /// Optimiser steps completed.
    pub step: usize,
    cursor: DataCursor,
    order: BatchOrder,
    train: PackedSplit,
    valid: PackedSplit,
    run_dir: PathBuf,
    metrics: MetricsLog,
    /// The checkpoint this run continued from.
    pub resumed_from: Option<PathBuf>,
    /// Newer checkpoints that a resume found damaged and moved aside, one line each.
    pub set_aside: Vec<String>,
    /// Test hook: make the loss of this step NaN.
    pub fault_at_step: Option<usize>,
    /// The dtype forward passes run in (`train.precision`); `None` runs in the parameters' dtype.
    pub compute_dtype: Option<FloatDType>,
    /// Device memory, reported with each logged step where the backend has it.
    pub memory: Option<MemoryProbe>,
    /// The host's time spent queueing each part of the steps so far.
    pub host: HostTimes,
}

impl<B: TrainBackend> Trainer<B> {
    /// A fresh run, or, with `resume`, the newest checkpoint of `cfg.train.out`.
    pub fn new(
        cfg: RunConfig,
        train: PackedSplit,
        valid: PackedSplit,
        device: B::Device,
        resume: bool,
    ) -> Result<Self, String> {
        let run_dir = PathBuf::from(&cfg.train.out);
        let existing = checkpoint::latest(&run_dir);
        if !resume && existing.is_some() {
            return Err(format!(
                "{} already holds checkpoints: pass --resume to continue it, or choose another --out",
                run_dir.display()
            ));
        }
        if train.num_windows() == 0 {
            return Err(format!(
                "the training data holds {} tokens, fewer than one window of seq_len + 1 = {}",
                train.num_tokens(),
                train.seq_len() + 1
            ));
        }
        std::fs::create_dir_all(&run_dir).map_err(|e| format!("{}: {e}", run_dir.display()))?;
        let t = &cfg.train;
        let optim = AdamWConfig::new()
            .with_beta_1(t.beta1 as f32)
            .with_beta_2(t.beta2 as f32)
            .with_epsilon(t.epsilon as f32)
            .with_weight_decay(0.0)
            .init::<B, NsaLm<B>>();
        // Seeded init: the same seed gives the same initial weights (Burn's RNG is per process,
        // so concurrent inits in one process can still interleave).
        B::seed(&device, t.seed);
        let model = cfg.model.init::<B>(&device);
        let decay_ids = weight_decay_ids::<B, _>(&model);
        let mut this = Self {
            order: BatchOrder::new(t.seed, train.num_windows()),
            metrics: MetricsLog::open(&run_dir, resume)?,
            cfg,
            device,
            model: model.clone(),
            optim,
            decay_ids,
            step: 0,
            cursor: DataCursor::default(),
            train,
            valid,
            run_dir,
            resumed_from: None,
            set_aside: Vec::new(),
            fault_at_step: None,
            compute_dtype: None,
            memory: None,
            host: HostTimes::default(),
        };
        this.compute_dtype = match this.cfg.train.precision {
            Precision::F32 => None,
            Precision::Bf16 => Some(FloatDType::BF16),
        };
        if resume {
            this.resume_newest_intact(model)?;
            this.metrics.cut_after(this.step)?;
        }
        this.save_config()?;
        Ok(this)
    }

    /// Loads the newest checkpoint that verifies and loads; each newer one that does not is set
    /// aside (and listed in `set_aside`), so nothing is deleted and the run goes on from the
    /// newest good state.
    fn resume_newest_intact(&mut self, model: NsaLm<B>) -> Result<(), String> {
        let mut why_not = Vec::new();
        for (_, dir) in checkpoint::list(&self.run_dir).into_iter().rev() {
            match self.load_checkpoint(&dir, model.clone()) {
                Ok(()) => {
                    self.resumed_from = Some(dir);
                    return Ok(());
                }
                Err(why) => {
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

    fn load_checkpoint(&mut self, dir: &Path, model: NsaLm<B>) -> Result<(), String> {
        checkpoint::verify(dir)?;
        let state = checkpoint::load_state(dir)?;
        let model = checkpoint::load_model(dir, model, &self.device)?;
        let optim = checkpoint::load_optimizer(dir, self.optim.clone(), &self.device)?;
        self.optim = optim;
        self.decay_ids = weight_decay_ids::<B, _>(&model);
        self.model = model;
        self.step = state.step;
        self.cursor = state.cursor;
        Ok(())
    }

    fn save_config(&self) -> Result<(), String> {
        let text = toml::to_string(&self.cfg).map_err(|e| e.to_string())?;
        let path = self.run_dir.join("config.toml");
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))
    }

    pub fn run_dir(&self) -> &Path {
        &self.run_dir
    }

    /// The model a forward pass runs: the master weights, or a copy in the compute dtype whose
    /// gradients flow back to them in their own dtype.
    fn compute_model<M: Module<C>, C: Backend>(&self, model: M) -> M {
        match self.compute_dtype {
            Some(dtype) => cast_params(model, dtype),
            None => model,
        }
    }

    /// Queues one optimiser step (all micro-batches) and returns its device-side results.
    fn queue_step(&mut self, with_stats: bool) -> PendingStep<B> {
        let t = &self.cfg.train;
        let lr = learning_rate(t, self.step);
        let mut accumulator = GradientsAccumulator::<NsaLm<B>>::new();
        let mut loss_sum: Option<Tensor<B::InnerBackend, 1>> = None;
        let mut stats = None;
        let mut clock = HostClock::start();
        for micro in 0..t.grad_accumulation {
            let windows = self.order.take(&mut self.cursor, t.batch_size);
            let (inputs, targets) = batch::<B>(&self.train, &windows, &self.device);
            let (logits, aux) = self.compute_model(self.model.clone()).forward_with_aux(inputs);
            // The statistics are read off the inner tensors, and the autodiff ones dropped before
            // the backward: autodiff tensors left over from a step are freed in a random order
            // later, which changes the op stream Burn's fusion sees, and it re-plans the whole
            // step: a stall (docs/training.md, "No stalls from the op stream").
            if with_stats && micro == 0 {
                stats = aux_stats(&aux.into_iter().map(NsaAux::inner).collect::<Vec<_>>());
            } else {
                drop(aux);
            }
            let mut loss = lm_loss(logits, targets).div_scalar(t.grad_accumulation as f64);
            if self.fault_at_step == Some(self.step + 1) {
                loss = loss.mul_scalar(f64::NAN);
            }
            let detached = loss.clone().inner();
            loss_sum = Some(match loss_sum.take() {
                Some(s) => s + detached,
                None => detached,
            });
            clock.lap(&mut self.host.forward_ms);
            let grads = GradientsParams::from_grads(loss.backward(), &self.model);
            accumulator.accumulate(&self.model, grads);
            clock.lap(&mut self.host.backward_ms);
        }
        let mut grads = accumulator.grads();
        let norm = clip_global_norm::<B, _>(&self.model, &mut grads, t.grad_clip, &self.device);
        if t.weight_decay > 0.0 {
            let mut decay = DecayWeights { ids: &self.decay_ids, factor: 1.0 - lr * t.weight_decay };
            self.model = self.model.clone().map(&mut decay);
        }
        self.model = self.optim.step(lr, self.model.clone(), grads);
        clock.lap(&mut self.host.optimiser_ms);
        self.step += 1;
        // The loss comes out in the compute dtype, the norm in the master dtype.
        let loss_sum = loss_sum.expect("at least one micro-batch").cast(norm.dtype());
        let health = Tensor::cat(vec![loss_sum, norm], 0);
        PendingStep { step: self.step, health, stats, lr }
    }

    /// Queues one optimiser step and drops its results (for profiling: no checks, no metrics).
    pub fn step_once(&mut self) {
        let _ = self.queue_step(false);
    }

    /// Reads a queued step's loss and gradient norm; an error if either is not finite.
    pub(crate) fn check(&self, pending: &PendingStep<B>) -> Result<(f64, f64), Stop> {
        let data = self.read(pending.step, &pending.health)?;
        let v: Vec<f64> = data.convert::<f64>().to_vec().unwrap();
        let (loss, grad_norm) = (v[0], v[1]);
        if loss.is_finite() && grad_norm.is_finite() {
            Ok((loss, grad_norm))
        } else {
            let last_good = checkpoint::latest(&self.run_dir).map(|(_, p)| p);
            Err(Stop::NonFinite { step: pending.step, loss, grad_norm, last_good })
        }
    }

    /// Why the device failed at `step`: out of memory when an allocation failed ([`crate::oom`]),
    /// else the device's error as one line.
    fn device_failure(&self, step: usize, error: impl std::fmt::Debug) -> Stop {
        match crate::oom::failed_allocation() {
            Some(requested) => Stop::OutOfMemory {
                step,
                batch: self.cfg.train.batch_size,
                seq_len: self.train.seq_len(),
                requested: (requested > 0).then_some(requested),
                last_good: checkpoint::latest(&self.run_dir).map(|(_, p)| p),
            },
            None => Stop::Error(format!("device error at step {step}: {error:?}")),
        }
    }

    /// Reads `tensor` of `step`; a device error, or a panic (a device failure surfacing on this
    /// thread while the op stream drains), becomes a [`Stop`].
    fn read(&self, step: usize, tensor: &Tensor<B::InnerBackend, 1>) -> Result<TensorData, Stop> {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| tensor.clone().try_into_data())) {
            Ok(Ok(data)) => Ok(data),
            Ok(Err(e)) => Err(self.device_failure(step, e)),
            Err(panic) => Err(self.device_failure(step, panic_text(&panic))),
        }
    }

    /// Queues a step; a panic inside it (a device failure surfacing on this thread) becomes a
    /// [`Stop`].
    pub(crate) fn try_queue_step(&mut self, with_stats: bool) -> Result<PendingStep<B>, Stop> {
        let step = self.step + 1;
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.queue_step(with_stats)))
            .map_err(|panic| self.device_failure(step, panic_text(&panic)))
    }

    /// Mean loss over the first `valid_batches` batches of the validation split.
    pub fn validate(&self) -> Option<f64> {
        let t = &self.cfg.train;
        let n = self.valid.num_windows();
        if n == 0 || t.valid_batches == 0 {
            return None;
        }
        let model = self.compute_model(self.model.valid());
        let mut total = 0.0;
        let mut count = 0;
        for chunk in (0..n).collect::<Vec<_>>().chunks(t.batch_size).take(t.valid_batches) {
            let (inputs, targets) = batch::<B::InnerBackend>(&self.valid, chunk, &self.device);
            let loss: f64 = lm_loss(model.forward(inputs), targets).into_scalar().elem::<f64>();
            total += loss;
            count += 1;
        }
        Some(total / count as f64)
    }

    /// Writes a checkpoint of the current state now.
    pub fn save_checkpoint(&self) -> Result<PathBuf, Stop> {
        let state = TrainState { step: self.step, cursor: self.cursor, seed: self.cfg.train.seed };
        checkpoint::save::<B, _, _>(&self.run_dir, &self.model, &self.optim, &state, self.cfg.train.keep_checkpoints)
            .map_err(Stop::Error)
    }

    /// Trains until `until` optimiser steps are done (or `cfg.train.steps`), reporting logged
    /// steps, validations and checkpoints to `reporter`; stops early, after a checkpoint, when the
    /// reporter asks to.
    pub fn train_until(&mut self, until: usize, reporter: &mut dyn Reporter) -> Result<Finish, Stop> {
        let until = until.min(self.cfg.train.steps);
        let t = self.cfg.train.clone();
        let tokens_per_step = (t.batch_size * t.grad_accumulation * self.train.seq_len()) as f64;
        let mut previous: Option<PendingStep<B>> = None;
        let mut clock = Instant::now();
        let mut steps_since_log = 0usize;
        while self.step < until {
            let step = self.step + 1;
            let interrupted = reporter.stop_requested();
            let is_log = step % t.log_every == 0 || step == until;
            let is_checkpoint = step % t.checkpoint_every == 0 || step == until || interrupted;
            let is_valid = t.valid_every > 0 && step % t.valid_every == 0;
            let pending = self.try_queue_step(is_log)?;
            steps_since_log += 1;
            if let Some(prev) = previous.take() {
                self.check(&prev)?;
            }
            if !(is_log || is_checkpoint || is_valid) {
                previous = Some(pending);
                continue;
            }
            let (loss, grad_norm) = self.check(&pending)?;
            if is_log {
                let elapsed = clock.elapsed().as_secs_f64();
                let stats = match &pending.stats {
                    Some(s) => Some(self.read(step, s)?),
                    None => None,
                }
                .map(|d| d.convert::<f64>().to_vec::<f64>().unwrap());
                let memory = self.memory.as_ref().and_then(|probe| probe());
                let metrics = StepMetrics::new(
                    step,
                    loss,
                    grad_norm,
                    pending.lr,
                    tokens_per_step * steps_since_log as f64 / elapsed,
                    stats,
                    memory,
                    &self.cfg.model,
                );
                self.metrics.write(&metrics).map_err(Stop::Error)?;
                reporter.step(&metrics);
                clock = Instant::now();
                steps_since_log = 0;
            }
            if is_valid {
                if let Some(valid_loss) = self.validate() {
                    self.metrics.write_valid(step, valid_loss).map_err(Stop::Error)?;
                    reporter.valid(step, valid_loss);
                }
            }
            if is_checkpoint {
                let path = self.save_checkpoint()?;
                reporter.event(&format!("step {step}: checkpoint {}", path.display()));
                if interrupted {
                    return Ok(Finish::Interrupted { step, checkpoint: path });
                }
            }
        }
        if let Some(prev) = previous.take() {
            self.check(&prev)?;
        }
        Ok(Finish::Completed)
    }
}
