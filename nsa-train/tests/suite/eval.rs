//! `nsa eval`'s scores: the mean next-token loss over every window whatever the batch size,
//! perplexity and bits per byte derived from it, and a text too short for a window refused; the
//! needle eval's haystacks and its counts.

use std::ops::ControlFlow;

use burn::backend::Flex;
use burn::tensor::ElementConversion;
use nsa_core::{lm_loss, NsaLm, NsaLmConfig};
use nsa_train::data::batch::batch;
use nsa_train::data::corpus::{PackedSplit, Packing};
use nsa_train::data::tokenizer::Tokenizer;
use nsa_train::evaluate::{evaluate, EvalText};
use nsa_train::needle::{haystack, needle_in_a_haystack, table, NeedleCell, NeedleOptions};

use crate::common;

type Cpu = Flex;

/// A small NSA model on the reference path.
fn model(n_layers: usize, seq_len: usize) -> NsaLm<Cpu> {
    let attention = common::small_attention().with_fused_kernels(false);
    NsaLmConfig::new().with_n_layers(n_layers).with_seq_len(seq_len).with_attention(attention).init(&Default::default())
}

#[test]
fn eval_scores_every_window_once_whatever_the_batch() {
    let dir = common::scratch("eval");
    // Three documents, one with a multi-byte character, for at least seven windows of 33 tokens.
    let docs = ["the quick brown fox jumps over the lazy dog. ".repeat(3), "naïve café ".repeat(8), "z".repeat(50)];
    std::fs::write(dir.join("held-out.txt"), docs.join("\n\n\n")).unwrap();
    let tokenizer = Tokenizer::from_spec("bytes").unwrap();
    let text = EvalText::read(&[dir.join("held-out.txt")], &tokenizer, 32, Packing::Stream, 1).unwrap();
    let windows = text.split.num_windows();
    assert!(windows >= 7, "{windows} windows");
    let model = model(2, 32);
    let device = Default::default();

    // Each window alone, by hand.
    let per_window: Vec<f64> = (0..windows)
        .map(|w| {
            let batch = batch::<Cpu>(&text.split, &[w], &device);
            lm_loss(model.forward(batch.inputs), batch.targets).into_scalar().elem()
        })
        .collect();
    let want = per_window.iter().sum::<f64>() / windows as f64;
    let bytes: usize = docs.iter().map(String::len).sum();
    assert_eq!(text.split.num_tokens(), bytes + docs.len(), "each document's bytes and its end-of-text id");
    for batch_size in [1, 4, windows] {
        let mut calls = Vec::new();
        let got = evaluate(&model, &text, batch_size, None, &device, |done, total, _| calls.push((done, total)));
        assert!((got.loss - want).abs() <= 1e-5 * want, "batch {batch_size}: {} against {want}", got.loss);
        assert_eq!((got.windows, got.tokens), (windows, windows * 32));
        assert!((got.perplexity - want.exp()).abs() <= 1e-4 * want.exp());
        // Bits per byte: the text's bits (as nats) over its bytes, end-of-text ids counted as tokens.
        let tokens_per_byte = text.split.num_tokens() as f64 / bytes as f64;
        let bpb = want / std::f64::consts::LN_2 * tokens_per_byte;
        assert!((got.bits_per_byte - bpb).abs() <= 1e-4 * bpb, "{} against {bpb}", got.bits_per_byte);
        assert_eq!(calls.last(), Some(&(windows, windows)), "progress ends at the total");
        assert_eq!(calls.len(), windows.div_ceil(batch_size));
    }
    let first = evaluate(&model, &text, 2, Some(3), &device, |_, _, _| {});
    let want3 = per_window[..3].iter().sum::<f64>() / 3.0;
    assert_eq!(first.windows, 3);
    assert!((first.loss - want3).abs() <= 1e-5 * want3);

    std::fs::write(dir.join("short.txt"), "too short").unwrap();
    let err = EvalText::read(&[dir.join("short.txt")], &tokenizer, 32, Packing::Stream, 1)
        .err()
        .expect("a short text is refused");
    assert!(err.0.contains("fewer than one window"), "{}", err.0);
}

#[test]
fn the_haystack_hides_the_key_at_its_depth_and_the_needle_eval_counts_keys() {
    let bytes = Tokenizer::from_spec("bytes").unwrap();
    for depth in [0, 50, 100] {
        let ids = haystack(&bytes, 300, depth, 48213).unwrap();
        assert_eq!(ids.len(), 300);
        let text = bytes.decode(&ids);
        let needle = " The pass key is 48213. Remember it. 48213 is the pass key.";
        assert_eq!(text.matches(needle).count(), 1, "{text}");
        assert!(text.ends_with(" What is the pass key? The pass key is"));
        let filler = 300 - needle.len() - " What is the pass key? The pass key is".len();
        assert_eq!(text.find(needle).unwrap(), filler * depth as usize / 100, "depth {depth}");
    }
    assert!(haystack(&bytes, 60, 50, 48213).unwrap_err().contains("no room"));

    let model = model(1, 128);
    let opts = NeedleOptions { lengths: vec![100, 120], depths: vec![0, 100], trials: 2, seed: 3 };
    let mut seen = 0;
    let cells = needle_in_a_haystack(&model, &bytes, &opts, &[], &Default::default(), |cells, kept| {
        seen += 1;
        assert_eq!((cells.len(), kept), (seen, false), "each call has the cells so far");
        ControlFlow::Continue(())
    })
    .unwrap();
    assert_eq!((cells.len(), seen), (4, 4));
    assert!(cells.iter().all(|c| c.trials == 2 && c.correct <= 2 && c.answers.len() == 2 && c.keys.len() == 2));
    assert!(cells.iter().all(|c| c.digits <= 10 && c.digits >= 5 * c.correct), "whole keys count their digits");
    assert_eq!(table(&cells, &opts.lengths, &opts.depths).lines().count(), 3, "a header and a row per length");
    let too_long = NeedleOptions { lengths: vec![125], ..opts };
    let err = needle_in_a_haystack(&model, &bytes, &too_long, &[], &Default::default(), go_on).unwrap_err();
    assert!(err.contains("exceed the model's context of 128 tokens"), "{err}");
}

fn go_on(_: &[NeedleCell], _: bool) -> ControlFlow<()> {
    ControlFlow::Continue(())
}

#[test]
fn a_stopped_needle_run_keeps_its_cells_and_goes_on_from_them() {
    let bytes = Tokenizer::from_spec("bytes").unwrap();
    let model = model(1, 128);
    let opts = NeedleOptions { lengths: vec![100, 120], depths: vec![0, 50, 100], trials: 2, seed: 5 };
    let device = Default::default();
    let whole = needle_in_a_haystack(&model, &bytes, &opts, &[], &device, go_on).unwrap();
    assert_eq!(whole.len(), 6);

    // Stopped after its second cell: the two cells, the same as the whole run's.
    let stop_at_two =
        |cells: &[NeedleCell], _| if cells.len() == 2 { ControlFlow::Break(()) } else { ControlFlow::Continue(()) };
    let stopped = needle_in_a_haystack(&model, &bytes, &opts, &[], &device, stop_at_two).unwrap();
    assert_eq!(stopped, whole[..2]);

    // Going on keeps those cells as they are (a marked answer shows it was not run again) and
    // runs the rest: the whole run's cells.
    let mut kept = stopped.clone();
    kept[1].answers[0] = "kept".to_string();
    let mut kept_flags = Vec::new();
    let resumed = needle_in_a_haystack(&model, &bytes, &opts, &kept, &device, |_, was_kept| {
        kept_flags.push(was_kept);
        ControlFlow::Continue(())
    })
    .unwrap();
    assert_eq!(kept_flags, [true, true, false, false, false, false]);
    assert_eq!(resumed[1].answers[0], "kept");
    assert_eq!(resumed[..1], whole[..1]);
    assert_eq!(resumed[2..], whole[2..]);

    // Cells of another seed hold other keys: none is kept.
    let other = NeedleOptions { seed: 6, ..opts.clone() };
    let mut theirs = needle_in_a_haystack(&model, &bytes, &other, &[], &device, go_on).unwrap();
    theirs.iter_mut().for_each(|c| c.answers[0] = "theirs".to_string());
    let fresh = needle_in_a_haystack(&model, &bytes, &opts, &theirs, &device, go_on).unwrap();
    assert_eq!(fresh, whole);

    // The table of a stopped run marks the cells it did not run.
    let text = table(&stopped, &opts.lengths, &opts.depths);
    let rows: Vec<Vec<&str>> = text.lines().skip(1).map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(rows[0][3], "-", "{text}");
    assert_eq!(rows[1][1..], ["-"; 5], "{text}");
}

/// Checks that window `w` of `split` holds passkey haystacks, each a document starting at a
/// multiple of `align`, ending in its question and answer, with its answer's targets alone
/// scored; gives back each haystack's length and its needle's depth in percent.
fn passkey_haystacks(split: &PackedSplit, w: usize, align: usize) -> Vec<(usize, usize)> {
    use nsa_train::data::passkey;
    let bytes = Tokenizer::from_spec("bytes").unwrap();
    let t = split.seq_len();
    let spans = split.documents().expect("the haystacks are documents");
    let (mut starts, mut targets) = (Vec::new(), vec![0i64; t]);
    spans.mark(w * t, t, &mut starts, &mut targets);
    let bounds: Vec<usize> = (0..t).filter(|&p| starts[p] as usize == p).chain([t]).collect();
    let inputs = split.window(w);
    let mut found = Vec::new();
    for doc in bounds.windows(2) {
        let (a, b) = (doc[0], doc[1]);
        assert_eq!(a % align, 0, "documents start aligned");
        let text = bytes.decode(&inputs[a..b]);
        let key = &text[text.find("The pass key is ").expect("a needle") + 16..][..5];
        assert!(key.bytes().all(|b| b.is_ascii_digit()), "{text:?}");
        assert!(text.ends_with(&format!(" What is the pass key? The pass key is {key}.\n")), "{text:?}");
        // The loss is the answer's alone: the targets scored are its tokens, in order.
        let scored: Vec<usize> = (a..b).filter(|&p| targets[p] >= 0).collect();
        let answer = passkey::answer(key.parse().unwrap());
        assert_eq!(scored, (b - 1 - answer.len()..b - 1).collect::<Vec<_>>(), "{text:?}");
        assert_eq!(bytes.decode(&scored.iter().map(|&p| inputs[p + 1]).collect::<Vec<_>>()), answer);
        found.push((b - a, 100 * text.find("The pass key is").unwrap() / (b - a)));
    }
    found
}

#[test]
fn the_passkey_task_fills_each_window_with_haystacks_and_their_answers() {
    use nsa_train::data::synthetic::{splits, SyntheticTask};
    let (t, align) = (1024, 16);
    let (train, valid) = splits(SyntheticTask::Passkey, t, align, 12, 5);
    assert!(train.num_windows() >= 12 && valid.num_windows() >= 4);
    let (mut lengths, mut depths) = (std::collections::BTreeSet::new(), std::collections::BTreeSet::new());
    for w in 0..train.num_windows() {
        for (length, depth) in passkey_haystacks(&train, w, align) {
            lengths.insert(length);
            depths.insert(depth);
        }
    }
    assert!(lengths.len() > 5 && lengths.first() < Some(&256) && lengths.last() > Some(&512), "{lengths:?}");
    assert!(depths.len() > 5, "the needle moves between haystacks: {depths:?}");

    let mut cfg = common::tiny_run(&common::scratch("passkey"), 1);
    cfg.data.synthetic = "passkey".into();
    let err = cfg.validate().unwrap_err().to_string();
    assert!(err.contains("needs model.seq_len >="), "{err}");
    cfg.model.seq_len = 128;
    cfg.validate().unwrap();
}

/// `passkey_share` mixes the passkey task's windows among a text's training windows in the
/// share asked for, leaving the text's windows and the validation split as they were.
#[test]
fn passkey_share_mixes_retrieval_windows_into_text() {
    use nsa_train::splits::load_splits;
    let dir = common::scratch("passkey-share");
    let text: String = (0..3000).map(|i| format!("Document {i} says the river runs west.\n\n\n")).collect();
    std::fs::write(dir.join("corpus.txt"), text).unwrap();
    let mut cfg = common::tiny_run(&dir, 1);
    let t = 512;
    cfg.model.seq_len = t;
    cfg.data.synthetic = "none".into();
    let align = cfg.model.document_alignment();
    let paths = [dir.join("corpus.txt")];
    let (plain, plain_valid, bytes) = load_splits(&cfg, &paths).unwrap();
    cfg.data.passkey_share = 0.25;
    cfg.validate().unwrap();
    let (mixed, valid, _) = load_splits(&cfg, &paths).unwrap();

    let is_passkey = |w: &[u32]| bytes.decode(&w[..t]).contains(" What is the pass key? The pass key is ");
    let (text_windows, all) = (plain.num_windows(), mixed.num_windows());
    assert!(text_windows > 40, "{text_windows}");
    let keys = (0..all).filter(|&w| is_passkey(mixed.window(w))).count();
    assert_eq!(all - keys, text_windows, "every text window kept");
    assert!((keys as f64 / all as f64 - 0.25).abs() < 0.02, "{keys} of {all}");
    for w in 0..text_windows {
        assert_eq!(mixed.window(w)[..t], plain.window(w)[..t], "text window {w}");
    }
    // The passkey windows are the task's: several haystacks each, the answers alone scored.
    let haystacks: usize = (text_windows..all).map(|w| passkey_haystacks(&mixed, w, align).len()).sum();
    assert!(2 * haystacks > 3 * keys, "{haystacks} haystacks in {keys} windows");
    assert_eq!(valid.num_tokens(), plain_valid.num_tokens(), "validation stays text");

    for (share, synthetic, seq_len, needle) in
        [(1.0, "none", 128, "below 1"), (0.2, "copy", 128, "not into"), (0.2, "none", 64, "needs model.seq_len")]
    {
        cfg.data.passkey_share = share;
        cfg.data.synthetic = synthetic.into();
        cfg.model.seq_len = seq_len;
        let err = cfg.validate().unwrap_err().to_string();
        assert!(err.contains("data.passkey_share") && err.contains(needle), "{err}");
    }
}
