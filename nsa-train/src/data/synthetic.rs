//! Synthetic tasks with a known floor, for checking that a model learns at all.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use super::corpus::PackedSplit;
use super::passkey;
use super::tokenizer::Tokenizer;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SyntheticTask {
    /// `s | s \n`: a random string of `span` letters, a separator, the same string again.
    /// The second copy is fully predictable: loss on it can reach zero.
    Copy,
    /// `k1 v1 k2 v2 ... ? k_i v_i`: random key/value letter pairs, then queries of earlier keys
    /// whose values are predictable from context.
    Recall,
    /// Passkey retrieval as `nsa eval needle` asks it: each window haystacks of random lengths
    /// up to the window (a five-digit key at a random depth of filler, the question at the end)
    /// and their answers, packed as documents, so a model learns to find the key wherever it is
    /// at every distance. The loss is the answers' alone.
    Passkey,
}

const ALPHABET: u32 = 16;
const LETTER: u32 = b'a' as u32;

/// A stream of `num_tokens` tokens of the copy task (bytes: lowercase letters and punctuation).
fn copy_stream(num_tokens: usize, span: usize, seed: u64) -> Vec<u32> {
    stream(num_tokens, seed, |rng, out| {
        let s: Vec<u32> = (0..span).map(|_| letter(rng)).collect();
        out.extend(&s);
        out.push(u32::from(b'|'));
        out.extend(&s);
        out.push(u32::from(b'\n'));
    })
}

/// A stream of `num_tokens` tokens of the recall task (bytes: lowercase letters and punctuation).
fn recall_stream(num_tokens: usize, span: usize, seed: u64) -> Vec<u32> {
    stream(num_tokens, seed, |rng, out| {
        let keys: Vec<u32> = (0..span).map(|i| LETTER + i as u32 % ALPHABET).collect();
        let values: Vec<u32> = (0..span).map(|_| letter(rng)).collect();
        for (k, v) in keys.iter().zip(&values) {
            out.extend([*k, *v]);
        }
        for _ in 0..span {
            let i = rng.random_range(0..span);
            out.extend([u32::from(b'?'), keys[i], values[i]]);
        }
        out.push(u32::from(b'\n'));
    })
}

fn letter(rng: &mut StdRng) -> u32 {
    LETTER + rng.random_range(0..ALPHABET)
}

/// `num_tokens` tokens of examples that `example` appends, seeded.
fn stream(num_tokens: usize, seed: u64, mut example: impl FnMut(&mut StdRng, &mut Vec<u32>)) -> Vec<u32> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = Vec::with_capacity(num_tokens);
    while out.len() < num_tokens {
        example(&mut rng, &mut out);
    }
    out.truncate(num_tokens);
    out
}

/// Train and validation splits of a task, from disjoint seeds; `align` is where the passkey
/// task's documents may start (the model's document alignment).
pub fn splits(
    task: SyntheticTask,
    seq_len: usize,
    align: usize,
    train_windows: usize,
    seed: u64,
) -> (PackedSplit, PackedSplit) {
    let span = (seq_len / 8).clamp(2, ALPHABET as usize);
    let make = |windows: usize, seed| match task {
        SyntheticTask::Copy => PackedSplit::from_tokens(copy_stream(windows * seq_len + 1, span, seed), seq_len),
        SyntheticTask::Recall => PackedSplit::from_tokens(recall_stream(windows * seq_len + 1, span, seed), seq_len),
        SyntheticTask::Passkey => passkey_split(seq_len, align, windows, seed),
    };
    (make(train_windows, seed), make((train_windows / 10).max(4), seed ^ 0x5eed))
}

/// `windows` windows of passkey documents ([`passkey::documents`]), each attending only itself.
fn passkey_split(seq_len: usize, align: usize, windows: usize, seed: u64) -> PackedSplit {
    let mut rng = StdRng::seed_from_u64(seed);
    let bytes = Tokenizer::Bytes;
    let examples = passkey::filled_windows(&bytes, seq_len, align, windows, &mut rng)
        .expect("the config's check leaves room for a haystack");
    PackedSplit::from_examples(examples, seq_len, bytes.eod())
}
