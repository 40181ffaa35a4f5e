//! The one-hot embedding product (`nsa_core::model::embed`, small vocabularies) computes exactly
//! what Burn's gather does: the same rows forward, the same table gradient backward.

use burn::nn::EmbeddingConfig;
use burn::tensor::{Int, Tensor, TensorData};
use nsa_core::model::{embed, ONE_HOT_VOCAB};
use nsa_tests::{fresh_rng, max_rel_err, normal, randomized, to_vec, A64};
use rand::Rng;

#[test]
fn one_hot_embedding_equals_the_gather() {
    let device = Default::default();
    let mut rng = fresh_rng("one_hot_embedding_equals_the_gather");
    let (vocab, dim, b, t) = (ONE_HOT_VOCAB.min(300), 12, 3, 17);
    let embedding = randomized(EmbeddingConfig::new(vocab, dim).init::<A64>(&device), &mut rng, 1.0);
    let ids: Vec<i64> = (0..b * t).map(|_| rng.random_range(0..vocab as i64)).collect();
    let tokens = Tensor::<A64, 2, Int>::from_data(TensorData::new(ids, [b, t]), &device);
    let seed = Tensor::<A64, 3>::from_data(TensorData::new(normal(&mut rng, b * t * dim, 1.0), [b, t, dim]), &device);
    let run = |one_hot: bool| {
        let out = match one_hot {
            true => embed(&embedding, tokens.clone()),
            false => embedding.forward(tokens.clone()),
        };
        let grads = (out.clone() * seed.clone()).sum().backward();
        let grad = embedding.weight.val().grad(&grads).expect("the table has a gradient");
        (to_vec(out.inner()), to_vec(grad))
    };
    let ((out, grad), (want_out, want_grad)) = (run(true), run(false));
    assert_eq!(max_rel_err(&out, &want_out), 0.0, "rows differ");
    let err = max_rel_err(&grad, &want_grad);
    assert!(err <= 1e-14, "table gradients differ by {err:e}");
}
