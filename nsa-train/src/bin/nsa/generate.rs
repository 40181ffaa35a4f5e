//! `nsa generate`: text sampled from a checkpoint.

use std::io::Write;
use std::path::PathBuf;

use nsa_core::DecodeAttentionBackend;
use nsa_train::config::{BackendKind, Precision};
use nsa_train::data::tokenizer::Tokenizer;
use nsa_train::generate::{continued, EndOfText, Generation, SampleOptions, TextStream};
use nsa_train::with_inference_backend;

use crate::trained::{Loaded, RunOn};

#[derive(clap::Args)]
pub(crate) struct GenerateArgs {
    /// A run directory (its newest checkpoint) or one checkpoint directory.
    #[arg(long)]
    checkpoint: PathBuf,
    /// The text to continue. Its documents end at the tokenizer's end-of-text (byte 0x04, or a
    /// `tokenizer.json`'s end-of-text token); a model trained on packed documents continues the
    /// last and reads nothing before it.
    #[arg(long, required_unless_present = "prompt_file", conflicts_with = "prompt_file")]
    prompt: Option<String>,
    /// A file whose text is the prompt (documents as in `--prompt`).
    #[arg(long)]
    prompt_file: Option<PathBuf>,
    /// New tokens per sample at most (generation also stops at end-of-text).
    #[arg(long, alias = "tokens", default_value_t = 200)]
    max_tokens: usize,
    /// 0 samples greedily.
    #[arg(long, default_value_t = 0.8)]
    temperature: f64,
    /// Sample among the k likeliest tokens (0: all).
    #[arg(long, default_value_t = 40)]
    top_k: usize,
    /// Then among the fewest tokens whose probability reaches p (1: all).
    #[arg(long, default_value_t = 1.0)]
    top_p: f64,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Samples of the prompt drawn together (one decode step serves them all); printed when done.
    #[arg(long, default_value_t = 1)]
    batch: usize,
    #[arg(long, value_enum)]
    backend: Option<BackendKind>,
}

/// The prompt text, from `--prompt` or `--prompt-file`.
fn prompt_text(prompt: Option<String>, file: Option<PathBuf>) -> Result<String, String> {
    let (text, from) = match (prompt, file) {
        (Some(text), _) => (text, "--prompt".to_string()),
        (None, Some(path)) => {
            let text = std::fs::read_to_string(&path)
                .map_err(|e| format!("--prompt-file {}: cannot read: {e}", path.display()))?;
            (text, format!("--prompt-file {}", path.display()))
        }
        (None, None) => return Err("give --prompt TEXT or --prompt-file PATH".into()),
    };
    if text.is_empty() {
        return Err(format!("{from} is empty: give the text to continue (at least one character)"));
    }
    Ok(text)
}

/// Checks the sampling flags, each error naming its flag.
fn options(args: &GenerateArgs) -> Result<SampleOptions, String> {
    if !(args.temperature >= 0.0 && args.temperature.is_finite()) {
        return Err(format!("--temperature must be a finite number >= 0, got {}", args.temperature));
    }
    if !(args.top_p > 0.0 && args.top_p <= 1.0) {
        return Err(format!("--top-p must be in (0, 1], got {}", args.top_p));
    }
    if args.batch == 0 {
        return Err("--batch must be at least 1".into());
    }
    Ok(SampleOptions {
        max_tokens: args.max_tokens,
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        seed: args.seed,
    })
}

pub(crate) fn generate(args: GenerateArgs) -> Result<(), String> {
    let opts = options(&args)?;
    let GenerateArgs { checkpoint: path, prompt, prompt_file, batch, backend, .. } = args;
    let prompt = prompt_text(prompt, prompt_file)?;
    // Generation samples in f32 on every backend.
    let loaded = Loaded::open(&path, &RunOn { precision: Some(Precision::F32), backend })?;
    let tokenizer = loaded.tokenizer()?;
    let job = Job { loaded: &loaded, tokenizer: &tokenizer, prompt: &prompt, batch, opts: &opts };
    with_inference_backend!(loaded.kind, false, |B, device, _memory| job.run::<B>(&device))
}

/// What one `nsa generate` samples.
struct Job<'a> {
    loaded: &'a Loaded,
    tokenizer: &'a Tokenizer,
    prompt: &'a str,
    batch: usize,
    opts: &'a SampleOptions,
}

impl Job<'_> {
    /// Loads the checkpoint on `B` and samples, streaming a single sample's text as it comes.
    fn run<B: DecodeAttentionBackend>(&self, device: &B::Device) -> Result<(), String> {
        let Job { loaded, tokenizer, prompt, batch, opts } = *self;
        let model = loaded.model::<B>(device)?;
        let prompt_ids = tokenizer.encode_prompt(prompt).map_err(|e| e.to_string())?;
        if prompt_ids.is_empty() {
            return Err(format!("--prompt {prompt:?} encodes to no tokens: give text the tokenizer keeps"));
        }
        let end_of_text = EndOfText { id: tokenizer.eod(), packing: loaded.cfg.data.pack };
        if let Some(last) = continued(&prompt_ids, Some(end_of_text)).filter(|last| last.len() < prompt_ids.len()) {
            eprintln!(
                "the prompt holds several documents: a model trained on packed documents reads only the last ({} of \
                 its {} tokens)",
                last.len(),
                prompt_ids.len()
            );
        }
        let prompts = vec![prompt_ids; batch];
        let decode = |ids: &[u32]| tokenizer.decode(ids);
        let mut stream = TextStream::default();
        if batch == 1 {
            print!("{prompt}");
        }
        let done = nsa_train::generate::generate(&model, &prompts, opts, Some(end_of_text), device, |_, token| {
            if batch == 1 {
                print!("{}", stream.push(token, decode));
                let _ = std::io::stdout().flush();
            }
        })?;
        if batch == 1 {
            println!();
        } else {
            for (i, tokens) in done.tokens.iter().enumerate() {
                println!("--- sample {i}\n{prompt}{}", tokenizer.decode(tokens));
            }
        }
        report(&done, model.seq_len());
        Ok(())
    }
}

/// The closing line: prefill and decode speed.
fn report(done: &Generation, seq_len: usize) {
    let rate = |tokens: usize, secs: f64| if secs > 0.0 { tokens as f64 / secs } else { 0.0 };
    if done.hit_length {
        eprintln!("stopped at the model's seq_len of {seq_len} tokens");
    }
    eprintln!(
        "prefill {} tokens in {:.2} s ({:.0} tokens/s), decode {} tokens in {:.2} s ({:.1} tokens/s)",
        done.prefill_tokens,
        done.prefill_secs,
        rate(done.prefill_tokens, done.prefill_secs),
        done.decode_tokens,
        done.decode_secs,
        rate(done.decode_tokens, done.decode_secs)
    );
}
