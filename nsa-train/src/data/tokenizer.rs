//! Tokenizers: bytes (vocabulary 256, the default) or any Hugging Face `tokenizer.json`.

use std::path::Path;

use super::sources::DataError;

/// Text <-> token ids, with an end-of-document id that packing puts after every document.
pub enum Tokenizer {
    /// UTF-8 bytes. Byte 0x04 (ASCII "end of transmission") marks the end of a document and is
    /// removed from the text itself, so it never appears inside a document.
    Bytes,
    /// A Hugging Face tokenizer; `eod` is the id of its end-of-text special token.
    Hf { inner: Box<tokenizers::Tokenizer>, eod: u32 },
}

pub const BYTE_EOD: u32 = 0x04;

/// Special tokens tried, in order, as the end-of-document marker of a Hugging Face tokenizer.
const EOD_CANDIDATES: [&str; 5] = ["<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>", "[SEP]"];

impl Tokenizer {
    /// `None` means bytes; a path loads a `tokenizer.json`.
    pub fn load(path: Option<&Path>) -> Result<Self, DataError> {
        let Some(path) = path else { return Ok(Self::Bytes) };
        let inner = tokenizers::Tokenizer::from_file(path)
            .map_err(|e| DataError(format!("{}: not a tokenizer.json: {e}", path.display())))?;
        Self::from_hf(inner).map_err(|e| DataError(format!("{}: {e}", path.display())))
    }

    /// The tokenizer `data.tokenizer` names: `"bytes"`, or the path of a `tokenizer.json`.
    pub fn from_spec(spec: &str) -> Result<Self, DataError> {
        match spec {
            "bytes" => Ok(Self::Bytes),
            path => Self::load(Some(Path::new(path))),
        }
    }

    pub fn from_hf(inner: tokenizers::Tokenizer) -> Result<Self, String> {
        let eod = EOD_CANDIDATES
            .iter()
            .find_map(|t| inner.token_to_id(t))
            .ok_or_else(|| format!("no end-of-text token (tried {})", EOD_CANDIDATES.join(", ")))?;
        Ok(Self::Hf { inner: Box::new(inner), eod })
    }

    pub fn vocab_size(&self) -> usize {
        match self {
            Self::Bytes => 256,
            Self::Hf { inner, .. } => inner.get_vocab_size(true),
        }
    }

    pub fn eod(&self) -> u32 {
        match self {
            Self::Bytes => BYTE_EOD,
            Self::Hf { eod, .. } => *eod,
        }
    }

    pub fn encode(&self, text: &str) -> Result<Vec<u32>, DataError> {
        match self {
            Self::Bytes => Ok(text.bytes().filter(|b| u32::from(*b) != BYTE_EOD).map(u32::from).collect()),
            Self::Hf { inner, .. } => inner
                .encode(text, false)
                .map(|e| e.get_ids().to_vec())
                .map_err(|e| DataError(format!("tokenizer failed: {e}"))),
        }
    }

    /// A prompt's ids: [`Self::encode`], keeping the end-of-text marker where the text has one
    /// (byte 0x04 for bytes; a `tokenizer.json` maps its end-of-text token's text to its id in
    /// both), so a prompt can hold several documents (`crate::generate::continued`).
    pub fn encode_prompt(&self, text: &str) -> Result<Vec<u32>, DataError> {
        match self {
            Self::Bytes => Ok(text.bytes().map(u32::from).collect()),
            Self::Hf { .. } => self.encode(text),
        }
    }

    /// Text for ids; invalid UTF-8 (a byte model can emit any byte) is replaced, not an error.
    pub fn decode(&self, ids: &[u32]) -> String {
        match self {
            Self::Bytes => {
                let bytes: Vec<u8> = ids.iter().map(|&i| i.min(255) as u8).collect();
                String::from_utf8_lossy(&bytes).into_owned()
            }
            Self::Hf { inner, .. } => inner.decode(ids, true).unwrap_or_default(),
        }
    }
}
