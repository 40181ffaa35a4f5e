//! Needle in a haystack (passkey retrieval), `nsa eval needle`: a random five-digit key hidden at
//! a depth of filler text, the model asked for it at the end. Greedy decoding must give the key
//! back; accuracy per (length, depth) over a number of keys.

use std::ops::ControlFlow;

use nsa_core::{DecodeAttentionBackend, NsaLm};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::data::corpus::Packing;
pub use crate::data::passkey::haystack;
use crate::data::tokenizer::Tokenizer;
use crate::generate::{generate, EndOfText, SampleOptions};
use crate::plot::HeatMap;

/// Tokens generated for the answer: a five-digit key and a space fit in eight with any tokenizer.
pub const ANSWER_TOKENS: usize = 8;

/// What `nsa eval needle` runs.
#[derive(Clone, Debug)]
pub struct NeedleOptions {
    /// Haystack lengths in tokens, the question included.
    pub lengths: Vec<usize>,
    /// Needle depths in percent of the filler.
    pub depths: Vec<u32>,
    /// Keys per (length, depth), drawn together as one batch.
    pub trials: usize,
    pub seed: u64,
}

/// One (length, depth): how many keys came back.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NeedleCell {
    pub length: usize,
    pub depth: u32,
    pub correct: usize,
    pub trials: usize,
    /// The keys hidden, one per trial.
    pub keys: Vec<u32>,
    /// What the model gave back for each key, as text: what a miss said.
    pub answers: Vec<String>,
    /// The keys' digits given back in place, over all trials: partial retrieval, which a
    /// model learning the task shows before whole keys (chance is a tenth of the digits).
    pub digits: usize,
}

/// What `nsa eval needle --json` writes, after every cell: what the cells were run on, whether
/// every cell asked was run, and the cells so far. A stopped run's file is what `--resume` keeps.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NeedleReport {
    /// The checkpoint directory the model was loaded from (an absolute path).
    pub checkpoint: String,
    /// The context the model ran at (`--context`, or the seq_len it trained at).
    pub context: usize,
    /// The backend and dtype it ran on, e.g. `cuda bf16`: answers may differ between them.
    pub runs_on: String,
    /// Whether every (length, depth) asked was run; false in a run stopped early.
    pub complete: bool,
    pub cells: Vec<NeedleCell>,
}

impl NeedleCell {
    pub fn accuracy(&self) -> f64 {
        self.correct as f64 / self.trials.max(1) as f64
    }

    /// The share of the keys' digits given back in place.
    pub fn digit_accuracy(&self) -> f64 {
        digit_share([self])
    }
}

/// Digits in a key (`10_000..100_000`).
pub const KEY_DIGITS: usize = 5;

/// Runs every (length, depth) of `opts` in order, calling `progress` after each with the cells so
/// far and whether the last was kept; a `Break` from it stops the run there, and the cells so far
/// are its result. A cell of `kept` (an earlier, stopped run's) whose length, depth and keys are
/// this cell's is taken as it is rather than run again: the keys are drawn from `opts.seed` in
/// cell order, so only a run of the same options and seed draws them alike.
pub fn needle_in_a_haystack<B: DecodeAttentionBackend>(
    model: &NsaLm<B>,
    tokenizer: &Tokenizer,
    opts: &NeedleOptions,
    kept: &[NeedleCell],
    device: &B::Device,
    mut progress: impl FnMut(&[NeedleCell], bool) -> ControlFlow<()>,
) -> Result<Vec<NeedleCell>, String> {
    let seq_len = model.seq_len();
    if let Some(&long) = opts.lengths.iter().find(|&&l| l + ANSWER_TOKENS > seq_len) {
        return Err(format!(
            "a haystack of {long} tokens and its {ANSWER_TOKENS}-token answer exceed the model's context of {seq_len} \
             tokens: give --lengths up to {} or a longer --context",
            seq_len.saturating_sub(ANSWER_TOKENS)
        ));
    }
    let mut rng = StdRng::seed_from_u64(opts.seed);
    let mut cells = Vec::new();
    for &length in &opts.lengths {
        for &depth in &opts.depths {
            let keys: Vec<u32> = (0..opts.trials).map(|_| rng.random_range(10_000..100_000)).collect();
            let earlier = kept.iter().find(|c| c.length == length && c.depth == depth && c.keys == keys);
            let cell = match earlier {
                Some(cell) => cell.clone(),
                None => run_cell(model, tokenizer, opts, length, depth, keys, device)?,
            };
            cells.push(cell);
            if progress(&cells, earlier.is_some()).is_break() {
                return Ok(cells);
            }
        }
    }
    Ok(cells)
}

/// One (length, depth): each key hidden in its haystack, all asked for in one batch.
fn run_cell<B: DecodeAttentionBackend>(
    model: &NsaLm<B>,
    tokenizer: &Tokenizer,
    opts: &NeedleOptions,
    length: usize,
    depth: u32,
    keys: Vec<u32>,
    device: &B::Device,
) -> Result<NeedleCell, String> {
    let greedy = SampleOptions { max_tokens: ANSWER_TOKENS, temperature: 0.0, top_k: 0, top_p: 1.0, seed: opts.seed };
    let prompts = keys.iter().map(|&key| haystack(tokenizer, length, depth, key)).collect::<Result<Vec<_>, _>>()?;
    // A haystack is one document (it holds no end-of-text), so packed and streamed models read
    // all of it alike.
    let end_of_text = EndOfText { id: tokenizer.eod(), packing: Packing::Stream };
    let done = generate(model, &prompts, &greedy, Some(end_of_text), device, |_, _| {})?;
    let answers: Vec<String> = done.tokens.iter().map(|answer| tokenizer.decode(answer)).collect();
    let correct = keys.iter().zip(&answers).filter(|(&key, answer)| answers_with(answer, key)).count();
    let digits = keys.iter().zip(&answers).map(|(&key, answer)| digits_in_place(answer, key)).sum();
    Ok(NeedleCell { length, depth, correct, trials: opts.trials, keys, answers, digits })
}

/// What an answer gives back: the generated text after any spaces the model put first.
fn given_back(answer: &str) -> &str {
    answer.trim_start()
}

/// Whether the generated text gives `key` back first.
fn answers_with(answer: &str, key: u32) -> bool {
    given_back(answer).starts_with(&key.to_string())
}

/// How many of `key`'s digits `answer` gives back in place.
fn digits_in_place(answer: &str, key: u32) -> usize {
    key.to_string().bytes().zip(given_back(answer).bytes()).filter(|(k, a)| k == a).count()
}

/// The share of all the cells' key digits given back in place.
pub fn digit_share<'a>(cells: impl IntoIterator<Item = &'a NeedleCell>) -> f64 {
    let (digits, trials) = cells.into_iter().fold((0, 0), |(d, t), c| (d + c.digits, t + c.trials));
    digits as f64 / (KEY_DIGITS * trials).max(1) as f64
}

/// The accuracy table: one row per length, one column per depth, then the row's mean and the
/// share of its keys' digits given back in place (what a model still learning the task shows),
/// both over the row's cells that were run.
pub fn table(cells: &[NeedleCell], lengths: &[usize], depths: &[u32]) -> String {
    let mut out = format!("{:>8}", "length");
    for depth in depths {
        out += &format!(" {:>5}", format!("{depth}%"));
    }
    out += "   mean  digits\n";
    for &length in lengths {
        let row: Vec<&NeedleCell> = cells.iter().filter(|c| c.length == length).collect();
        out += &format!("{length:>8}");
        // A run stopped early has no cells past where it stopped: they read `-`.
        for &depth in depths {
            match row.iter().find(|c| c.depth == depth) {
                Some(cell) => out += &format!(" {:>5.2}", cell.accuracy()),
                None => out += &format!(" {:>5}", "-"),
            }
        }
        if row.is_empty() {
            out += &format!("   {:>4}  {:>6}\n", "-", "-");
            continue;
        }
        let mean = row.iter().map(|c| c.accuracy()).sum::<f64>() / row.len() as f64;
        out += &format!("   {mean:.2}  {:>5.1}%\n", 100.0 * digit_share(row.iter().copied()));
    }
    out
}

/// The accuracy per length (rows) and depth (columns) as a heat map.
pub fn heat_map(cells: &[NeedleCell], lengths: &[usize], depths: &[u32]) -> HeatMap {
    let accuracy = |length: usize, depth: u32| {
        cells.iter().find(|c| c.length == length && c.depth == depth).map(NeedleCell::accuracy)
    };
    HeatMap {
        title: "Passkey retrieval (% of keys)".to_string(),
        x_label: "needle depth (% of the filler before it)".to_string(),
        y_label: "tokens".to_string(),
        columns: depths.iter().map(|d| format!("{d}%")).collect(),
        rows: lengths.iter().map(|l| l.to_string()).collect(),
        values: lengths.iter().map(|&l| depths.iter().map(|&d| accuracy(l, d)).collect()).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_counts_when_it_starts_with_the_key() {
        let says = |text: &str| answers_with(text, 48213);
        assert!(says(" 48213. Remember"));
        assert!(says("48213"));
        assert!(!says(" 4821"), "a key cut short");
        assert!(!says(" the key 48213"), "the key later in the answer");
        assert!(!says(" 48231"));
    }

    #[test]
    fn digits_count_in_place_after_spaces() {
        assert_eq!(digits_in_place(" 12345.\n", 12345), 5);
        assert_eq!(digits_in_place(" 12945.\n", 12345), 4);
        assert_eq!(digits_in_place(" 23451.\n", 12345), 0, "shifted digits are not in place");
        assert_eq!(digits_in_place(" 12", 12345), 2);
    }

    fn cell(length: usize, depth: u32, trials: usize, correct: usize, digits: usize) -> NeedleCell {
        NeedleCell {
            length,
            depth,
            correct,
            trials,
            keys: vec![10_000; trials],
            answers: vec![String::new(); trials],
            digits,
        }
    }

    #[test]
    fn the_digit_share_counts_every_trial() {
        assert_eq!(digit_share(&[cell(64, 0, 2, 0, 10), cell(64, 0, 2, 0, 0)]), 0.5);
        assert_eq!(digit_share(&[cell(64, 0, 4, 0, 5)]), 0.25);
        assert_eq!(digit_share(&[]), 0.0);
        assert_eq!(cell(64, 0, 2, 0, 3).digit_accuracy(), 0.3);
    }

    #[test]
    fn the_table_gives_each_length_its_keys_and_digits() {
        let cells = [cell(64, 0, 4, 1, 8), cell(64, 100, 4, 3, 16), cell(128, 0, 4, 0, 2), cell(128, 100, 4, 0, 0)];
        let table = table(&cells, &[64, 128], &[0, 100]);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines[0].split_whitespace().collect::<Vec<_>>(), ["length", "0%", "100%", "mean", "digits"]);
        assert_eq!(lines[1].split_whitespace().collect::<Vec<_>>(), ["64", "0.25", "0.75", "0.50", "60.0%"]);
        assert_eq!(lines[2].split_whitespace().collect::<Vec<_>>(), ["128", "0.00", "0.00", "0.00", "5.0%"]);
    }
}
