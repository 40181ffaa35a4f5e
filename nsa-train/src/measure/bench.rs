//! `nsa bench-train`: the user's job as a benchmark. Trains a config for some steps exactly as
//! `nsa train` queues them (no sync inside a step; step `k`'s loss is read once step `k + 1` is
//! queued) and reports the wall time between consecutive step completions: the steady tokens/s
//! over every step after the warm-up (stalls included), the median and the worst step, and the
//! allocator's peak reservation. A breakdown of one step (data, forward + backward, optimiser,
//! and inside them attention, MLP, head, matmuls) follows from [`super::profile`].

use std::path::Path;
use std::time::Instant;

use serde::Serialize;

use super::profile::{self, Phase};
use crate::config::RunConfig;
use crate::data::corpus::PackedSplit;
use crate::failures::{gib, Stop};
use crate::metrics::MemoryOf;
use crate::step::{DoneStep, StepPipeline};
use crate::trainer::Trainer;
use crate::TrainBackend;

pub struct TrainBenchOptions {
    /// Untimed steps first (kernel compilation, autotuning, the allocator's first pages).
    pub warmup: usize,
    /// Timed steps.
    pub steps: usize,
    /// Timed runs per phase of the breakdown; 0 skips it.
    pub breakdown_iters: usize,
    /// Compute the gate and selection statistics every step, as a run that logs every step does.
    pub with_stats: bool,
}

/// What `nsa bench-train` measured.
#[derive(Debug, Clone, Serialize)]
pub struct TrainBench {
    /// Data-parallel replicas (one per device).
    pub devices: usize,
    /// Sequences per micro-batch on each device.
    pub batch: usize,
    pub seq_len: usize,
    pub grad_accumulation: usize,
    pub params: usize,
    pub precision: String,
    pub warmup_steps: usize,
    pub timed_steps: usize,
    /// Tokens of all timed steps (every device's) over their summed wall time.
    pub tokens_per_s: f64,
    pub median_step_ms: f64,
    pub worst_step_ms: f64,
    /// Each timed step's wall time, in order.
    pub step_ms: Vec<f64>,
    /// The host's median time to queue a step. It includes the waits CubeCL's server makes for
    /// the device (every 64 uploads), so it nears the step's time whichever side is slower.
    pub median_queue_ms: f64,
    /// Its parts (medians): forward and loss, backward, optimiser.
    pub median_queue_parts_ms: [f64; 3],
    /// Largest allocator reservation seen after any step (GPU backends).
    pub peak_reserved_gib: Option<f64>,
    pub breakdown: Vec<Phase>,
}

/// Runs the benchmark in `scratch` (an empty directory for the trainer's run files).
pub fn bench_train<B: TrainBackend>(
    cfg: &RunConfig,
    train: PackedSplit,
    valid: PackedSplit,
    devices: &[B::Device],
    memory_of: MemoryOf<B>,
    scratch: &Path,
    opts: &TrainBenchOptions,
) -> Result<TrainBench, String> {
    let device = &devices[0];
    let memory = memory_of(device);
    let mut cfg = cfg.clone();
    cfg.train.out = scratch.join("run").display().to_string();
    cfg.train.steps = usize::MAX / 2;
    let t = cfg.train.clone();
    let mut trainer = Trainer::<B>::new(cfg.clone(), train.clone(), valid.clone(), device.clone(), false)?;
    trainer.spread(devices, memory_of).map_err(|e| e.to_string())?;
    let params = burn::module::Module::num_params(&trainer.replica.model);

    eprintln!("{} warm-up steps (the first compile and autotune kernels), then {} timed", opts.warmup, opts.steps);
    let mut peak: Option<u64> = None;
    let mut sample_memory = || {
        if let Some(m) = memory.as_ref().and_then(|probe| probe()) {
            peak = Some(peak.map_or(m.reserved, |p| p.max(m.reserved)));
        }
    };
    // One run of steps, so the timed ones are steady: the first interval holds two steps'
    // queueing and the last none, and both are left out with the warm-up.
    let timed = (opts.warmup + 1)..(opts.warmup + 1 + opts.steps);
    let done = timed_steps(&mut trainer, opts.warmup + opts.steps + 2, opts.with_stats, |i, ms| {
        if timed.contains(&i) {
            sample_memory();
        }
        if i < opts.warmup || (i + 1) % 10 == 0 {
            eprintln!("  step {}: {ms:.0} ms", i + 1);
        }
    });
    let done = done.map_err(|e| e.to_string())?;
    let done = &done[timed];
    let step_ms: Vec<f64> = done.iter().map(|(_, ms)| *ms).collect();
    let parts: Vec<[f64; 3]> = done.iter().map(|(d, _)| d.queue_parts_ms).collect();
    let queue: Vec<f64> = done.iter().map(|(d, _)| d.queue_ms).collect();
    let wall = step_ms.iter().sum::<f64>() / 1e3;
    drop(trainer);

    let tokens = (t.batch_size * devices.len() * t.grad_accumulation * cfg.model.seq_len * step_ms.len()) as f64;
    let breakdown = match opts.breakdown_iters {
        0 => Vec::new(),
        iters => {
            eprintln!("breakdown: each phase of a step timed apart ({iters} runs each)");
            profile::profile::<B>(&cfg, train, valid, device, memory_of, &scratch.join("profile"), 2, iters)?
        }
    };
    Ok(TrainBench {
        devices: devices.len(),
        batch: t.batch_size,
        seq_len: cfg.model.seq_len,
        grad_accumulation: t.grad_accumulation,
        params,
        precision: format!("{:?}", t.precision).to_lowercase(),
        warmup_steps: opts.warmup,
        timed_steps: step_ms.len(),
        tokens_per_s: tokens / wall,
        median_step_ms: median(step_ms.clone()),
        worst_step_ms: step_ms.iter().copied().fold(0.0, f64::max),
        step_ms,
        median_queue_ms: median(queue),
        median_queue_parts_ms: [0, 1, 2].map(|i| median(parts.iter().map(|p| p[i]).collect())),
        peak_reserved_gib: peak.map(gib),
        breakdown,
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// The result as text: the headline, then the breakdown.
pub fn report(r: &TrainBench) -> String {
    let mut s = format!(
        "bench-train: {} params, batch {} x {} (accumulation {}) on each of {} device(s), {}\n",
        r.params, r.batch, r.seq_len, r.grad_accumulation, r.devices, r.precision
    );
    s += &format!(
        "{} steps after {} warm-up: {:.0} tokens/s | median step {:.1} ms | worst {:.1} ms ({:.2}x the median)\n",
        r.timed_steps,
        r.warmup_steps,
        r.tokens_per_s,
        r.median_step_ms,
        r.worst_step_ms,
        r.worst_step_ms / r.median_step_ms.max(1e-9)
    );
    let [forward, backward, optimiser] = r.median_queue_parts_ms;
    s += &format!(
        "host time to queue a step (median): {:.1} ms (forward and loss {forward:.1}, backward {backward:.1}, \
         optimiser {optimiser:.1})\n",
        r.median_queue_ms
    );
    if let Some(peak) = r.peak_reserved_gib {
        s += &format!("peak device memory reserved (first device): {peak:.2} GiB\n");
    }
    if !r.breakdown.is_empty() {
        let dtype = (r.precision == "bf16").then_some(burn::tensor::FloatDType::BF16);
        s += &profile::table(&r.breakdown, dtype);
    }
    s
}

/// Runs `n` optimiser steps through the step pipeline, as `nsa train` runs them, with the
/// statistics every step when `with_stats`; returns each step and the wall time (ms) between its
/// completion and the one before (the first from the call). `each(i, ms)` is told of step `i` as
/// it completes.
fn timed_steps<B: TrainBackend>(
    trainer: &mut Trainer<B>,
    n: usize,
    with_stats: bool,
    mut each: impl FnMut(usize, f64),
) -> Result<Vec<(DoneStep, f64)>, Stop> {
    let mut done = Vec::with_capacity(n);
    let mut last = Instant::now();
    let mut record = |step: DoneStep| {
        let ms = last.elapsed().as_secs_f64() * 1e3;
        last = Instant::now();
        each(done.len(), ms);
        done.push((step, ms));
    };
    let mut pipeline = StepPipeline::default();
    for _ in 0..n {
        if let Some(step) = pipeline.advance(trainer, with_stats)? {
            record(step);
        }
    }
    if let Some(step) = pipeline.drain(trainer)? {
        record(step);
    }
    Ok(done)
}
