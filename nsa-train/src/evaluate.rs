//! Held-out evaluation (`nsa eval`): a model's loss, perplexity and bits per byte over a text
//! corpus, cut into the model's training windows.

use std::path::PathBuf;

use burn::tensor::ElementConversion;
use nsa_core::{lm_loss, NsaLm, SparseAttentionBackend};
use serde::Serialize;

use crate::data::batch::HostBatch;
use crate::data::corpus::{PackedSplit, Packing};
use crate::data::sources::{read_documents, DataError};
use crate::data::tokenizer::Tokenizer;

/// The text to evaluate: every document of the given files, tokenized and packed as the model
/// was trained (each followed by the end-of-text id) and cut into windows of the model's length.
pub struct EvalText {
    pub split: PackedSplit,
    /// UTF-8 bytes of the text per predicted token (end-of-text ids included, as zero bytes),
    /// which turns bits per token into bits per byte whatever the tokenizer.
    pub bytes_per_token: f64,
}

impl EvalText {
    /// The documents of `paths` packed as `packing` (documents at multiples of `align`).
    pub fn read(
        paths: &[PathBuf],
        tokenizer: &Tokenizer,
        seq_len: usize,
        packing: Packing,
        align: usize,
    ) -> Result<Self, DataError> {
        let found = read_documents(paths)?;
        let names = paths.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ");
        if let Some(note) = found.skipped_note() {
            eprintln!("warning: {note}");
        }
        let bytes: usize = found.docs.iter().map(String::len).sum();
        let split = PackedSplit::pack_as(found.docs.iter().map(String::as_str), tokenizer, seq_len, packing, align)?;
        if split.num_windows() == 0 {
            return Err(DataError(format!(
                "{names}: {} tokens, fewer than one window of the model's seq_len + 1 = {}",
                split.num_tokens(),
                seq_len + 1
            )));
        }
        let predicted = split.documents().map_or(split.num_tokens(), |spans| spans.targets());
        Ok(Self { bytes_per_token: bytes as f64 / predicted.max(1) as f64, split })
    }
}

/// What a model scored on the text.
#[derive(Debug, Clone, Serialize)]
pub struct Evaluation {
    pub windows: usize,
    /// Predicted tokens (`windows * seq_len`, less packed documents' padding).
    pub tokens: usize,
    /// Mean next-token cross-entropy, in nats.
    pub loss: f64,
    pub perplexity: f64,
    pub bits_per_byte: f64,
}

/// Scores `model` on the first `max_windows` windows of `text` (all by default), `batch_size`
/// windows at a time, calling `progress(done, total, mean loss so far)` after each batch.
pub fn evaluate<B: SparseAttentionBackend>(
    model: &NsaLm<B>,
    text: &EvalText,
    batch_size: usize,
    max_windows: Option<usize>,
    device: &B::Device,
    mut progress: impl FnMut(usize, usize, f64),
) -> Evaluation {
    let total = text.split.num_windows().min(max_windows.unwrap_or(usize::MAX));
    let windows: Vec<usize> = (0..total).collect();
    let (mut nats, mut predicted) = (0.0, 0);
    for (i, chunk) in windows.chunks(batch_size.max(1)).enumerate() {
        let host = HostBatch::of_windows(&text.split, chunk);
        // A batch's mean is over the targets the loss keeps, so it weighs by their count.
        let kept = host.targets.iter().filter(|&&t| t >= 0).count();
        let batch = host.to_device::<B>(device);
        let logits = model.forward_with_aux(batch.inputs, batch.documents.as_ref()).0;
        let mean: f64 = lm_loss(logits, batch.targets).into_scalar().elem();
        nats += mean * kept as f64;
        predicted += kept;
        let done = (i * batch_size.max(1) + chunk.len()).min(total);
        progress(done, total, nats / predicted.max(1) as f64);
    }
    let loss = nats / predicted.max(1) as f64;
    Evaluation {
        windows: total,
        tokens: predicted,
        loss,
        perplexity: loss.exp(),
        bits_per_byte: loss / std::f64::consts::LN_2 / text.bytes_per_token,
    }
}
