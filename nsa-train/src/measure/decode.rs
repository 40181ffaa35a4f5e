//! `nsa bench-decode`: generation with the decode cache as a benchmark. Per context length and
//! batch: the prefill of a random prompt per sequence (timed apart), then decode steps of one
//! token per sequence, each ending with its logits on the host as a sampler reads them.

use std::time::Instant;

use burn::tensor::{FloatDType, Int, Tensor, TensorData};
use nsa_core::{cast_params, DecodeAttentionBackend, NsaLm, NsaLmConfig};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use super::cpu_profile::{CpuProfile, CpuProfiler};
use crate::generate::{pick, to_host, SampleOptions};
use crate::metrics::MemoryProbe;

pub struct DecodeBenchOptions {
    pub contexts: Vec<usize>,
    pub batches: Vec<usize>,
    /// Timed decode steps, after `warmup` untimed ones.
    pub tokens: usize,
    pub warmup: usize,
    /// The weights' dtype (`None`: the backend's default float).
    pub dtype: Option<FloatDType>,
    /// Sample the host's threads over the timed steps ([`CpuProfiler`]).
    pub cpu_profile: bool,
}

/// One configuration's figures.
#[derive(Clone, Debug, Serialize)]
pub struct DecodeBenchResult {
    pub context: usize,
    pub batch: usize,
    /// All sequences' prefills, first token's logits included.
    pub prefill_s: f64,
    /// The median step: one token for every sequence.
    pub token_ms: f64,
    /// The median time the host takes to queue a step's ops (the step's call returning, before
    /// the logits are read): a step near it is bound by the host, not the device.
    pub queue_ms: f64,
    /// Tokens of all sequences per second over the timed steps.
    pub tokens_per_s: f64,
    /// Device memory reserved after the run, where the backend reports it.
    pub reserved_gib: Option<f64>,
}

/// Runs every (context, batch) of `opts` on a model of `model`'s shape with random weights
/// (timings do not depend on the values), its positions long enough for the longest run; with
/// the host's profile over all timed steps when `opts` asks for it.
pub fn bench_decode<B: DecodeAttentionBackend>(
    model: &NsaLmConfig,
    opts: &DecodeBenchOptions,
    device: &B::Device,
    memory: Option<MemoryProbe>,
) -> (Vec<DecodeBenchResult>, Option<CpuProfile>) {
    let longest = opts.contexts.iter().max().copied().unwrap_or(1) + opts.warmup + opts.tokens;
    let cfg = NsaLmConfig { seq_len: longest, ..model.clone() };
    let model: NsaLm<B> = cfg.init(device);
    let model = match opts.dtype {
        Some(dtype) => cast_params(model, dtype),
        None => model,
    };
    let mut rng = StdRng::seed_from_u64(0);
    let (mut results, mut profile) = (Vec::new(), None::<CpuProfile>);
    for &context in &opts.contexts {
        for &batch in &opts.batches {
            let (mut result, sampled) = run_one(&model, context, batch, opts, &mut rng, device);
            profile = match (profile, sampled) {
                (Some(all), Some(this)) => Some(all.merged(this)),
                (all, this) => all.or(this),
            };
            result.reserved_gib = memory.as_ref().and_then(|probe| probe()).map(|m| m.reserved as f64 / 2f64.powi(30));
            eprintln!(
                "context {context:>6} batch {batch:>3}: prefill {:.2} s, {:.2} ms a token ({:.2} to queue it), {:.0} tokens/s",
                result.prefill_s, result.token_ms, result.queue_ms, result.tokens_per_s
            );
            results.push(result);
        }
    }
    (results, profile)
}

fn run_one<B: DecodeAttentionBackend>(
    model: &NsaLm<B>,
    context: usize,
    batch: usize,
    opts: &DecodeBenchOptions,
    rng: &mut StdRng,
    device: &B::Device,
) -> (DecodeBenchResult, Option<CpuProfile>) {
    let vocab = model.lm_head.weight.val().dims()[1] as i64;
    let start = Instant::now();
    let mut cache = model.decode_cache(batch, context + opts.warmup + opts.tokens, device);
    let mut next = Vec::with_capacity(batch);
    for row in 0..batch {
        let prompt: Vec<i64> = (0..context).map(|_| rng.random_range(0..vocab)).collect();
        let input = Tensor::<B, 2, Int>::from_data(TensorData::new(prompt, [1, context]), device);
        let (logits, filled) = model.prefill(input, row, cache);
        cache = filled;
        next.push(greedy(&to_host(logits).expect("logits are floats")));
    }
    let prefill_s = start.elapsed().as_secs_f64();
    let mut steps = Vec::with_capacity(opts.tokens);
    let mut queued = Vec::with_capacity(opts.tokens);
    let mut profiler = None;
    for step in 0..opts.warmup + opts.tokens {
        if step == opts.warmup && opts.cpu_profile {
            profiler = CpuProfiler::start().map_err(|e| eprintln!("bench-decode: {e}")).ok();
        }
        let start = Instant::now();
        let input = Tensor::<B, 2, Int>::from_data(TensorData::new(next.clone(), [batch, 1]), device);
        let (out, filled) = model.decode(input, cache);
        if step >= opts.warmup {
            queued.push(start.elapsed().as_secs_f64());
        }
        cache = filled;
        let logits = to_host(out.logits).expect("logits are floats");
        let row = logits.len() / batch;
        next = logits.chunks(row).map(greedy).collect();
        if step >= opts.warmup {
            steps.push(start.elapsed().as_secs_f64());
        }
    }
    let profile = profiler.map(CpuProfiler::stop);
    let mean = steps.iter().sum::<f64>() / steps.len().max(1) as f64;
    let result = DecodeBenchResult {
        context,
        batch,
        prefill_s,
        token_ms: median_ms(steps),
        queue_ms: median_ms(queued),
        tokens_per_s: if mean > 0.0 { batch as f64 / mean } else { 0.0 },
        reserved_gib: None,
    };
    (result, profile)
}

fn median_ms(mut seconds: Vec<f64>) -> f64 {
    seconds.sort_by(f64::total_cmp);
    seconds.get(seconds.len() / 2).copied().unwrap_or(0.0) * 1e3
}

/// The likeliest token: what a greedy sampler draws.
fn greedy(logits: &[f64]) -> i64 {
    let greedy = SampleOptions { max_tokens: 0, temperature: 0.0, top_k: 0, top_p: 1.0, seed: 0 };
    i64::from(pick(logits, &greedy, &mut StdRng::seed_from_u64(0)))
}

/// The results as a table.
pub fn report(results: &[DecodeBenchResult]) -> String {
    let mut out = String::from("context  batch  prefill s  ms/token  queued ms  tokens/s\n");
    for r in results {
        out += &format!(
            "{:>7}  {:>5}  {:>9.2}  {:>8.2}  {:>9.2}  {:>8.0}\n",
            r.context, r.batch, r.prefill_s, r.token_ms, r.queue_ms, r.tokens_per_s
        );
    }
    out
}
