//! A run's data: the train and validation splits its config names, from files (training's with
//! the passkey windows `passkey_share` asks for; validation's text only) or a synthetic task,
//! and the tokenizer that made them.

use std::path::PathBuf;

use crate::config::RunConfig;
use crate::data::corpus::{is_validation, PackedSplit};
use crate::data::sources::{read_documents, DataError};
use crate::data::synthetic;
use crate::data::tokenizer::Tokenizer;

/// Train and validation splits for a run, and the tokenizer that made them.
pub fn load_splits(cfg: &RunConfig, paths: &[PathBuf]) -> Result<(PackedSplit, PackedSplit, Tokenizer), DataError> {
    let seq_len = cfg.model.seq_len;
    let tokenizer = Tokenizer::from_spec(&cfg.data.tokenizer)?;
    if tokenizer.vocab_size() > cfg.model.vocab_size {
        return Err(DataError(format!(
            "the tokenizer has {} tokens but model.vocab_size is {}",
            tokenizer.vocab_size(),
            cfg.model.vocab_size
        )));
    }
    if let Some(task) = cfg.data.synthetic_task().map_err(|e| DataError(e.to_string()))? {
        let t = &cfg.train;
        // NSA's alignment whatever the attention, so a dense run reads the same documents.
        let align = cfg.model.attention.document_alignment();
        let windows = (t.steps * t.batch_size * t.devices.len() * t.grad_accumulation).clamp(64, 1 << 16);
        let (train, valid) = synthetic::splits(task, seq_len, align, windows, cfg.train.seed);
        return Ok((train, valid, tokenizer));
    }
    let found = read_documents(paths)?;
    let skipped = found.skipped_note();
    if found.docs.is_empty() {
        let why = skipped.map(|note| format!(" ({note})")).unwrap_or_default();
        return Err(DataError(format!("no documents found in {}{why}", display(paths))));
    }
    if let Some(note) = skipped {
        eprintln!("warning: {note}");
    }
    let docs = found.docs;
    let permille = cfg.data.valid_permille;
    let (packing, align) = (cfg.data.pack, cfg.model.document_alignment());
    let split = |held_out: bool| {
        let docs = docs.iter().filter(|d| is_validation(d, permille) == held_out).map(String::as_str);
        PackedSplit::pack_as(docs, &tokenizer, seq_len, packing, align)
    };
    let train = split(false)?.with_passkeys(cfg.data.passkey_share, &tokenizer, align, cfg.train.seed)?;
    let valid = split(true)?;
    Ok((train, valid, tokenizer))
}

fn display(paths: &[PathBuf]) -> String {
    paths.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
}
