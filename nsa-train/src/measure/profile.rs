//! Where a training step's time goes: each phase timed on its own ([`Stopwatch`]).
//!
//! Phases: the whole step as the trainer runs it; data (batch assembly and upload); forward +
//! backward; optimiser (global clip, decay, AdamW); inside forward + backward, the attention
//! layers (and the NSA layer's parts), the MLPs, the output head and loss; and, across all of
//! them, the dense matmuls of the linear layers (projections, MLP, head) alone. What the parts do
//! not explain is reported as a remainder, not hidden. The replica is entered only through its
//! public step functions.

use std::time::Instant;

use burn::tensor::{FloatDType, Int, Tensor};
use nsa_core::model::Attention;
use nsa_core::{lm_loss, NsaLm};
use serde::Serialize;

use super::attention_parts::attention_parts;
use super::matmuls::linear_matmuls_ms;
use super::stopwatch::Stopwatch;
use crate::config::RunConfig;
use crate::data::batch::HostBatch;
use crate::data::corpus::PackedSplit;
use crate::metrics::MemoryOf;
use crate::parallel::{Replica, StepPlan};
use crate::trainer::Trainer;
use crate::TrainBackend;

#[derive(Debug, Clone, Serialize)]
pub struct Phase {
    pub name: String,
    /// Median milliseconds per training step spent in this phase.
    pub ms: f64,
    /// Share of the whole step.
    pub share: f64,
    /// Achieved TFLOP/s, for phases whose FLOPs are known.
    pub tflops: Option<f64>,
    /// Device memory its forward holds for the backward, GiB (whole model, or all layers of a
    /// per-layer part), where the backend reports memory.
    pub held_gib: Option<f64>,
}

impl Phase {
    fn new(name: impl Into<String>, ms: f64, held_gib: Option<f64>) -> Self {
        Self { name: name.into(), ms, share: 0.0, tflops: None, held_gib }
    }
}

/// The sizes a phase's time is scaled by to count per step.
struct Scale {
    /// Micro-batches per step.
    micro: f64,
    layers: usize,
}

impl Scale {
    /// A per-layer time or hold over all layers of the step.
    fn all_layers(&self, ms: f64, held: Option<f64>) -> (f64, Option<f64>) {
        (ms * self.layers as f64 * self.micro, held.map(|g| g * self.layers as f64))
    }
}

/// Profiles `cfg` on `device`. `scratch` is an empty directory for the trainer's run files.
#[allow(clippy::too_many_arguments)]
pub fn profile<B: TrainBackend>(
    cfg: &RunConfig,
    train: PackedSplit,
    valid: PackedSplit,
    device: &B::Device,
    memory_of: MemoryOf<B>,
    scratch: &std::path::Path,
    warmup: usize,
    iters: usize,
) -> Result<Vec<Phase>, String> {
    let mut cfg = cfg.clone();
    cfg.train.out = scratch.display().to_string();
    cfg.train.steps = usize::MAX / 2;
    let windows: Vec<usize> = (0..cfg.train.batch_size).map(|i| i % train.num_windows().max(1)).collect();
    let batch = HostBatch::of_windows(&train, &windows);
    let mut trainer = Trainer::<B>::new(cfg.clone(), train, valid, device.clone(), false)?;
    let sw = Stopwatch::<B> {
        device: device.clone(),
        probe: memory_of(device),
        warmup,
        iters,
        dtype: trainer.replica.compute_dtype,
    };
    let scale = Scale { micro: cfg.train.grad_accumulation as f64, layers: cfg.model.n_layers };

    // The step as the trainer runs it, accumulation included.
    let step = sw.time(|| trainer.step_once());
    let data = sw.time(|| drop(batch.clone().to_device::<B>(device))) * scale.micro;
    let (optimiser, forward_model) = optimiser_ms(&sw, &trainer.replica, &batch, &cfg);
    // Forward + backward as the rest of the step: a loop of forward + backward alone, with no
    // optimiser step between, makes Burn's fusion re-plan its op stream on every run, so it would
    // not measure what a training step spends.
    let forward_backward = step - data - optimiser;
    let on_device = batch.to_device::<B>(device);
    let (inputs, targets, documents) = (on_device.inputs, on_device.targets, on_device.documents);
    let activations =
        sw.held(|| lm_loss(forward_model.forward_with_aux(inputs, documents.as_ref()).0, targets.clone()));
    let mut phases = vec![
        Phase::new("whole step", step, None),
        Phase::new("data (batch assembly + upload)", data, None),
        Phase::new("forward + backward (the step less data and optimiser)", forward_backward, activations),
        Phase::new("optimiser (fused clip + AdamW)", optimiser, None),
    ];
    let model = trainer.replica.compute_model(trainer.replica.model.clone());
    let shape = [cfg.train.batch_size, cfg.model.seq_len, cfg.model.attention.dim];
    let (components, explained) = components(&sw, &model, shape, targets, &scale);
    phases.extend(components);
    phases.push(Phase::new(
        "  rest of forward + backward (embedding, norms, residuals, casts)",
        forward_backward - explained,
        None,
    ));
    let rows = cfg.train.batch_size * cfg.model.seq_len;
    let (ms, flops) = linear_matmuls_ms(&sw, &trainer.replica.model, rows, cfg.model.n_layers);
    phases.push(Phase {
        tflops: Some(flops / (ms * 1e-3) / 1e12),
        ..Phase::new("linear-layer matmuls alone (within the above)", ms * scale.micro, None)
    });
    for p in &mut phases {
        p.share = p.ms / step;
    }
    Ok(phases)
}

/// The optimiser's fused step (clip, decay, AdamW and the compute copy) on fresh gradients each
/// run, made untimed, on a copy of `replica`; and the model a forward then runs.
fn optimiser_ms<B: TrainBackend>(
    sw: &Stopwatch<B>,
    replica: &Replica<B>,
    batch: &HostBatch,
    cfg: &RunConfig,
) -> (f64, NsaLm<B>) {
    let mut copy = replica.fork(&replica.device, 0);
    let plan = StepPlan { lr: 1e-6, with_stats: false, fault: None };
    let ms = sw.median_of(|| {
        let gradients = copy.forward_backward(vec![batch.clone()], &plan);
        sw.sync();
        let start = Instant::now();
        let _ = copy.apply(&cfg.train, plan.lr, gradients);
        sw.sync();
        start.elapsed().as_secs_f64() * 1e3
    });
    (ms, copy.training_model())
}

/// Inside forward + backward: the first block's attention (and the NSA layer's parts) and MLP
/// over all layers, and the output head with the loss, on random activations of the real shape;
/// and the ms per step that attention, MLP and head explain together.
fn components<B: TrainBackend>(
    sw: &Stopwatch<B>,
    model: &NsaLm<B>,
    shape: [usize; 3],
    targets: Tensor<B, 2, Int>,
    scale: &Scale,
) -> (Vec<Phase>, f64) {
    let block = &model.blocks[0];
    let x = || sw.random(shape, 1.0);
    let layers = scale.layers;
    let mut phases = Vec::new();
    let ms = sw.time_with(x, |x| {
        let _ = block.attention.forward(x).sum().backward();
    });
    let (attention, held) = scale.all_layers(ms, sw.held(|| block.attention.forward(x())));
    phases.push(Phase::new(format!("  attention ({layers} layers)"), attention, held));
    if let Attention::Nsa(nsa) = &block.attention {
        for (name, ms, held) in attention_parts(sw, nsa, shape) {
            let (ms, held) = scale.all_layers(ms, held);
            phases.push(Phase::new(format!("    {name}"), ms, held));
        }
    }
    let ms = sw.time_with(x, |x| {
        let _ = block.mlp.forward(x).sum().backward();
    });
    let (mlp, held) = scale.all_layers(ms, sw.held(|| block.mlp.forward(x())));
    phases.push(Phase::new(format!("  MLP ({layers} layers)"), mlp, held));
    let head = sw.time_with(x, |x| {
        let logits = nsa_core::attention::projection::apply(&model.lm_head, model.norm.forward(x));
        let _ = lm_loss(logits, targets.clone()).backward();
    }) * scale.micro;
    phases.push(Phase::new("  output head + loss", head, None));
    (phases, attention + mlp + head)
}

/// The profile as a table.
pub fn table(phases: &[Phase], dtype: Option<FloatDType>) -> String {
    let mut s = format!("compute dtype: {}\n", dtype.map_or("f32".to_string(), |d| format!("{d:?}").to_lowercase()));
    s += &format!("{:<70} {:>10} {:>7} {:>9} {:>9}\n", "phase", "ms/step", "share", "TFLOP/s", "held GiB");
    for p in phases {
        let tflops = p.tflops.map_or(String::new(), |t| format!("{t:.3}"));
        let held = p.held_gib.map_or(String::new(), |g| format!("{g:.2}"));
        s += &format!("{:<70} {:>10.2} {:>6.1}% {:>9} {:>9}\n", p.name, p.ms, 100.0 * p.share, tflops, held);
    }
    s += "held GiB: device memory a forward keeps for its backward (per-layer parts times the layers)\n";
    // Components are timed apart from the step; where they overshoot it, say so rather than let
    // a negative remainder pass for a measurement.
    if phases.iter().any(|p| p.share < -0.1 || p.share > 1.1) {
        s += "note: phases timed apart do not add up to the whole step here (on fusion backends they fuse\n\
               differently); trust the whole-step, data and optimiser rows, and see docs/training.md\n";
    }
    s
}
