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
    /// Passkey retrieval as `nsa eval needle` asks it: each window one haystack (a five-digit key
    /// at a random depth of filler, the question at the end) and its answer, so a model learns
    /// to find the key wherever it is.
    Passkey,
}

const ALPHABET: u32 = 16;
const LETTER: u32 = b'a' as u32;

/// A stream of `num_tokens` tokens of the task (bytes: lowercase letters and punctuation).
pub fn generate(task: SyntheticTask, num_tokens: usize, span: usize, seed: u64) -> Vec<u32> {
    let mut rng = StdRng::seed_from_u64(seed);
    let letter = |rng: &mut StdRng| LETTER + rng.random_range(0..ALPHABET);
    let mut out = Vec::with_capacity(num_tokens + 2 * span + 2);
    while out.len() < num_tokens {
        match task {
            SyntheticTask::Copy => {
                let s: Vec<u32> = (0..span).map(|_| letter(&mut rng)).collect();
                out.extend(&s);
                out.push(u32::from(b'|'));
                out.extend(&s);
                out.push(u32::from(b'\n'));
            }
            SyntheticTask::Passkey => {
                // `span` is the window: one haystack and its answer fill it.
                let window = passkey::window(&Tokenizer::Bytes, span, &mut rng);
                out.extend(window.expect("the config's check leaves room for a haystack"));
            }
            SyntheticTask::Recall => {
                let keys: Vec<u32> = (0..span).map(|i| LETTER + i as u32 % ALPHABET).collect();
                let values: Vec<u32> = (0..span).map(|_| letter(&mut rng)).collect();
                for (k, v) in keys.iter().zip(&values) {
                    out.extend([*k, *v]);
                }
                for _ in 0..span {
                    let i = rng.random_range(0..span);
                    out.extend([u32::from(b'?'), keys[i], values[i]]);
                }
                out.push(u32::from(b'\n'));
            }
        }
    }
    out.truncate(num_tokens);
    out
}

/// Train and validation splits of a task, from disjoint seeds.
pub fn splits(task: SyntheticTask, seq_len: usize, train_windows: usize, seed: u64) -> (PackedSplit, PackedSplit) {
    let span = match task {
        SyntheticTask::Passkey => seq_len,
        _ => (seq_len / 8).clamp(2, ALPHABET as usize),
    };
    let make =
        |windows: usize, seed| PackedSplit::from_tokens(generate(task, windows * seq_len + 1, span, seed), seq_len);
    (make(train_windows, seed), make((train_windows / 10).max(4), seed ^ 0x5eed))
}
