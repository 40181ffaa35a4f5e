//! Sampling from a checkpoint: each token recomputes the whole sequence (no KV cache), the same
//! forward as training.

use burn::tensor::{Int, Tensor, TensorData};
use nsa_core::{NsaLm, SparseAttentionBackend};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

pub struct SampleOptions {
    pub tokens: usize,
    pub temperature: f64,
    pub top_k: usize,
    pub seed: u64,
}

/// Continues `prompt` by `opts.tokens` tokens. The context is the last `seq_len` tokens.
pub fn sample<B: SparseAttentionBackend>(
    model: &NsaLm<B>,
    prompt: &[u32],
    opts: &SampleOptions,
    device: &B::Device,
) -> Vec<u32> {
    let mut rng = StdRng::seed_from_u64(opts.seed);
    let mut tokens = prompt.to_vec();
    for _ in 0..opts.tokens {
        let start = tokens.len().saturating_sub(model.seq_len());
        let context: Vec<i64> = tokens[start..].iter().map(|&t| i64::from(t)).collect();
        let t = context.len();
        let input = Tensor::<B, 2, Int>::from_data(TensorData::new(context, [1, t]), device);
        let logits = model.forward(input).narrow(1, t - 1, 1).reshape([-1]);
        let logits: Vec<f64> = logits.into_data().convert::<f64>().to_vec().unwrap();
        tokens.push(pick(&logits, opts, &mut rng));
    }
    tokens[prompt.len()..].to_vec()
}

/// Greedy at temperature 0, else top-k sampling at the temperature.
fn pick(logits: &[f64], opts: &SampleOptions, rng: &mut StdRng) -> u32 {
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|a, b| logits[*b].total_cmp(&logits[*a]));
    if opts.temperature <= 0.0 {
        return order[0] as u32;
    }
    let k = if opts.top_k == 0 { order.len() } else { opts.top_k.min(order.len()) };
    let top = &order[..k];
    let max = logits[top[0]];
    let weights: Vec<f64> = top.iter().map(|&i| ((logits[i] - max) / opts.temperature).exp()).collect();
    let total: f64 = weights.iter().sum();
    let mut draw = rng.random::<f64>() * total;
    for (i, w) in top.iter().zip(&weights) {
        draw -= w;
        if draw <= 0.0 {
            return *i as u32;
        }
    }
    top[k - 1] as u32
}
