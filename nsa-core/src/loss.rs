//! The language-modelling loss every training path uses.

use burn::tensor::backend::Backend;
use burn::tensor::{activation, DType, Int, Tensor};

/// Mean next-token cross-entropy of logits `[B, T, V]` against targets `[B, T]`, computed in f32
/// whatever the storage dtype. Negative targets are ignored (packed documents' padding and the
/// positions whose next token is another document's): the mean is over the other positions.
pub fn lm_loss<B: Backend>(logits: Tensor<B, 3>, targets: Tensor<B, 2, Int>) -> Tensor<B, 1> {
    let [b, t, v] = logits.dims();
    let logits = logits.reshape([b * t, v]);
    let logits = if matches!(logits.dtype(), DType::F16 | DType::BF16) { logits.cast(DType::F32) } else { logits };
    let targets = targets.reshape([b * t, 1]);
    let kept = targets.clone().greater_equal_elem(0).float().cast(logits.dtype());
    let picked = activation::log_softmax(logits, 1).gather(1, targets.clamp_min(0));
    (picked * kept.clone()).sum().div(kept.sum().clamp_min(1.0)).neg()
}
