//! Mixed precision: master weights in a wide dtype, the forward in a narrower one.
//!
//! CI has no bf16 device, so the mechanism is checked one level up: f64 master weights with an
//! f32 forward on the CPU backend. The CPU backend refuses binary ops on mismatched dtypes, so any
//! tensor the forward creates in the default dtype instead of the compute dtype fails here; the
//! same leak on CUDA would silently read bf16 bits as f32.

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{activation, DType, FloatDType, Int, Tensor, TensorData};
use nsa_core::{cast_params, AttentionKind, MlpKind, NsaLm, NsaLmConfig};
use nsa_tests::{fresh_rng, max_rel_err, small_config, to_vec, A64};
use rand::Rng;

fn config(attention: AttentionKind) -> NsaLmConfig {
    NsaLmConfig::new()
        .with_vocab_size(64)
        .with_n_layers(2)
        .with_seq_len(40)
        .with_mlp(MlpKind::Swiglu)
        .with_attention(small_config().with_dim(32).with_n(3).with_w(12).with_attention(attention))
}

fn loss(model: &NsaLm<A64>, tokens: Tensor<A64, 2, Int>, targets: Tensor<A64, 2, Int>) -> Tensor<A64, 1> {
    let logits = model.forward(tokens).cast(DType::F64);
    let [b, t, v] = logits.dims();
    activation::log_softmax(logits.reshape([b * t, v]), 1).gather(1, targets.reshape([b * t, 1])).mean().neg()
}

/// Every parameter's gradient, in visiting order, with its dtype.
struct Grads<'a> {
    grads: &'a <A64 as AutodiffBackend>::Gradients,
    out: Vec<(DType, Vec<f64>)>,
}

impl ModuleVisitor<A64> for Grads<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<A64, D>>) {
        let grad = param.val().grad(self.grads).expect("every parameter has a gradient");
        self.out.push((grad.dtype(), to_vec(grad)));
    }
}

fn gradients(model: &NsaLm<A64>, loss: Tensor<A64, 1>) -> Vec<(DType, Vec<f64>)> {
    let grads = loss.backward();
    let mut visitor = Grads { grads: &grads, out: Vec::new() };
    model.visit(&mut visitor);
    visitor.out
}

fn check(name: &str, attention: AttentionKind) {
    let cfg = config(attention);
    let device = Default::default();
    let mut rng = fresh_rng(name);
    let master: NsaLm<A64> = cfg.init(&device);
    let (b, t) = (2, cfg.seq_len);
    let ids = |rng: &mut rand::rngs::StdRng| -> Tensor<A64, 2, Int> {
        let v: Vec<i64> = (0..b * t).map(|_| rng.random_range(0..cfg.vocab_size as i64)).collect();
        Tensor::from_data(TensorData::new(v, [b, t]), &device)
    };
    let (tokens, targets) = (ids(&mut rng), ids(&mut rng));

    let wide = loss(&master, tokens.clone(), targets.clone());
    let wide_value = to_vec(wide.clone())[0];
    let wide_grads = gradients(&master, wide);

    let narrow = loss(&cast_params(master.clone(), FloatDType::F32), tokens, targets);
    let narrow_value = to_vec(narrow.clone())[0];
    let narrow_grads = gradients(&master, narrow);

    assert!(
        (narrow_value - wide_value).abs() <= 1e-5 * wide_value.abs(),
        "{name}: loss {narrow_value} vs {wide_value}"
    );
    assert_eq!(narrow_grads.len(), wide_grads.len());
    for (i, ((dtype, g), (_, reference))) in narrow_grads.iter().zip(&wide_grads).enumerate() {
        assert_eq!(*dtype, DType::F64, "{name}: gradient {i} must arrive in the master dtype");
        let err = max_rel_err(g, reference);
        assert!(err < 1e-4, "{name}: gradient {i} differs from the f64 one by {err:.2e}");
    }
}

#[test]
fn an_f32_forward_on_f64_master_weights_matches_the_f64_model() {
    check("nsa", AttentionKind::Nsa);
    check("dense", AttentionKind::Dense);
}
