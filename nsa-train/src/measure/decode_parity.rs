//! `nsa bench-decode --parity`: decoding with the cache against the training forward in the
//! backend's own dtype (bf16 on an H100), where the CPU tests hold it in float64 and WGPU in f32.
//! A prompt is prefilled, then decoded one token per step; one forward over the whole sequence
//! gives what every step should have produced.

use burn::tensor::{FloatDType, Int, Tensor, TensorData};
use nsa_core::{cast_params, DecodeAttentionBackend, NsaLm, NsaLmConfig};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use super::rel_err;
use crate::generate::to_host;

/// How far decoding strays from the forward.
#[derive(Clone, Debug, Serialize)]
pub struct DecodeParity {
    pub context: usize,
    pub steps: usize,
    /// Over the decode steps: the largest logit error relative to the forward's largest logit.
    pub max_rel_err: f64,
    /// The share of (step, layer, KV head) block lists that equal the forward's.
    pub blocks_equal: f64,
    /// With a 16-bit dtype, the yardstick for `max_rel_err`: over the same positions, the
    /// largest error of that dtype's forward against the f32 forward of the same weights (the
    /// rounding both paths carry; a flipped block near a tie moves a logit by more than it).
    pub forward_rel_err: Option<f64>,
    /// With a 16-bit dtype: decoding's largest error against the f32 forward.
    pub decode_vs_f32_rel_err: Option<f64>,
}

/// Prefills `context` random tokens, decodes `steps` more, and compares each step with one
/// forward over all `context + steps`, on a model of `model`'s shape with random weights of
/// standard deviation `sqrt(3 / dim)`: wide enough that attention is not uniform (at the
/// initial 0.02 every block scores alike and the block selection is decided by rounding).
pub fn decode_parity<B: DecodeAttentionBackend>(
    model: &NsaLmConfig,
    dtype: Option<FloatDType>,
    context: usize,
    steps: usize,
    device: &B::Device,
) -> DecodeParity {
    let len = context + steps;
    let init_std = (3.0 / model.attention.dim as f64).sqrt();
    let model: NsaLm<B> = NsaLmConfig { seq_len: len, init_std, ..model.clone() }.init(device);
    let vocab = model.lm_head.weight.val().dims()[1] as i64;
    let mut rng = StdRng::seed_from_u64(0);
    let tokens: Vec<i64> = (0..len).map(|_| rng.random_range(0..vocab)).collect();
    let row = |t: &[i64]| Tensor::<B, 2, Int>::from_data(TensorData::new(t.to_vec(), [1, t.len()]), device);
    let logits_of = |logits: Tensor<B, 3>| to_host(logits.reshape([len as i32, -1])).expect("logits are floats");

    let exact = dtype.map(|_| logits_of(model.forward(row(&tokens))));
    let model = match dtype {
        Some(dtype) => cast_params(model, dtype),
        None => model,
    };
    let (logits, aux) = model.forward_with_aux(row(&tokens), None);
    let want = logits_of(logits);
    let want_blocks: Vec<Vec<i64>> = aux.into_iter().map(|a| ints(a.blocks)).collect();
    let per_position = want.len() / len;
    let at = |all: &[f64], position: usize| all[position * per_position..(position + 1) * per_position].to_vec();

    let (_, mut cache) = model.prefill(row(&tokens[..context]), 0, model.decode_cache(1, len, device));
    let (mut worst, mut equal, mut lists) = (0.0f64, 0usize, 0usize);
    let (mut forward_worst, mut decode_worst) = (0.0f64, 0.0f64);
    for (step, &token) in tokens[context..].iter().enumerate() {
        let position = context + step;
        let (out, next) = model.decode(row(&[token]), cache);
        cache = next;
        let got = to_host(out.logits).expect("logits are floats");
        let want = at(&want, position);
        worst = worst.max(rel_err(&got, &want));
        if let Some(exact) = &exact {
            let exact = at(exact, position);
            forward_worst = forward_worst.max(rel_err(&want, &exact));
            decode_worst = decode_worst.max(rel_err(&got, &exact));
        }
        for (blocks, want) in out.blocks.into_iter().zip(&want_blocks) {
            let n = blocks.dims()[3];
            let got = ints(blocks);
            let want = &want[position * got.len()..(position + 1) * got.len()];
            for (list, want) in got.chunks(n).zip(want.chunks(n)) {
                lists += 1;
                equal += usize::from(list == want);
            }
        }
    }
    DecodeParity {
        context,
        steps,
        max_rel_err: worst,
        blocks_equal: equal as f64 / lists.max(1) as f64,
        forward_rel_err: exact.is_some().then_some(forward_worst),
        decode_vs_f32_rel_err: exact.is_some().then_some(decode_worst),
    }
}

fn ints<B: DecodeAttentionBackend>(x: Tensor<B, 4, Int>) -> Vec<i64> {
    x.into_data().convert::<i64>().to_vec().expect("block lists are integers")
}
