//! The training run: micro-batches drawn in a seeded order, the step pipeline, metrics,
//! validation, checkpoints, and a stop on the first non-finite loss or gradient. The step itself
//! is the replicas' ([`crate::parallel`]); how steps are queued and read is [`crate::step`]'s.
//!
//! Host reads: none inside a step. Step `k - 1` is read once step `k` is queued; log, validation
//! and checkpoint steps read their own values, and a checkpoint is only written after its step
//! was read finite.

mod init;
mod queue;
mod resume;

use std::path::{Path, PathBuf};
use std::time::Instant;

use burn::module::AutodiffModule;
use burn::tensor::{ElementConversion, FloatDType};

use crate::checkpoint::{self, TrainState};
use crate::config::{Precision, RunConfig};
use crate::dashboard::Reporter;
use crate::data::batch::batch;
use crate::data::corpus::{BatchOrder, DataCursor, PackedSplit};
pub use crate::failures::{Finish, Stop};
use crate::metrics::{MemoryOf, MemoryProbe, MetricsLog, StepMetrics};
use crate::optim::FusedAdamW;
use crate::parallel::{Fault, Group, Replica};
use crate::step::{DoneStep, StepPipeline};
use crate::TrainBackend;

pub use nsa_core::lm_loss;

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
    /// The checkpoint whose weights this run started from (`train.init`).
    pub initialised_from: Option<PathBuf>,
    /// Newer checkpoints that a resume found damaged and moved aside, one line each.
    pub set_aside: Vec<String>,
    /// Test hook: a failure to inject at one step.
    pub fault: Option<Fault>,
    /// Device memory, reported with each logged step where the backend has it.
    pub memory: Option<MemoryProbe>,
}

impl<B: TrainBackend> Trainer<B> {
    /// A fresh run (from `cfg.train.init`'s weights where it names a checkpoint), or, with
    /// `resume`, the newest checkpoint of `cfg.train.out`.
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
        // Seeded init: the same seed gives the same initial weights (Burn's RNG is per process,
        // so concurrent inits in one process can still interleave).
        B::seed(&device, t.seed);
        let model = cfg.model.init::<B>(&device);
        let (model, initialised_from) = match (t.init.as_str(), resume) {
            ("", _) | (_, true) => (model, None),
            (path, false) => {
                let (model, dir) = init::weights_from(Path::new(path), model, &cfg, &device)?;
                (model, Some(dir))
            }
        };
        let compute_dtype = match t.precision {
            Precision::F32 => None,
            Precision::Bf16 => Some(FloatDType::BF16),
        };
        let optim = FusedAdamW::new(t.beta1 as f32, t.beta2 as f32, t.epsilon as f32);
        let replica = Replica::new(model.clone(), device, optim, compute_dtype);
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
            initialised_from,
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
            let batch = batch::<B::InnerBackend>(&self.valid, chunk, &self.replica.device);
            let logits = model.forward_with_aux(batch.inputs, batch.documents.as_ref()).0;
            let loss: f64 = lm_loss(logits, batch.targets).into_scalar().elem::<f64>();
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
            self.replica.optimiser_record(),
            &state,
            self.cfg.train.keep_checkpoints,
        )
        .map_err(Stop::Error)
    }

    /// Queues one optimiser step and drops its results (for profiling: no checks, no metrics).
    pub fn step_once(&mut self) {
        let _ = crate::step::StepQueue::queue(self, false);
    }

    /// Trains until `until` optimiser steps are done (or `cfg.train.steps`), reporting logged
    /// steps, validations and checkpoints to `reporter`; stops early, after a checkpoint, when the
    /// reporter asks to.
    pub fn train_until(&mut self, until: usize, reporter: &mut dyn Reporter) -> Result<Finish, Stop> {
        let until = until.min(self.cfg.train.steps);
        let t = self.cfg.train.clone();
        let mut pipeline = StepPipeline::default();
        let mut since_log = (Instant::now(), 0usize);
        while self.step < until {
            let step = self.step + 1;
            let interrupted = reporter.stop_requested();
            let is_log = step.is_multiple_of(t.log_every) || step == until;
            let is_checkpoint = step.is_multiple_of(t.checkpoint_every) || step == until || interrupted;
            let is_valid = t.valid_every > 0 && step.is_multiple_of(t.valid_every);
            pipeline.advance(self, is_log)?;
            since_log.1 += 1;
            if !(is_log || is_checkpoint || is_valid) {
                continue;
            }
            let done = pipeline.drain(self)?.expect("the step just queued");
            if is_log {
                self.log(&done, since_log, reporter)?;
                since_log = (Instant::now(), 0);
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
        pipeline.drain(self)?;
        Ok(Finish::Completed)
    }

    /// Writes and reports a logged step; `since_log` is when the last log was and how many
    /// steps have run since.
    fn log(&mut self, done: &DoneStep, since_log: (Instant, usize), reporter: &mut dyn Reporter) -> Result<(), Stop> {
        let t = &self.cfg.train;
        let tokens_per_step = (t.batch_size * self.world() * t.grad_accumulation * self.train.seq_len()) as f64;
        let tokens_per_s = tokens_per_step * since_log.1 as f64 / since_log.0.elapsed().as_secs_f64();
        let memory = self.memory.as_ref().and_then(|probe| probe());
        let metrics = StepMetrics::new(
            done.step,
            done.loss,
            done.grad_norm,
            done.lr,
            tokens_per_s,
            done.stats.clone(),
            memory,
            &self.cfg.model,
        )
        .with_peer_memory(self.group.as_ref().map_or(&[], |g| &g.peer_memory[..]));
        self.metrics.write(&metrics).map_err(Stop::Error)?;
        reporter.step(&metrics);
        Ok(())
    }
}
