//! A Hugging Face tokenizer trained here on the shipped corpus (nothing downloaded), used for
//! packing and training.

use crate::common;

use nsa_train::config::DataConfig;
use nsa_train::data::tokenizer::Tokenizer;
use nsa_train::splits::load_splits;
use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::processors::PostProcessorWrapper;
use tokenizers::{AddedToken, TokenizerBuilder};

/// Trains a 320-token byte-level BPE on the first 200 kB of the corpus; returns its path.
fn train_bpe(dir: &std::path::Path) -> std::path::PathBuf {
    let corpus = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../data/corpus/kjv.txt")).unwrap();
    let sample = dir.join("sample.txt");
    std::fs::write(&sample, &corpus[..200_000]).unwrap();
    let mut trainer = BpeTrainerBuilder::new()
        .vocab_size(320)
        .min_frequency(2)
        .show_progress(false)
        .special_tokens(vec![AddedToken::from("<|endoftext|>", true)])
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build();
    let mut tokenizer = TokenizerBuilder::<BPE, NormalizerWrapper, ByteLevel, PostProcessorWrapper, ByteLevel>::new()
        .with_model(BPE::default())
        .with_pre_tokenizer(Some(ByteLevel::default().add_prefix_space(false)))
        .with_decoder(Some(ByteLevel::default().add_prefix_space(false)))
        .build()
        .unwrap();
    tokenizer.train_from_files(&mut trainer, vec![sample.display().to_string()]).unwrap();
    let path = dir.join("tokenizer.json");
    tokenizer.save(&path, false).unwrap();
    path
}

#[test]
fn trained_bpe_round_trips_and_packs_training_windows() {
    let dir = common::scratch("bpe");
    let path = train_bpe(&dir);
    let tokenizer = Tokenizer::load(Some(&path)).unwrap();
    assert!(tokenizer.vocab_size() > 256 && tokenizer.vocab_size() <= 320, "{}", tokenizer.vocab_size());
    let text = "And God said, Let there be light: and there was light.";
    let ids = tokenizer.encode(text).unwrap();
    assert!(ids.len() < text.len(), "BPE should merge: {} ids for {} bytes", ids.len(), text.len());
    assert_eq!(tokenizer.decode(&ids), text);
    assert!(!ids.contains(&tokenizer.eod()));
    // A prompt of two documents keeps the end-of-text between them.
    let two = tokenizer.encode_prompt("In the beginning.<|endoftext|>And God said").unwrap();
    assert_eq!(two.iter().filter(|&&id| id == tokenizer.eod()).count(), 1, "{two:?}");

    // Through the run config: packing with it, and the vocabulary check against the model.
    let text_file = dir.join("docs.txt");
    std::fs::write(&text_file, "In the beginning.\n\n\nAnd the earth was without form.\n\n\n".repeat(50)).unwrap();
    let mut cfg = common::tiny_run(&dir.join("run"), 1)
        .with_data(DataConfig::new().with_tokenizer(path.display().to_string()).with_valid_permille(0));
    let small_vocab = load_splits(&cfg, std::slice::from_ref(&text_file)).err().expect("vocab 256 < tokenizer");
    assert!(small_vocab.to_string().contains("model.vocab_size"), "{small_vocab}");
    cfg.model.vocab_size = 320;
    let (train, _, _) = load_splits(&cfg, &[text_file]).unwrap();
    assert!(train.num_windows() > 0);
    assert!(train.window(0).contains(&tokenizer.eod()));
}

#[test]
fn a_tokenizer_file_that_is_not_one_is_a_one_line_error() {
    let dir = common::scratch("bad-tokenizer");
    let path = dir.join("tokenizer.json");
    std::fs::write(&path, "{\"not\": \"a tokenizer\"}").unwrap();
    let err = Tokenizer::load(Some(&path)).err().unwrap().to_string();
    assert!(err.contains("tokenizer.json: not a tokenizer.json") && !err.contains('\n'), "{err}");
}
