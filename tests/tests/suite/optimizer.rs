//! The fused optimiser step (`nsa-kernels`' `FusedAdamWBackend`) against Burn's own `AdamW`
//! (`SimpleOptimizer::step`, per tensor) after the global-norm clip and decoupled weight decay
//! done in tensor ops: new weights, both moments and the gradients' norm, over several steps on
//! fresh random parameters and gradients. The kernels run on WGPU (Mesa lavapipe in CI) in f32,
//! directly and through Burn's fusion; the tensor-op default on the f64 CPU backend.

use burn::backend::wgpu::{CubeBackend, WgpuDevice, WgpuRuntime};
use burn::optim::{AdamWConfig, AdamWState, SimpleOptimizer};
use burn::tensor::backend::Backend;
use burn::tensor::{FloatDType, Tensor, TensorData, TensorPrimitive};
use nsa_kernels::{AdamWHyper, AdamWSlot, FusedAdamWBackend};
use nsa_tests::{fresh_rng, max_rel_err, normal, to_vec, B64};
use rand::rngs::StdRng;

type Plain = CubeBackend<WgpuRuntime, f32, i32, u32>;

/// Shapes that take every vector width (4, 2, 1), one large enough that the sum of squares
/// strides over it, and whether each takes weight decay.
const SHAPES: [([usize; 2], bool); 5] =
    [([600, 300], true), ([37, 13], true), ([16, 8], false), ([1, 6], false), ([1, 3], true)];

fn tensor<B: Backend>(values: Vec<f64>, shape: [usize; 2], device: &B::Device) -> Tensor<B, 2> {
    Tensor::from_data(TensorData::new(values, shape), device)
}

fn prim<B: Backend>(t: Tensor<B, 2>) -> burn::tensor::ops::FloatTensor<B> {
    t.into_primitive().tensor()
}

fn wrap<B: Backend>(t: burn::tensor::ops::FloatTensor<B>) -> Tensor<B, 2> {
    Tensor::from_primitive(TensorPrimitive::Float(t))
}

/// Three steps of both on the same parameters and gradients; `max_norm` per step (0: no clip).
fn check<B: FusedAdamWBackend>(rng: &mut StdRng, device: &B::Device, dtype: FloatDType, tolerance: f64, label: &str) {
    let (lr, weight_decay) = (3e-3, 0.1);
    let burn = AdamWConfig::new().with_beta_1(0.9).with_beta_2(0.95).with_epsilon(1e-8).with_weight_decay(0.0).build();
    let mut ours: Vec<(Tensor<B, 2>, Tensor<B, 2>, Tensor<B, 2>)> = Vec::new();
    let mut theirs: Vec<(Tensor<B, 2>, Option<AdamWState<B, 2>>)> = Vec::new();
    for (shape, _) in SHAPES {
        let p = tensor::<B>(normal(rng, shape[0] * shape[1], 0.5), shape, device);
        ours.push((p.clone(), p.zeros_like(), p.zeros_like()));
        theirs.push((p, None));
    }
    // The first steps clip (the gradients' norm is far above 1), the last does not clip at all.
    for (step, max_norm) in [(1, 1.0), (2, 5.0), (3, 0.0)] {
        let grads: Vec<Vec<f64>> = SHAPES.iter().map(|(s, _)| normal(rng, s[0] * s[1], 0.3)).collect();
        let norm = grads.iter().flatten().map(|g| g * g).sum::<f64>().sqrt();
        let factor = if max_norm > 0.0 { (max_norm / (norm + 1e-6)).min(1.0) } else { 1.0 };

        let hyper = AdamWHyper { lr, beta_1: 0.9, beta_2: 0.95, epsilon: 1e-8, weight_decay, max_norm };
        let slots = ours
            .iter()
            .zip(&grads)
            .zip(SHAPES)
            .map(|(((p, m, v), g), (shape, decay))| AdamWSlot {
                param: prim(p.clone()),
                grad: prim(tensor::<B>(g.clone(), shape, device)),
                moment_1: prim(m.clone()),
                moment_2: prim(v.clone()),
                time: step,
                decay,
            })
            .collect();
        let (updates, our_norm) = B::adamw_step(slots, hyper, Some(dtype), device);
        let our_norm = to_vec(Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(our_norm)))[0];
        assert!(((our_norm - norm) / norm).abs() <= tolerance, "{label} step {step}: norm {our_norm} against {norm}");
        ours = updates
            .into_iter()
            .map(|u| {
                let p = wrap::<B>(u.param);
                let copy = to_vec(wrap::<B>(u.compute.expect("a compute copy was asked for")));
                assert!(copy == to_vec(p.clone()), "{label} step {step}: the compute copy is not the weights");
                (p, wrap::<B>(u.moment_1), wrap::<B>(u.moment_2))
            })
            .collect();

        for (i, ((p, state), g)) in theirs.iter_mut().zip(&grads).enumerate() {
            let (shape, decay) = SHAPES[i];
            let g = tensor::<B>(g.clone(), shape, device).mul_scalar(factor);
            let decayed = if decay { p.clone().mul_scalar(1.0 - lr * weight_decay) } else { p.clone() };
            let (new, new_state) = burn.step(lr, decayed, g, state.take());
            (*p, *state) = (new, new_state);
            let momentum = &state.as_ref().unwrap().momentum;
            let (op, om, ov) = &ours[i];
            for (what, x, r) in [
                ("weights", op, p.clone()),
                ("first moment", om, momentum.moment_1.clone()),
                ("second moment", ov, momentum.moment_2.clone()),
            ] {
                let err = max_rel_err(&to_vec(x.clone()), &to_vec(r));
                assert!(err <= tolerance, "{label} step {step}, tensor {i} {shape:?}: {what} differs by {err:e}");
            }
        }
    }
}

#[test]
fn fused_adamw_matches_burns_adamw_after_clip_and_decay() {
    let mut rng = fresh_rng("fused_adamw");
    let wgpu = WgpuDevice::default();
    // The compute copy in the weights' own dtype (lavapipe has no bf16): the copy's write path,
    // held to equal the new weights exactly.
    check::<Plain>(&mut rng, &wgpu, FloatDType::F32, 1e-5, "kernels");
    check::<burn::backend::Wgpu>(&mut rng, &wgpu, FloatDType::F32, 1e-5, "kernels through fusion");
    check::<B64>(&mut rng, &Default::default(), FloatDType::F64, 1e-12, "tensor-op default (f64)");
}
