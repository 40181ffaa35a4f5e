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

/// One split's token stream: documents in order, each followed by the end-of-document id, cut into
/// windows of `seq_len + 1` tokens (inputs and next-token targets) that step by `seq_len`.
#[derive(Debug, Clone)]
pub struct PackedSplit {
    tokens: Vec<u32>,
    seq_len: usize,
}

impl PackedSplit {
    pub fn pack<'a>(
        docs: impl IntoIterator<Item = &'a str>,
        tokenizer: &Tokenizer,
        seq_len: usize,
    ) -> Result<Self, DataError> {
        let mut tokens = Vec::new();
        for doc in docs {
            tokens.extend(tokenizer.encode(doc)?);
            tokens.push(tokenizer.eod());
        }
        Ok(Self { tokens, seq_len })
    }

    pub fn from_tokens(tokens: Vec<u32>, seq_len: usize) -> Self {
        Self { tokens, seq_len }
    }

    /// The split with passkey windows ([`passkey::window`]) making up `share` of its windows:
    /// appended after its whole windows (a partial last one is dropped), so each is a window of
    /// its own, and the seeded order mixes them among the text's.
    pub fn with_passkeys(mut self, share: f64, tokenizer: &Tokenizer, seed: u64) -> Result<Self, DataError> {
        let text_windows = self.num_windows();
        let count = (text_windows as f64 * share / (1.0 - share)).round() as usize;
        if count == 0 {
            return Ok(self);
        }
        self.tokens.truncate(text_windows * self.seq_len);
        let mut rng = StdRng::seed_from_u64(seed);
        for _ in 0..count {
            self.tokens.extend(passkey::window(tokenizer, self.seq_len, &mut rng).map_err(DataError)?);
        }
        // The last window's last target.
        self.tokens.push(tokenizer.eod());
        Ok(self)
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
