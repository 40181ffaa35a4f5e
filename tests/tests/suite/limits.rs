//! Limits where NSA must reduce to dense causal attention.

use burn::module::Param;
use burn::tensor::Tensor;
use nsa_core::attention::DenseAttention;
use nsa_core::{Branch, NsaAttention, NsaAttentionConfig, NsaConfig};
use nsa_tests::{fresh_rng, max_rel_err, random_input, randomized, to_vec, B64};

/// Gates at sigmoid(+-60): the chosen branch gets 1 - 1e-26, the others 1e-26.
fn force_gate(mut layer: NsaAttention<B64>, branch: Branch) -> NsaAttention<B64> {
    let h = layer.config.n_heads;
    let bias: Vec<f64> = (0..3 * h).map(|i| if i / h == branch as usize { 60.0 } else { -60.0 }).collect();
    let device = layer.gate.weight.device();
    layer.gate.weight = Param::from_tensor(layer.gate.weight.val().zeros_like());
    layer.gate.bias = Some(Param::from_tensor(Tensor::from_floats(bias.as_slice(), &device)));
    layer
}

/// Dense attention with the layer's query, output and the given branch's K/V.
fn dense_twin(layer: &NsaAttention<B64>, branch: Branch) -> DenseAttention<B64> {
    DenseAttention {
        query: layer.query.clone(),
        kv: layer.kv[branch as usize].clone(),
        output: layer.output.clone(),
        rope: layer.rope.clone(),
        config: layer.config.clone(),
    }
}

fn assert_equals_dense(name: &str, cfg: NsaConfig, t: usize, branch: Branch) {
    cfg.validate().unwrap();
    let device = Default::default();
    let mut rng = fresh_rng(name);
    let layer =
        force_gate(randomized(NsaAttentionConfig::new(cfg.clone(), t).init::<B64>(&device), &mut rng, 0.4), branch);
    let (x, _) = random_input::<B64>(&mut rng, 2, t, cfg.dim, &device);
    let nsa = to_vec(layer.forward(x.clone()));
    let dense = to_vec(dense_twin(&layer, branch).forward(x, None));
    let err = max_rel_err(&nsa, &dense);
    assert!(err <= 1e-9, "{name}: NSA differs from dense causal attention by {err:e}");
}

fn base() -> NsaConfig {
    NsaConfig::new()
        .with_dim(24)
        .with_n_heads(6)
        .with_n_kv_heads(2)
        .with_d_k(8)
        .with_d_v(6)
        .with_l(8)
        .with_d(4)
        .with_l_sel(8)
}

#[test]
fn window_covering_the_sequence_equals_dense_causal() {
    assert_equals_dense("window_limit", base().with_n(3).with_w(64), 53, Branch::Window);
}

#[test]
fn selection_covering_the_sequence_equals_dense_causal() {
    // n * l_sel = 7 * 8 = 56 >= 53: every block is selected for every query.
    assert_equals_dense("selection_limit", base().with_n(7).with_w(4), 53, Branch::Selected);
}
