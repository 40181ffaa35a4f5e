//! The optimiser step in Burn's tensor ops: what the fused kernels are held to, and what
//! backends without them run. Each value is computed as nsa-train's former path did: the
//! global-norm clip of its gradient utilities, `p * (1 - lr * wd)` for the decay, then Burn's
//! `AdamW` (`burn-optim`'s `adamw.rs`) without its own decay.

use burn::tensor::ops::FloatTensor;
use burn::tensor::{backend::Backend, Device, FloatDType, Shape, Tensor, TensorMetadata, TensorPrimitive};

use super::{AdamWHyper, AdamWSlot, AdamWUpdate};

fn flat<B: Backend>(t: FloatTensor<B>) -> Tensor<B, 1> {
    let n = t.shape().num_elements();
    Tensor::from_primitive(TensorPrimitive::Float(B::float_reshape(t, Shape::new([n]))))
}

fn shaped<B: Backend>(t: Tensor<B, 1>, shape: Shape) -> FloatTensor<B> {
    B::float_reshape(t.into_primitive().tensor(), shape)
}

/// See [`super::FusedAdamWBackend::adamw_step`].
pub fn adamw_step<B: Backend>(
    slots: Vec<AdamWSlot<B>>,
    hyper: AdamWHyper,
    compute: Option<FloatDType>,
    device: &Device<B>,
) -> (Vec<AdamWUpdate<B>>, FloatTensor<B>) {
    let grads: Vec<Tensor<B, 1>> = slots
        .iter()
        .map(|s| {
            let dtype = s.param.dtype();
            flat::<B>(s.grad.clone()).cast(dtype)
        })
        .collect();
    let total = grads.iter().map(|g| g.clone().square().sum()).reduce(|a, b| a + b);
    let norm = total.unwrap_or_else(|| Tensor::zeros([1], device)).sqrt();
    let factor =
        (hyper.max_norm > 0.0).then(|| norm.clone().add_scalar(1e-6).recip().mul_scalar(hyper.max_norm).clamp_max(1.0));
    let updates = slots
        .into_iter()
        .zip(grads)
        .map(|(slot, grad)| {
            let shape = slot.param.shape();
            let s = hyper.scalars(slot.time, slot.decay);
            let grad = match &factor {
                Some(f) => grad * f.clone(),
                None => grad,
            };
            let m = flat::<B>(slot.moment_1).mul_scalar(s.beta_1).add(grad.clone().mul_scalar(s.rest_1));
            let v = flat::<B>(slot.moment_2).mul_scalar(s.beta_2).add(grad.square().mul_scalar(s.rest_2));
            let m_hat = m.clone().div_scalar(s.correction_1);
            let v_hat = v.clone().div_scalar(s.correction_2);
            let delta = m_hat.div(v_hat.sqrt().add_scalar(s.epsilon));
            let param = flat::<B>(slot.param);
            // The learning rate and decay factor in f64, as the tensor-op path passed them.
            let decayed = match slot.decay && hyper.weight_decay > 0.0 {
                true => param.mul_scalar(1.0 - hyper.lr * hyper.weight_decay),
                false => param,
            };
            let param = decayed - delta.mul_scalar(hyper.lr);
            AdamWUpdate {
                compute: compute.map(|dtype| shaped(param.clone().cast(dtype), shape.clone())),
                param: shaped(param, shape.clone()),
                moment_1: shaped(m, shape.clone()),
                moment_2: shaped(v, shape),
            }
        })
        .collect();
    (updates, norm.into_primitive().tensor())
}
