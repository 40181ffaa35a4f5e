//! `nsa_kernels::rms_norm` (the kernels of `kernel/rms_norm.rs` on WGPU, through Burn's fusion
//! as a GPU run calls it) against Burn's `RmsNorm` module differentiated by autodiff: the output
//! and the gradients of the input and the gain, on fresh random inputs; on the CPU in f64 too
//! (the backend extension's tensor-op defaults).

use burn::backend::wgpu::WgpuDevice;
use burn::backend::Autodiff;
use burn::module::Param;
use burn::nn::RmsNormConfig;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Tensor, TensorData};
use nsa_kernels::{rms_norm, RmsNormBackend};
use nsa_tests::{fresh_rng, max_rel_err, normal, to_vec, A64};

fn check<B: AutodiffBackend + RmsNormBackend>(device: &B::Device, [b, t, d]: [usize; 3], tol: f64) {
    let mut rng = fresh_rng(&format!("rms_norm_{b}_{t}_{d}"));
    let x = normal(&mut rng, b * t * d, 2.0);
    let gamma = normal(&mut rng, d, 1.0);
    let seed = normal(&mut rng, b * t * d, 1.0);
    let run = |ours: bool| {
        let x = Tensor::<B, 3>::from_data(TensorData::new(x.clone(), [b, t, d]), device).require_grad();
        let mut layer = RmsNormConfig::new(d).with_epsilon(1e-5).init::<B>(device);
        layer.gamma = Param::from_tensor(Tensor::from_data(TensorData::new(gamma.clone(), [d]), device));
        let y = match ours {
            true => rms_norm(x.clone(), layer.gamma.val(), layer.epsilon),
            false => layer.forward(x.clone()),
        };
        let seed = Tensor::<B, 3>::from_data(TensorData::new(seed.clone(), [b, t, d]), device);
        let grads = (y.clone() * seed).sum().backward();
        let grad_gamma = layer.gamma.val().grad(&grads).expect("the gain has a gradient");
        [to_vec(y.inner()), to_vec(x.grad(&grads).expect("x has a gradient")), to_vec(grad_gamma)]
    };
    let (ours, want) = (run(true), run(false));
    for (name, (got, want)) in ["output", "dx", "dgamma"].iter().zip(ours.iter().zip(&want)) {
        let err = max_rel_err(got, want);
        assert!(err <= tol, "{name} differs by {err:e} at [B, T, d] = {:?}", [b, t, d]);
    }
}

#[test]
fn rms_norm_matches_burns_module_on_cpu_f64() {
    // Burn's module takes the mean square in f32 whatever the input's dtype; ours keeps f64.
    check::<A64>(&Default::default(), [2, 5, 12], 1e-6);
}

#[test]
fn rms_norm_matches_burns_module_on_wgpu() {
    let device = WgpuDevice::default();
    // The production width over more rows than one backward cube serves, an odd width (one
    // element per vector), and a width wider than the units of a row.
    for shape in [[2, 300, 768], [3, 7, 45], [1, 5, 200]] {
        check::<Autodiff<burn::backend::Wgpu>>(&device, shape, 1e-5);
    }
}
