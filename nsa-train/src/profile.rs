//! Where a training step's time goes: each phase timed on its own, synchronised, median of
//! several runs after a warm-up (which also absorbs kernel compilation and autotuning).
//!
//! Phases: the whole step as the trainer runs it; data (batch assembly and upload); forward +
//! backward; optimiser (global clip, decay, AdamW); inside forward + backward, the attention
//! layers, the MLPs, the output head and loss; and, across all of them, the dense matmuls of the
//! linear layers (projections, MLP, head) alone. What the parts do not explain is reported as a
//! remainder, not hidden.

use std::time::Instant;

use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, FloatDType, Tensor};
use nsa_core::attention::NsaAttention;
use nsa_core::model::Attention;
use nsa_core::{cast_params, NsaLm};
use serde::Serialize;

use crate::config::RunConfig;
use crate::data::corpus::PackedSplit;
use crate::metrics::MemoryProbe;
use crate::optim::{compute_copy, StepSettings};
use crate::parallel::MemoryOf;
use crate::trainer::{batch, lm_loss, Trainer};

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

/// Device memory in use (bytes) after a sync, where the backend reports it.
fn in_use<B: Backend>(device: &B::Device, probe: &Option<MemoryProbe>) -> Option<u64> {
    B::sync(device).expect("device sync");
    probe.as_ref().and_then(|p| p()).map(|m| m.in_use)
}

/// GiB that `make`'s result holds on the device while it lives.
fn held<B: Backend, T>(device: &B::Device, probe: &Option<MemoryProbe>, make: impl FnOnce() -> T) -> Option<f64> {
    let before = in_use::<B>(device, probe)?;
    let kept = make();
    let after = in_use::<B>(device, probe)?;
    drop(kept);
    Some((after as f64 - before as f64) / crate::failures::GIB)
}

/// Median wall time in ms of `f`, each run followed by a device sync.
fn time<B: Backend>(device: &B::Device, warmup: usize, iters: usize, mut f: impl FnMut()) -> f64 {
    time_with::<B, ()>(device, warmup, iters, || (), |()| f())
}

/// Median time of `f` on a fresh input from `prepare` each run; making the input is not timed
/// (random tensors are slow to draw on the CPU backend and would otherwise dominate a phase).
fn time_with<B: Backend, I>(
    device: &B::Device,
    warmup: usize,
    iters: usize,
    mut prepare: impl FnMut() -> I,
    mut f: impl FnMut(I),
) -> f64 {
    let mut run = || {
        let input = prepare();
        B::sync(device).expect("device sync");
        let start = Instant::now();
        f(input);
        B::sync(device).expect("device sync");
        start.elapsed().as_secs_f64() * 1e3
    };
    for _ in 0..warmup {
        run();
    }
    let mut samples: Vec<f64> = (0..iters).map(|_| run()).collect();
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

/// Shapes `[in, out]` of the linear layers' weights (a `Linear`'s `weight` field).
struct LinearShapes(Vec<[usize; 2]>, Vec<String>);

impl<B: Backend> ModuleVisitor<B> for LinearShapes {
    fn enter_module(&mut self, _: &str, container: &str) {
        self.1.push(container.to_string());
    }
    fn exit_module(&mut self, _: &str, _: &str) {
        self.1.pop();
    }
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        // Burn's derive enters each field with its struct's name as the container: a Linear's
        // `weight` is visited with `Struct:Linear` on top of the stack (its bias is 1-D).
        let in_linear = self.1.last().is_some_and(|c| c == "Struct:Linear");
        if D == 2 && in_linear {
            let dims = param.val().dims();
            self.0.push([dims[0], dims[1]]);
        }
    }
}

fn linear_shapes<B: Backend, M: Module<B>>(module: &M) -> Vec<[usize; 2]> {
    let mut visitor = LinearShapes(Vec::new(), Vec::new());
    module.visit(&mut visitor);
    visitor.0
}

/// The NSA layer's parts, forward + backward each (the selection has no backward), on
/// random inputs of the real shape: milliseconds per layer.
fn attention_parts<B: crate::TrainBackend>(
    nsa: &NsaAttention<B>,
    x: impl Fn() -> Tensor<B, 3>,
    device: &B::Device,
    probe: &Option<MemoryProbe>,
    warmup: usize,
    iters: usize,
) -> Vec<(&'static str, f64, Option<f64>)> {
    let c = &nsa.config;
    let [b, t, _] = x().dims();
    let dtype = x().dtype();
    let heads = |d: usize| {
        Tensor::<B, 4>::random([b, t, c.n_heads, d], Distribution::Normal(0.0, 1.0), device).cast(dtype).require_grad()
    };
    let q = || heads(c.d_k);
    let mut parts = Vec::new();
    parts.push((
        "queries (W_q, RoPE)",
        time_with::<B, _>(device, warmup, iters, &x, |x| {
            let _ = nsa.queries(x).sum().backward();
        }),
        held::<B, _>(device, probe, || nsa.queries(x())),
    ));
    parts.push((
        "compressed branch (K/V, phi, attention)",
        time_with::<B, _>(
            device,
            warmup,
            iters,
            || (q(), x()),
            |(q, x)| {
                let _ = nsa.compressed_branch(q, x).0.sum().backward();
            },
        ),
        held::<B, _>(device, probe, || nsa.compressed_branch(q(), x())),
    ));
    let q_fixed = q().detach();
    let (_, p_cmp) = nsa.compressed_branch(q_fixed.clone(), x().detach());
    parts.push((
        "selection (scores, top-n, lists; forward only)",
        time_with::<B, _>(
            device,
            warmup,
            iters,
            || (p_cmp.clone(), x()),
            |(p, x)| {
                let _ = nsa.select(q_fixed.clone(), p, &x).sum();
            },
        ),
        None,
    ));
    let selected = nsa.select(q_fixed, p_cmp, &x());
    parts.push((
        "selected branch (K/V, kernels)",
        time_with::<B, _>(
            device,
            warmup,
            iters,
            || (q(), x()),
            |(q, x)| {
                let _ = nsa.selected_branch(q, x, selected.clone()).sum().backward();
            },
        ),
        held::<B, _>(device, probe, || nsa.selected_branch(q(), x(), selected.clone())),
    ));
    parts.push((
        "window branch (K/V, kernels)",
        time_with::<B, _>(
            device,
            warmup,
            iters,
            || (q(), x()),
            |(q, x)| {
                let _ = nsa.window_branch(q, x).sum().backward();
            },
        ),
        held::<B, _>(device, probe, || nsa.window_branch(q(), x())),
    ));
    parts.push((
        "gates, mix, W_o",
        time_with::<B, _>(
            device,
            warmup,
            iters,
            || (x(), [0; 3].map(|_| heads(c.d_v))),
            |(x, o)| {
                let _ = nsa.mix(x, o).0.sum().backward();
            },
        ),
        held::<B, _>(device, probe, || nsa.mix(x(), [0; 3].map(|_| heads(c.d_v)))),
    ));
    parts
}

/// Profiles `cfg` on `device`. `scratch` is an empty directory for the trainer's run files.
#[allow(clippy::too_many_arguments)]
pub fn profile<B: crate::TrainBackend>(
    cfg: &RunConfig,
    train: PackedSplit,
    valid: PackedSplit,
    device: &B::Device,
    memory_of: MemoryOf<B>,
    scratch: &std::path::Path,
    warmup: usize,
    iters: usize,
) -> Result<Vec<Phase>, String> {
    let probe = memory_of(device);
    let mut cfg = cfg.clone();
    cfg.train.out = scratch.display().to_string();
    cfg.train.steps = usize::MAX / 2;
    let t = cfg.train.clone();
    let (b, seq) = (t.batch_size, cfg.model.seq_len);
    let dim = cfg.model.attention.dim;
    let layers = cfg.model.n_layers;
    let windows: Vec<usize> = (0..b).map(|i| i % train.num_windows().max(1)).collect();
    let data = train.clone();

    let mut trainer = Trainer::<B>::new(cfg.clone(), train, valid, device.clone(), false)?;
    let compute = trainer.replica.compute_dtype;
    let cast = |m: NsaLm<B>| match compute {
        Some(d) => cast_params(m, d),
        None => m,
    };
    let mut phases: Vec<(String, f64, Option<f64>, Option<f64>)> = Vec::new();

    // The step as the trainer runs it, accumulation included.
    let step = time::<B>(device, warmup, iters, || trainer.step_once());
    let micro = t.grad_accumulation as f64;

    let data_ms = time::<B>(device, warmup, iters, || {
        let _ = batch::<B>(&data, &windows, device);
    }) * micro;
    phases.push(("data (batch assembly + upload)".into(), data_ms, None, None));

    let model = trainer.replica.model.clone();
    let (inputs, targets) = batch::<B>(&data, &windows, device);

    // Optimiser: the trainer's fused step (clip, decay, AdamW and the compute copy) on fresh
    // gradients each time (the gradients are made untimed).
    let mut optim = trainer.replica.optim.clone();
    let decay_ids = trainer.replica.decay_ids.clone();
    let dtype = trainer.replica.compute_dtype;
    let settings = StepSettings { lr: 1e-6, weight_decay: t.weight_decay, max_norm: t.grad_clip };
    let mut opt_model = model.clone();
    let mut copy = dtype.map(|d| compute_copy(opt_model.clone(), d));
    let mut samples = Vec::new();
    for i in 0..warmup + iters {
        let forward_model = copy.clone().unwrap_or_else(|| opt_model.clone());
        let loss = lm_loss(forward_model.forward(inputs.clone()), targets.clone());
        let grads = GradientsParams::from_grads(loss.backward(), &opt_model);
        B::sync(device).map_err(|e| format!("{e:?}"))?;
        let start = Instant::now();
        let stepped = optim.step(opt_model, copy.zip(dtype), grads, settings, &decay_ids, device);
        (opt_model, copy) = (stepped.model, stepped.compute);
        B::sync(device).map_err(|e| format!("{e:?}"))?;
        if i >= warmup {
            samples.push(start.elapsed().as_secs_f64() * 1e3);
        }
    }
    samples.sort_by(f64::total_cmp);
    let opt_ms = samples[samples.len() / 2];
    phases.push(("optimiser (fused clip + AdamW)".into(), opt_ms, None, None));
    // Forward + backward as the rest of the step: a loop of forward + backward alone, with no
    // optimiser step between, makes Burn's fusion re-plan its op stream on every run, so it would
    // not measure what a training step spends.
    let fb = step - data_ms - opt_ms;
    let forward_model = copy.clone().unwrap_or_else(|| opt_model.clone());
    let activations = held::<B, _>(device, &probe, || lm_loss(forward_model.forward(inputs.clone()), targets.clone()));
    phases.insert(1, ("forward + backward (the step less data and optimiser)".into(), fb, None, activations));

    // Inside forward + backward, per component, on random activations of the real shape.
    let block = {
        let mut cast_model = cast(model.clone());
        cast_model.blocks.swap_remove(0)
    };
    let x = || {
        let x = Tensor::<B, 3>::random([b, seq, dim], Distribution::Normal(0.0, 1.0), device);
        match compute {
            Some(d) => x.cast(d),
            None => x,
        }
        .require_grad()
    };
    let attn = time_with::<B, _>(device, warmup, iters, x, |x| {
        let _ = block.attention.forward(x).sum().backward();
    }) * layers as f64
        * micro;
    let all_layers = |gib: Option<f64>| gib.map(|g| g * layers as f64);
    let attn_held = all_layers(held::<B, _>(device, &probe, || block.attention.forward(x())));
    phases.push((format!("  attention ({layers} layers)"), attn, None, attn_held));
    if let Attention::Nsa(nsa) = &block.attention {
        let scale = layers as f64 * micro;
        for (name, ms, gib) in attention_parts(nsa, x, device, &probe, warmup, iters) {
            phases.push((format!("    {name}"), ms * scale, None, all_layers(gib)));
        }
    }
    let mlp = time_with::<B, _>(device, warmup, iters, x, |x| {
        let _ = block.mlp.forward(x).sum().backward();
    }) * layers as f64
        * micro;
    let mlp_held = all_layers(held::<B, _>(device, &probe, || block.mlp.forward(x())));
    phases.push((format!("  MLP ({layers} layers)"), mlp, None, mlp_held));
    let head_model = cast(model.clone());
    let head = time_with::<B, _>(device, warmup, iters, x, |x| {
        let logits = nsa_core::attention::projection::apply(&head_model.lm_head, head_model.norm.forward(x));
        let _ = lm_loss(logits, targets.clone()).backward();
    }) * micro;
    phases.push(("  output head + loss".into(), head, None, None));
    phases.push((
        "  rest of forward + backward (embedding, norms, residuals, casts)".into(),
        fb - attn - mlp - head,
        None,
        None,
    ));

    // The linear layers' matmuls alone (forward, and backward's two), all layers and the head.
    let mut shapes: Vec<[usize; 2]> =
        linear_shapes::<B, _>(&model.blocks[0]).into_iter().flat_map(|s| vec![s; layers]).collect();
    shapes.extend(linear_shapes::<B, _>(&model.lm_head));
    let rows = b * seq;
    let mut matmul_ms = 0.0;
    let mut matmul_flops = 0.0;
    let mut unique: Vec<([usize; 2], usize)> = Vec::new();
    for s in shapes {
        match unique.iter_mut().find(|(u, _)| *u == s) {
            Some((_, n)) => *n += 1,
            None => unique.push((s, 1)),
        }
    }
    for ([d_in, d_out], count) in unique {
        let w = {
            let w = Tensor::<B, 2>::random([d_in, d_out], Distribution::Normal(0.0, 0.02), device);
            match compute {
                Some(d) => w.cast(d),
                None => w,
            }
            .require_grad()
        };
        let activations = || {
            let a = Tensor::<B, 2>::random([rows, d_in], Distribution::Normal(0.0, 1.0), device);
            match compute {
                Some(d) => a.cast(d),
                None => a,
            }
            .require_grad()
        };
        let ms = time_with::<B, _>(device, warmup, iters, activations, |a| {
            let _ = nsa_kernels::linear_matmul(a, w.clone()).sum().backward();
        });
        matmul_ms += ms * count as f64 * micro;
        matmul_flops += 6.0 * (rows * d_in * d_out) as f64 * count as f64 * micro;
    }
    phases.push((
        "linear-layer matmuls alone (within the above)".into(),
        matmul_ms,
        Some(matmul_flops / (matmul_ms * 1e-3) / 1e12),
        None,
    ));

    let mut out = vec![Phase { name: "whole step".into(), ms: step, share: 1.0, tflops: None, held_gib: None }];
    out.extend(phases.into_iter().map(|(name, ms, tflops, held_gib)| Phase {
        name,
        ms,
        share: ms / step,
        tflops,
        held_gib,
    }));
    Ok(out)
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
