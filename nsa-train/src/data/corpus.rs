//! Packing documents into fixed windows, the validation split, and the seeded batch order.

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};

use super::passkey;
use super::sources::DataError;
use super::tokenizer::Tokenizer;

/// FNV-1a, 64 bit: a stable hash (std's hasher may change between Rust releases, and the split
/// must not).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
}

/// Whether a document belongs to the validation split: decided by its text's hash alone, so the
/// split never depends on file order and identical documents always land on the same side.
pub fn is_validation(doc: &str, valid_permille: u32) -> bool {
    fnv1a(doc.as_bytes()) % 1000 < u64::from(valid_permille)
}

/// How documents fill a split's windows ([`crate::config::DataConfig::pack`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Packing {
    /// One stream of documents, each followed by the end-of-document id, cut into windows.
    Stream,
    /// Each document starts at a multiple of an alignment, the gap before it padded with the
    /// end-of-document id; every position knows its document ([`DocumentSpans`]).
    Documents,
}

/// One split's token stream: documents in order, each followed by the end-of-document id, cut into
/// windows of `seq_len + 1` tokens (inputs and next-token targets) that step by `seq_len`.
#[derive(Debug, Clone)]
pub struct PackedSplit {
    tokens: Vec<u32>,
    seq_len: usize,
    /// Where each document lies, when packed as documents.
    documents: Option<DocumentSpans>,
}

impl PackedSplit {
    /// The documents as one stream ([`Packing::Stream`]).
    pub fn pack<'a>(
        docs: impl IntoIterator<Item = &'a str>,
        tokenizer: &Tokenizer,
        seq_len: usize,
    ) -> Result<Self, DataError> {
        Self::pack_as(docs, tokenizer, seq_len, Packing::Stream, 1)
    }

    /// The documents packed as `packing` says; with [`Packing::Documents`], each starting at a
    /// multiple of `align` (which must divide `seq_len`, so every window starts aligned too).
    pub fn pack_as<'a>(
        docs: impl IntoIterator<Item = &'a str>,
        tokenizer: &Tokenizer,
        seq_len: usize,
        packing: Packing,
        align: usize,
    ) -> Result<Self, DataError> {
        let mut tokens = Vec::new();
        let mut spans = DocumentSpans::default();
        for doc in docs {
            if packing == Packing::Documents {
                tokens.resize(tokens.len().next_multiple_of(align), tokenizer.eod());
            }
            let start = tokens.len();
            tokens.extend(tokenizer.encode(doc)?);
            // The end-of-document id is the document's last target; its own target is not.
            spans.push(start, tokens.len());
            tokens.push(tokenizer.eod());
        }
        let documents = (packing == Packing::Documents).then_some(spans);
        Ok(Self { tokens, seq_len, documents })
    }

    pub fn from_tokens(tokens: Vec<u32>, seq_len: usize) -> Self {
        Self { tokens, seq_len, documents: None }
    }

    /// Passkey examples laid end to end, each a document of its own (packed as documents,
    /// unaligned) whose targets are its answer alone, and `last` as the last window's last
    /// target. Scoring the answer alone puts all of the loss on retrieval: the filler is the
    /// same few sentences, learnt early, and the needle's key is random, so neither teaches
    /// reading the key back.
    pub fn from_examples(examples: impl IntoIterator<Item = passkey::Example>, seq_len: usize, last: u32) -> Self {
        let mut split = Self { tokens: Vec::new(), seq_len, documents: Some(DocumentSpans::default()) };
        for example in examples {
            split.push_example(example);
        }
        split.tokens.push(last);
        split
    }

    /// Appends a passkey example: a document whose scored targets are its answer alone when the
    /// split is packed as documents.
    fn push_example(&mut self, example: passkey::Example) {
        let start = self.tokens.len();
        self.tokens.extend(example.tokens);
        if let Some(spans) = &mut self.documents {
            // The question's last token predicts the answer's first; the document's last
            // target is the next one's first token, not its own.
            spans.push_scored(start, start + example.answer_at - 1, self.tokens.len() - 1);
        }
    }

    /// The split with passkey windows making up `share` of its windows, each filled with
    /// haystacks as the passkey task's ([`passkey::filled_windows`], starting at multiples of
    /// `align`): appended after its whole windows (a partial last one is dropped), so each is a
    /// window of its own, and the seeded order mixes them among the text's. Packed as
    /// documents, a haystack attends to itself alone and only its answer is scored, as in
    /// `synthetic = "passkey"`; as a stream, the windows are text like any other.
    pub fn with_passkeys(
        mut self,
        share: f64,
        tokenizer: &Tokenizer,
        align: usize,
        seed: u64,
    ) -> Result<Self, DataError> {
        let text_windows = self.num_windows();
        let count = (text_windows as f64 * share / (1.0 - share)).round() as usize;
        if count == 0 {
            return Ok(self);
        }
        let end = text_windows * self.seq_len;
        self.tokens.truncate(end);
        if let Some(spans) = &mut self.documents {
            spans.truncate(end);
        }
        let mut rng = StdRng::seed_from_u64(seed);
        for example in passkey::filled_windows(tokenizer, self.seq_len, align, count, &mut rng).map_err(DataError)? {
            self.push_example(example);
        }
        // The last window's last target.
        self.tokens.push(tokenizer.eod());
        Ok(self)
    }

    /// Where the documents lie, when packed as documents.
    pub fn documents(&self) -> Option<&DocumentSpans> {
        self.documents.as_ref()
    }

    pub fn num_windows(&self) -> usize {
        self.tokens.len().saturating_sub(1) / self.seq_len
    }

    pub fn num_tokens(&self) -> usize {
        self.tokens.len()
    }

    /// Window `i`: `seq_len + 1` tokens.
    pub fn window(&self, i: usize) -> &[u32] {
        &self.tokens[i * self.seq_len..(i + 1) * self.seq_len + 1]
    }

    pub fn seq_len(&self) -> usize {
        self.seq_len
    }
}

/// Packed documents' places in a split's stream, in order.
#[derive(Debug, Clone, Default)]
pub struct DocumentSpans {
    spans: Vec<Span>,
}

/// One document's place in the stream.
#[derive(Debug, Clone, Copy)]
struct Span {
    /// Its first position.
    start: usize,
    /// The first position whose target is scored: `start` unless a prompt comes first.
    scored_from: usize,
    /// The end of its scored targets (its end-of-document id's position: that position's
    /// target is the padding or the next document).
    targets_end: usize,
}

impl DocumentSpans {
    /// How many targets are the documents' own: what a loss over the split averages.
    pub fn targets(&self) -> usize {
        self.spans.iter().map(|s| s.targets_end.saturating_sub(s.scored_from)).sum()
    }

    fn push(&mut self, start: usize, targets_end: usize) {
        self.push_scored(start, start, targets_end);
    }

    fn push_scored(&mut self, start: usize, scored_from: usize, targets_end: usize) {
        self.spans.push(Span { start, scored_from, targets_end });
    }

    /// Drops what lies at or after stream position `end`.
    fn truncate(&mut self, end: usize) {
        self.spans.retain(|s| s.start < end);
        if let Some(last) = self.spans.last_mut() {
            last.targets_end = last.targets_end.min(end);
        }
    }

    /// For the `len` positions from stream position `from` (a window): each position's
    /// document start within the window (a document begun before `from` restarts at 0: a piece
    /// of a long document), appended to `starts`; and `-1` written to the `targets` of positions
    /// whose target is not their document's own or not scored.
    pub fn mark(&self, from: usize, len: usize, starts: &mut Vec<i64>, targets: &mut [i64]) {
        let mut k = self.spans.partition_point(|s| s.start <= from).saturating_sub(1);
        for (p, target) in targets.iter_mut().enumerate().take(len) {
            let at = from + p;
            while k + 1 < self.spans.len() && self.spans[k + 1].start <= at {
                k += 1;
            }
            // The first document starts the stream, so every position lies in a span.
            let Span { start, scored_from, targets_end } = self.spans[k];
            starts.push((start.max(from) - from) as i64);
            if at < scored_from || at >= targets_end {
                *target = -1;
            }
        }
    }
}

/// Where the training data stream stands: saved in every checkpoint so a resumed run reads the
/// same batches an uninterrupted one would.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct DataCursor {
    pub epoch: u64,
    /// Windows of this epoch already consumed.
    pub offset: usize,
}

/// The seeded, epoch-wise shuffled order of a split's windows.
pub struct BatchOrder {
    seed: u64,
    num_windows: usize,
    epoch: u64,
    order: Vec<usize>,
}

impl BatchOrder {
    pub fn new(seed: u64, num_windows: usize) -> Self {
        let mut this = Self { seed, num_windows, epoch: u64::MAX, order: Vec::new() };
        this.prepare(0);
        this
    }

    fn prepare(&mut self, epoch: u64) {
        if self.epoch != epoch {
            let mut rng = StdRng::seed_from_u64(self.seed ^ epoch.wrapping_mul(0x9e37_79b9_7f4a_7c15));
            self.order = (0..self.num_windows).collect();
            self.order.shuffle(&mut rng);
            self.epoch = epoch;
        }
    }

    /// The next `count` window indices from `cursor`, advancing it (into the next epoch when
    /// this one runs out).
    pub fn take(&mut self, cursor: &mut DataCursor, count: usize) -> Vec<usize> {
        let mut out = Vec::with_capacity(count);
        while out.len() < count {
            if cursor.offset >= self.num_windows {
                cursor.epoch += 1;
                cursor.offset = 0;
            }
            self.prepare(cursor.epoch);
            out.push(self.order[cursor.offset]);
            cursor.offset += 1;
        }
        out
    }
}
