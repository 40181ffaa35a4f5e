//! The whole model: causality, shapes, both attention kinds and both MLPs.

use burn::tensor::{Int, Tensor, TensorData};
use nsa_core::{AttentionKind, MlpKind, NsaLm, NsaLmConfig};
use nsa_tests::{fresh_rng, small_config, to_vec, B64};
use rand::Rng;

fn tiny(attention: AttentionKind, mlp: MlpKind) -> NsaLmConfig {
    NsaLmConfig::new()
        .with_vocab_size(64)
        .with_n_layers(2)
        .with_seq_len(48)
        .with_mlp(mlp)
        .with_attention(small_config().with_dim(32).with_n(3).with_w(12).with_attention(attention))
}

/// Changing tokens after position `t` never changes logits at positions `<= t`.
fn assert_causal(name: &str, cfg: NsaLmConfig) {
    cfg.validate().unwrap();
    let device = Default::default();
    let mut rng = fresh_rng(name);
    let model: NsaLm<B64> = cfg.init(&device);
    let (b, t) = (2, cfg.seq_len);
    let tokens: Vec<i64> = (0..b * t).map(|_| rng.random_range(0..cfg.vocab_size as i64)).collect();
    let logits = |tokens: &[i64]| {
        let input = Tensor::<B64, 2, Int>::from_data(TensorData::new(tokens.to_vec(), [b, t]), &device);
        let out = model.forward(input);
        assert_eq!(out.dims(), [b, t, cfg.vocab_size]);
        to_vec(out)
    };
    let before = logits(&tokens);
    for cut in [0, 7, 8, 23, t - 2] {
        let mut changed = tokens.clone();
        for s in 0..b {
            for p in cut + 1..t {
                changed[s * t + p] = (changed[s * t + p] + 1 + rng.random_range(0..5)) % cfg.vocab_size as i64;
            }
        }
        let after = logits(&changed);
        let v = cfg.vocab_size;
        for s in 0..b {
            let prefix = |l: &[f64]| l[s * t * v..(s * t + cut + 1) * v].to_vec();
            assert_eq!(prefix(&before), prefix(&after), "{name}: logits up to position {cut} changed");
            let suffix = |l: &[f64]| l[(s * t + cut + 1) * v..(s + 1) * t * v].to_vec();
            assert_ne!(suffix(&before), suffix(&after), "{name}: later logits should react to new tokens");
        }
    }
}

#[test]
fn nsa_model_is_causal() {
    assert_causal("nsa_causal", tiny(AttentionKind::Nsa, MlpKind::Silu));
}

#[test]
fn dense_model_is_causal() {
    assert_causal("dense_causal", tiny(AttentionKind::Dense, MlpKind::Silu));
}

#[test]
fn swiglu_model_is_causal() {
    assert_causal("swiglu_causal", tiny(AttentionKind::Nsa, MlpKind::Swiglu));
}

#[test]
fn initial_loss_is_near_uniform() {
    // Scaled init: the untrained model predicts close to uniform, cross-entropy ~ ln(vocab).
    let cfg = tiny(AttentionKind::Nsa, MlpKind::Silu);
    let device = Default::default();
    let model: NsaLm<B64> = cfg.init(&device);
    let tokens = Tensor::<B64, 2, Int>::from_data(
        TensorData::new((0..48i64).map(|i| (i * 7) % 64).collect::<Vec<_>>(), [1, 48]),
        &device,
    );
    let logits = model.forward(tokens.clone()).reshape([48, 64]);
    let ce = burn::nn::loss::CrossEntropyLossConfig::new().init(&device).forward(logits, tokens.reshape([48]));
    let ce = to_vec(ce)[0];
    assert!((ce - (64f64).ln()).abs() < 0.1, "initial loss {ce} far from ln(64)");
}
