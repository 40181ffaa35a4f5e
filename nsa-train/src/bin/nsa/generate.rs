//! `nsa generate`: text sampled from a checkpoint.

use std::path::PathBuf;

use burn::tensor::backend::AutodiffBackend;
use nsa_core::NsaLm;
use nsa_train::backends::{resolve, use_kernel_cache};
use nsa_train::checkpoint;
use nsa_train::config::{BackendKind, RunConfig};
use nsa_train::data::tokenizer::Tokenizer;
use nsa_train::generate::{sample, SampleOptions};
use nsa_train::with_backend;

#[derive(clap::Args)]
pub(crate) struct GenerateArgs {
    /// A run directory (its newest checkpoint) or one checkpoint directory.
    #[arg(long)]
    checkpoint: PathBuf,
    #[arg(long)]
    prompt: String,
    #[arg(long, default_value_t = 200)]
    tokens: usize,
    #[arg(long, default_value_t = 0.8)]
    temperature: f64,
    #[arg(long, default_value_t = 40)]
    top_k: usize,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[arg(long, value_enum)]
    backend: Option<BackendKind>,
}

pub(crate) fn generate(args: GenerateArgs) -> Result<(), String> {
    let GenerateArgs { checkpoint: path, prompt, tokens, temperature, top_k, seed, backend } = args;
    let opts = SampleOptions { tokens, temperature, top_k, seed };
    if prompt.is_empty() {
        return Err("--prompt is empty: give the text to continue (at least one character)".into());
    }
    // Accept a run directory (its newest intact checkpoint) or a checkpoint directory.
    let (newest, damaged) = checkpoint::newest_intact(&path);
    for (dir, why) in &damaged {
        eprintln!("warning: checkpoint {} is damaged ({why}); skipping it", dir.display());
    }
    let (run_dir, ckpt) = match newest {
        Some((_, dir)) => (path.clone(), dir),
        None if path.join("model.mpk").exists() => {
            checkpoint::verify(&path).map_err(|why| format!("checkpoint {} is damaged: {why}", path.display()))?;
            (path.parent().and_then(|p| p.parent()).map(PathBuf::from).unwrap_or_default(), path.clone())
        }
        None if !damaged.is_empty() => return Err(format!("{}: no intact checkpoint", path.display())),
        None => {
            return Err(format!(
                "{}: no checkpoint found (expected a run directory or a checkpoint directory)",
                path.display()
            ))
        }
    };
    let cfg = RunConfig::load(&run_dir.join("config.toml")).map_err(|e| e.to_string())?;
    let tokenizer = Tokenizer::from_spec(&cfg.data.tokenizer).map_err(|e| e.to_string())?;
    let _ = use_kernel_cache(&cfg.train.kernel_cache)?;
    let kind = resolve(backend.unwrap_or(cfg.train.backend))?;
    with_backend!(kind, false, &[0], |B, devices, _memory| {
        #[allow(clippy::clone_on_copy)] // `Copy` on the CPU backend's device only.
        let device = devices[0].clone();
        let model: NsaLm<<B as AutodiffBackend>::InnerBackend> = cfg.model.init(&device);
        let model = checkpoint::load_model(&ckpt, model, &device)?;
        checkpoint::check_phi(&ckpt, &model, cfg.model.attention.phi)?;
        let prompt_ids = tokenizer.encode(&prompt).map_err(|e| e.to_string())?;
        if prompt_ids.is_empty() {
            return Err(format!("--prompt {prompt:?} encodes to no tokens: give text the tokenizer keeps"));
        }
        let out = sample(&model, &prompt_ids, &opts, &device);
        println!("{prompt}{}", tokenizer.decode(&out));
        Ok(())
    })
}
