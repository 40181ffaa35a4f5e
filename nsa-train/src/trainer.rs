//! The training loop: micro-batches, accumulation, global-norm clipping, AdamW with decoupled
//! decay on matrices only, warm-up + cosine schedule, metrics, checkpoints, and a stop on the
//! first non-finite loss or gradient.
//!
//! Host reads: none inside a step. After step k is queued, the loss and gradient norm of step k-1
//! (two floats) are read to catch non-finite values, so a bad step is caught at most one step
//! late; log, validation and checkpoint steps read their own values, and a checkpoint is only
//! written after its step was checked finite.

use std::path::{Path, PathBuf};
use std::time::Instant;

use burn::module::AutodiffModule;
use burn::tensor::backend::Backend;
use burn::tensor::{ElementConversion, FloatDType, Int, Tensor, TensorData};
use nsa_core::NsaLm;

use crate::checkpoint::{self, TrainState};
use crate::config::{Precision, RunConfig};
use crate::dashboard::Reporter;
use crate::data::corpus::{BatchOrder, DataCursor, PackedSplit};
use crate::failures::{catch, panic_message};
pub use crate::failures::{Finish, Stop};
use crate::grads::weight_decay_ids;
use crate::host_times::HostTimes;
use crate::metrics::{MemoryProbe, MetricsLog, StepMetrics};
use crate::optim::FusedAdamW;
use crate::parallel::{Group, MemoryOf};
use crate::replica::{Fault, HostBatch, Replica, StepPlan};
use crate::schedule::learning_rate;
use crate::TrainBackend;

pub use nsa_core::lm_loss;

/// Inputs and next-token targets `[B, T]` for the given windows of a split.
pub fn batch<B: Backend>(
    split: &PackedSplit,
    windows: &[usize],
    device: &B::Device,
) -> (Tensor<B, 2, Int>, Tensor<B, 2, Int>) {
    host_batch(split, windows).to_device::<B>(device)
}

/// The same, assembled on the host.
pub fn host_batch(split: &PackedSplit, windows: &[usize]) -> HostBatch {
    let t = split.seq_len();
    let mut inputs = Vec::with_capacity(windows.len() * t);
    let mut targets = Vec::with_capacity(windows.len() * t);
    for &w in windows {
        let tokens = split.window(w);
        inputs.extend(tokens[..t].iter().map(|&x| i64::from(x)));
        targets.extend(tokens[1..].iter().map(|&x| i64::from(x)));
    }
    HostBatch { inputs, targets, shape: [windows.len(), t] }
}

/// What one step queued on the device.
pub(crate) struct PendingStep<B: TrainBackend> {
    step: usize,
    /// `[loss, grad_norm]`.
    health: Tensor<B::InnerBackend, 1>,
    stats: Option<Tensor<B::InnerBackend, 1>>,
    lr: f64,
}

pub struct Trainer<B: TrainBackend> {
    pub cfg: RunConfig,
    /// Rank 0's model and optimiser, on the run's first device.
    pub replica: Replica<B>,
    /// The other devices' replicas, in a data-parallel run.
    group: Option<Group>,
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
    /// Test hook: a failure to inject at one step.
    pub fault: Option<Fault>,
    /// Device memory, reported with each logged step where the backend has it.
    pub memory: Option<MemoryProbe>,
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
        let optim = FusedAdamW::new(t.beta1 as f32, t.beta2 as f32, t.epsilon as f32);
        // Seeded init: the same seed gives the same initial weights (Burn's RNG is per process,
        // so concurrent inits in one process can still interleave).
        B::seed(&device, t.seed);
        let model = cfg.model.init::<B>(&device);
        let decay_ids = weight_decay_ids::<B, _>(&model);
        let compute_dtype = match t.precision {
            Precision::F32 => None,
            Precision::Bf16 => Some(FloatDType::BF16),
        };
        let replica = Replica {
            rank: 0,
            device,
            model: model.clone(),
            compute: None,
            optim,
            decay_ids,
            compute_dtype,
            host: HostTimes::default(),
        };
        let mut this = Self {
            order: BatchOrder::new(t.seed, train.num_windows()),
            metrics: MetricsLog::open(&run_dir, resume)?,
            cfg,
            replica,
            group: None,
            step: 0,
            cursor: DataCursor::default(),
            train,
            valid,
            run_dir,
            resumed_from: None,
            set_aside: Vec::new(),
            fault: None,
            memory: None,
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
        let r = &mut self.replica;
        let model = checkpoint::load_model(dir, model, &r.device).map_err(Refusal::Damaged)?;
        checkpoint::check_phi(dir, &model, self.cfg.model.attention.phi).map_err(Refusal::OtherModel)?;
        let optim = checkpoint::load_optimizer::<B, _>(dir, &r.device).map_err(Refusal::Damaged)?;
        r.optim = r.optim.clone().load_record(optim);
        r.decay_ids = weight_decay_ids::<B, _>(&model);
        r.set_model(model);
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

    /// Spreads the run over `devices` (the first is this trainer's own): one replica each, fed
    /// its own rows of every batch. Call it after `new` (and its resume); one device is a no-op.
    pub fn spread(&mut self, devices: &[B::Device], memory_of: MemoryOf<B>) -> Result<(), Stop> {
        if devices.len() > 1 {
            self.group = Some(Group::start(&self.replica, devices, &self.cfg.train, memory_of)?);
        }
        Ok(())
    }

    /// Replicas training together (1 without data parallelism).
    pub fn world(&self) -> usize {
        self.group.as_ref().map_or(1, Group::world)
    }

    /// Queues one optimiser step (all micro-batches, on every replica) and returns its
    /// device-side results.
    fn queue_step(&mut self, with_stats: bool) -> Result<PendingStep<B>, Stop> {
        let t = self.cfg.train.clone();
        let step = self.step + 1;
        let lr = learning_rate(&t, self.step);
        let world = self.world();
        let global: Vec<HostBatch> = (0..t.grad_accumulation)
            .map(|_| host_batch(&self.train, &self.order.take(&mut self.cursor, t.batch_size * world)))
            .collect();
        let plan = StepPlan { lr, with_stats, fault: self.fault.filter(|f| f.step == step) };
        let output = match self.group.as_mut() {
            None => self.replica.queue_step(&t, global, &plan, None)?,
            Some(group) => {
                let mine = group.send_step(step, &global, &plan, with_stats)?;
                let mut reduce = |model: &NsaLm<B>, grads, loss| group.all_reduce_mean::<B>(step, model, grads, loss);
                let output = self.replica.queue_step(&t, mine, &plan, Some(&mut reduce))?;
                group.collect(step)?;
                output
            }
        };
        self.step = step;
        Ok(PendingStep { step, health: output.health, stats: output.stats, lr })
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

    /// Why the device failed at `step` ([`crate::failures::device_failure`]).
    fn device_failure(&self, step: usize, error: impl std::fmt::Debug) -> Stop {
        let last_good = || checkpoint::latest(&self.run_dir).map(|(_, p)| p);
        crate::failures::device_failure(step, self.cfg.train.batch_size, self.train.seq_len(), last_good, error)
    }

    /// Reads `tensor` of `step`; a device error, or a panic (a device failure surfacing on this
    /// thread while the op stream drains), becomes a [`Stop`].
    fn read(&self, step: usize, tensor: &Tensor<B::InnerBackend, 1>) -> Result<TensorData, Stop> {
        match catch(|| tensor.clone().try_into_data()) {
            Ok(Ok(data)) => Ok(data),
            Ok(Err(e)) => Err(self.device_failure(step, e)),
            Err(panic) => Err(self.device_failure(step, panic_message(&panic).unwrap_or_default())),
        }
    }

    /// Queues a step; a panic inside it (a device failure surfacing on this thread) becomes a
    /// [`Stop`].
    pub(crate) fn try_queue_step(&mut self, with_stats: bool) -> Result<PendingStep<B>, Stop> {
        let step = self.step + 1;
        match catch(|| self.queue_step(with_stats)) {
            Ok(Ok(pending)) => Ok(pending),
            // A failed allocation can surface as another error first: a data-parallel peer or
            // the collective that met it stops, and rank 0 hears of that.
            Ok(Err(stop)) if crate::failures::failed_allocation().is_some() => Err(self.device_failure(step, stop)),
            Ok(Err(stop)) => Err(stop),
            Err(panic) => Err(self.device_failure(step, panic_message(&panic).unwrap_or_default())),
        }
    }

    /// Mean loss over the first `valid_batches` batches of the validation split.
    pub fn validate(&self) -> Option<f64> {
        let t = &self.cfg.train;
        let n = self.valid.num_windows();
        if n == 0 || t.valid_batches == 0 {
            return None;
        }
        let model = self.replica.compute_model(self.replica.model.valid());
        let mut total = 0.0;
        let mut count = 0;
        for chunk in (0..n).collect::<Vec<_>>().chunks(t.batch_size).take(t.valid_batches) {
            let (inputs, targets) = batch::<B::InnerBackend>(&self.valid, chunk, &self.replica.device);
            let loss: f64 = lm_loss(model.forward(inputs), targets).into_scalar().elem::<f64>();
            total += loss;
            count += 1;
        }
        Some(total / count as f64)
    }

    /// Writes a checkpoint of the current state now.
    pub fn save_checkpoint(&self) -> Result<PathBuf, Stop> {
        let state = TrainState { step: self.step, cursor: self.cursor, seed: self.cfg.train.seed };
        checkpoint::save::<B, _, _>(
            &self.run_dir,
            &self.replica.model,
            self.replica.optim.to_record(),
            &state,
            self.cfg.train.keep_checkpoints,
        )
        .map_err(Stop::Error)
    }

    /// Trains until `until` optimiser steps are done (or `cfg.train.steps`), reporting logged
    /// steps, validations and checkpoints to `reporter`; stops early, after a checkpoint, when the
    /// reporter asks to.
    pub fn train_until(&mut self, until: usize, reporter: &mut dyn Reporter) -> Result<Finish, Stop> {
        let until = until.min(self.cfg.train.steps);
        let t = self.cfg.train.clone();
        let tokens_per_step = (t.batch_size * self.world() * t.grad_accumulation * self.train.seq_len()) as f64;
        let mut previous: Option<PendingStep<B>> = None;
        let mut clock = Instant::now();
        let mut steps_since_log = 0usize;
        while self.step < until {
            let step = self.step + 1;
            let interrupted = reporter.stop_requested();
            let is_log = step.is_multiple_of(t.log_every) || step == until;
            let is_checkpoint = step.is_multiple_of(t.checkpoint_every) || step == until || interrupted;
            let is_valid = t.valid_every > 0 && step.is_multiple_of(t.valid_every);
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
                )
                .with_peer_memory(self.group.as_ref().map_or(&[], |g| &g.peer_memory[..]));
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

/// Why a checkpoint was not resumed from.
enum Refusal {
    /// It does not verify or load: set aside, and an older one tried.
    Damaged(String),
    /// It loads but holds another model than the config's: the run stops with this line.
    OtherModel(String),
}
