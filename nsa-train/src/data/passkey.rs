//! The passkey task's text (Mohtashami and Jaggi, 2023): filler, a five-digit key hidden in it,
//! the question at the end. `nsa eval needle` asks it; `synthetic = "passkey"` trains on it.

use rand::Rng;

use super::tokenizer::Tokenizer;

/// What the haystack repeats.
const FILLER: &str = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. ";
const QUESTION: &str = " What is the pass key? The pass key is";

fn needle(key: u32) -> String {
    format!(" The pass key is {key}. Remember it. {key} is the pass key.")
}

/// The answer that follows a haystack in training: the key, a full stop and a newline (eight
/// bytes for a five-digit key).
pub fn answer(key: u32) -> String {
    format!(" {key}.\n")
}

/// One haystack's tokens: `length` in all, filler with the needle at `depth` percent of it, then
/// the question.
pub fn haystack(tokenizer: &Tokenizer, length: usize, depth: u32, key: u32) -> Result<Vec<u32>, String> {
    let encode = |text: &str| tokenizer.encode(text).map_err(|e| e.to_string());
    let (needle, question) = (encode(&needle(key))?, encode(QUESTION)?);
    let least = needle.len() + question.len() + 1;
    if length < least {
        return Err(format!(
            "a haystack of {length} tokens has no room for filler around the needle and the question: \
             give lengths of at least {least}"
        ));
    }
    let room = length - (least - 1);
    let unit = encode(FILLER)?;
    let filler: Vec<u32> = unit.iter().copied().cycle().take(room).collect();
    let at = room * depth.min(100) as usize / 100;
    Ok([&filler[..at], &needle, &filler[at..], &question].concat())
}

/// A haystack followed by its answer, and where the answer starts.
pub struct Example {
    pub tokens: Vec<u32>,
    /// The index of the answer's first token: the tokens before it are the question.
    pub answer_at: usize,
}

/// A haystack with a random key at a random depth and its answer, `length` tokens in all.
fn example(tokenizer: &Tokenizer, length: usize, rng: &mut impl Rng) -> Result<Example, String> {
    let key = rng.random_range(10_000..100_000);
    let reply = tokenizer.encode(&answer(key)).map_err(|e| e.to_string())?;
    let room = length.saturating_sub(reply.len());
    let mut tokens = haystack(tokenizer, room, rng.random_range(0..=100), key)?;
    let answer_at = tokens.len();
    tokens.extend(reply);
    Ok(Example { tokens, answer_at })
}

/// One training window of the task as documents that fill its `length` tokens: haystacks of
/// lengths drawn log-uniformly from the shortest to all that is left, each with its answer, so a
/// window teaches several keys and every distance up to the window. Each document but the last
/// is a multiple of `align` long, so each starts where packed documents may.
pub fn documents(
    tokenizer: &Tokenizer,
    length: usize,
    align: usize,
    rng: &mut impl Rng,
) -> Result<Vec<Example>, String> {
    let shortest = shortest_window().next_multiple_of(align);
    let mut docs = Vec::new();
    let mut left = length;
    while left > 0 {
        let take = match left < 2 * shortest {
            true => left,
            false => {
                let drawn = (shortest as f64 * (left as f64 / shortest as f64).powf(rng.random::<f64>())) as usize;
                let drawn = (drawn / align * align).max(shortest);
                // What is left after this one must hold a haystack too.
                if left - drawn < shortest {
                    left
                } else {
                    drawn
                }
            }
        };
        docs.push(example(tokenizer, take, rng)?);
        left -= take;
    }
    Ok(docs)
}

/// `count` windows of the task, each [`documents`], their examples in order.
pub fn filled_windows(
    tokenizer: &Tokenizer,
    length: usize,
    align: usize,
    count: usize,
    rng: &mut impl Rng,
) -> Result<Vec<Example>, String> {
    let mut examples = Vec::new();
    for _ in 0..count {
        examples.extend(documents(tokenizer, length, align, rng)?);
    }
    Ok(examples)
}

/// The shortest haystack with filler around the needle, in bytes.
pub fn shortest_haystack() -> usize {
    needle(10_000).len() + QUESTION.len() + 1
}

/// The shortest haystack and its answer, in bytes.
pub fn shortest_window() -> usize {
    shortest_haystack() + answer(10_000).len()
}
