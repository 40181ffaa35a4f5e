//! Sampling from a model with the decode cache: each prompt is prefilled once (the training
//! forward), then every new token is one decode step that reads the cache instead of the whole
//! context (`nsa_core::decode`).

use std::time::Instant;

use burn::tensor::{Int, Tensor, TensorData};
use nsa_core::{DecodeAttentionBackend, DecodeCache, NsaLm};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::data::corpus::Packing;

/// How tokens are drawn.
#[derive(Clone, Debug)]
pub struct SampleOptions {
    /// New tokens per sequence at most.
    pub max_tokens: usize,
    /// 0 is greedy.
    pub temperature: f64,
    /// Keep the `top_k` likeliest tokens (0 keeps all).
    pub top_k: usize,
    /// Then keep the smallest set whose probability reaches `top_p` (1 keeps all).
    pub top_p: f64,
    pub seed: u64,
}

/// What a generation produced, and its speed.
#[derive(Clone, Debug)]
pub struct Generation {
    /// The new tokens of each sequence (without its prompt; the end-of-text token excluded).
    pub tokens: Vec<Vec<u32>>,
    /// Prompt tokens prefilled, and the seconds the prefill took (first token included).
    pub prefill_tokens: usize,
    pub prefill_secs: f64,
    /// Tokens made by decode steps (every sequence of the batch counted), and their seconds.
    pub decode_tokens: usize,
    pub decode_secs: f64,
    /// Whether a sequence reached the model's length before its limit or end-of-text.
    pub hit_length: bool,
}

/// The tokenizer's end-of-text id, which ends every document of the training data, and how the
/// model's training packed the documents.
#[derive(Clone, Copy, Debug)]
pub struct EndOfText {
    pub id: u32,
    pub packing: Packing,
}

/// What of `prompt` the model reads: with packed documents, the part after its last end-of-text
/// (`None` when nothing follows it); otherwise all of it.
///
/// A model trained on packed documents attends nothing before a document's start, and its
/// positions, compressed and selection blocks, forced blocks and window all restart there (spec,
/// "Prefill, decode, varlen"): its next token is a function of the last document alone, the
/// same function as a prefill of that document from position 0. So only that document is
/// prefilled, and the cache holds nothing that a step would mask. A model trained on one stream
/// attends across documents and reads the whole prompt.
pub fn continued(prompt: &[u32], end_of_text: Option<EndOfText>) -> Option<&[u32]> {
    match end_of_text {
        Some(EndOfText { id, packing: Packing::Documents }) => {
            let start = prompt.iter().rposition(|&t| t == id).map_or(0, |i| i + 1);
            (start < prompt.len()).then(|| &prompt[start..])
        }
        _ => Some(prompt),
    }
}

/// Continues each of `prompts` by up to `opts.max_tokens` tokens, stopping a sequence at the
/// end-of-text id; `on_token(row, token)` is called as each token is drawn. A prompt may hold
/// several documents, ended by end-of-text ids: a model trained on packed documents continues
/// the last ([`continued`]). A prompt (for packed documents, its last document) longer than the
/// model's `seq_len` is an error: positions past it have no trained rotation.
pub fn generate<B: DecodeAttentionBackend>(
    model: &NsaLm<B>,
    prompts: &[Vec<u32>],
    opts: &SampleOptions,
    end_of_text: Option<EndOfText>,
    device: &B::Device,
    mut on_token: impl FnMut(usize, u32),
) -> Result<Generation, String> {
    let seq_len = model.seq_len();
    let prompts = checked_prompts(prompts, end_of_text, seq_len)?;
    let longest = prompts.iter().map(|p| p.len()).max().ok_or("no prompt given")?;
    let stop = end_of_text.map(|e| e.id);
    let max_len = seq_len.min(longest + opts.max_tokens);
    let mut rng = StdRng::seed_from_u64(opts.seed);
    let mut out: Vec<Vec<u32>> = vec![Vec::new(); prompts.len()];
    let mut done = vec![opts.max_tokens == 0; prompts.len()];

    let start = Instant::now();
    let (mut cache, first) = prefill_all(model, &prompts, max_len, device)?;
    let mut last: Vec<u32> = first.iter().map(|logits| pick(logits, opts, &mut rng)).collect();
    let prefill_secs = start.elapsed().as_secs_f64();
    let mut take = |row: usize, token: u32, out: &mut Vec<Vec<u32>>, done: &mut Vec<bool>| {
        if done[row] {
            return;
        }
        if Some(token) == stop {
            done[row] = true;
            return;
        }
        out[row].push(token);
        on_token(row, token);
        done[row] = out[row].len() >= opts.max_tokens;
    };
    for (row, &token) in last.iter().enumerate() {
        take(row, token, &mut out, &mut done);
    }

    let start = Instant::now();
    let mut decode_tokens = 0;
    let mut hit_length = false;
    while done.iter().any(|d| !d) {
        if cache.lengths.iter().any(|&t| t >= max_len) {
            hit_length = max_len == seq_len;
            break;
        }
        let ids: Vec<i64> = last.iter().map(|&t| i64::from(t)).collect();
        let input = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [last.len(), 1]), device);
        let (step, next) = model.decode(input, cache);
        cache = next;
        let vocab = step.logits.dims()[1];
        let logits = to_host(step.logits)?;
        for (row, token) in last.iter_mut().enumerate() {
            *token = pick(&logits[row * vocab..(row + 1) * vocab], opts, &mut rng);
        }
        decode_tokens += last.len();
        for (row, &token) in last.iter().enumerate() {
            take(row, token, &mut out, &mut done);
        }
    }
    Ok(Generation {
        tokens: out,
        prefill_tokens: prompts.iter().map(|p| p.len()).sum(),
        prefill_secs,
        decode_tokens,
        decode_secs: start.elapsed().as_secs_f64(),
        hit_length,
    })
}

/// The prompts as the model continues them (for packed documents, each one's last document),
/// or a one-line error: an empty prompt, one that ends a document, one longer than `seq_len`.
fn checked_prompts(
    prompts: &[Vec<u32>],
    end_of_text: Option<EndOfText>,
    seq_len: usize,
) -> Result<Vec<&[u32]>, String> {
    if let Some(empty) = prompts.iter().position(Vec::is_empty) {
        return Err(format!("prompt {empty} has no tokens"));
    }
    let prompts = prompts
        .iter()
        .enumerate()
        .map(|(i, prompt)| {
            continued(prompt, end_of_text).ok_or_else(|| {
                format!(
                    "prompt {i} ends with the end-of-text token: a model trained on packed documents would begin a \
                     new document there, with nothing to continue; end the prompt with the text to continue"
                )
            })
        })
        .collect::<Result<Vec<&[u32]>, String>>()?;
    if let Some(longest) = prompts.iter().map(|p| p.len()).max().filter(|&n| n > seq_len) {
        return Err(format!(
            "the prompt is {longest} tokens, longer than the model's seq_len of {seq_len} (the longest context it was \
             trained on): shorten it"
        ));
    }
    Ok(prompts)
}

/// A cache of `max_len` positions with each prompt prefilled into its row, and each row's
/// logits for the token after its prompt.
fn prefill_all<B: DecodeAttentionBackend>(
    model: &NsaLm<B>,
    prompts: &[&[u32]],
    max_len: usize,
    device: &B::Device,
) -> Result<(DecodeCache<B>, Vec<Vec<f64>>), String> {
    let mut cache = model.decode_cache(prompts.len(), max_len, device);
    let mut first = Vec::with_capacity(prompts.len());
    for (row, prompt) in prompts.iter().enumerate() {
        let ids: Vec<i64> = prompt.iter().map(|&t| i64::from(t)).collect();
        let input = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [1, prompt.len()]), device);
        let (logits, filled) = model.prefill(input, row, cache);
        cache = filled;
        first.push(to_host(logits)?);
    }
    Ok((cache, first))
}

/// Logits on the host, as a sampler reads them.
pub fn to_host<B: DecodeAttentionBackend>(logits: Tensor<B, 2>) -> Result<Vec<f64>, String> {
    logits.into_data().convert::<f64>().to_vec().map_err(|e| format!("cannot read the logits: {e:?}"))
}

/// Greedy at temperature 0; else the temperature's distribution over the `top_k` likeliest
/// tokens, cut to the smallest set reaching `top_p`.
pub fn pick(logits: &[f64], opts: &SampleOptions, rng: &mut StdRng) -> u32 {
    if opts.temperature <= 0.0 {
        // The first of the largest: ties go to the lower id, as the sort below orders them.
        let best = (0..logits.len()).rev().max_by(|&a, &b| logits[a].total_cmp(&logits[b])).unwrap_or(0);
        return best as u32;
    }
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|a, b| logits[*b].total_cmp(&logits[*a]));
    let k = if opts.top_k == 0 { order.len() } else { opts.top_k.min(order.len()) };
    let top = &order[..k];
    let max = logits[top[0]];
    let weights: Vec<f64> = top.iter().map(|&i| ((logits[i] - max) / opts.temperature).exp()).collect();
    let total: f64 = weights.iter().sum();
    // The nucleus: the likeliest tokens until their share reaches top_p (at least one).
    let mut kept = 0;
    let mut mass = 0.0;
    while kept < k && (kept == 0 || mass < opts.top_p * total) {
        mass += weights[kept];
        kept += 1;
    }
    let mut draw = rng.random::<f64>() * mass;
    for (i, w) in top[..kept].iter().zip(&weights) {
        draw -= w;
        if draw <= 0.0 {
            return *i as u32;
        }
    }
    top[kept - 1] as u32
}

/// Text printed as tokens come: the decoded text grows token by token, and a token that ends
/// inside a multi-byte character waits for the rest of it.
#[derive(Default)]
pub struct TextStream {
    ids: Vec<u32>,
    printed: usize,
}

impl TextStream {
    /// Adds `token`; returns the text that is now complete and not yet returned.
    pub fn push(&mut self, token: u32, decode: impl Fn(&[u32]) -> String) -> String {
        self.ids.push(token);
        let text = decode(&self.ids);
        if text.ends_with('\u{FFFD}') || text.len() < self.printed || !text.is_char_boundary(self.printed) {
            return String::new();
        }
        let new = text[self.printed..].to_string();
        self.printed = text.len();
        new
    }
}
