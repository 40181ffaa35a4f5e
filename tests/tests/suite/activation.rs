//! `nsa_kernels::silu` (its backward recomputes `sigmoid(x)` from the saved input) against
//! Burn's `activation::silu` differentiated through its parts: values and input gradients, in f64
//! on the CPU and f32 on WGPU (through Burn's fusion, as a GPU run calls it).

use burn::backend::wgpu::WgpuDevice;
use burn::backend::Autodiff;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{activation, Tensor, TensorData};
use nsa_kernels::{silu, ActivationBackend};
use nsa_tests::{fresh_rng, max_rel_err, normal, to_vec, A64};

fn check<B: AutodiffBackend + ActivationBackend>(device: &B::Device, tol: f64) {
    let mut rng = fresh_rng("silu");
    let shape = [3, 5, 7];
    let x = normal(&mut rng, 105, 3.0);
    let seed = normal(&mut rng, 105, 1.0);
    let run = |ours: bool| {
        let x = Tensor::<B, 3>::from_data(TensorData::new(x.clone(), shape), device).require_grad();
        let y = if ours { silu(x.clone()) } else { activation::silu(x.clone()) };
        let seed = Tensor::<B, 3>::from_data(TensorData::new(seed.clone(), shape), device);
        let grads = (y.clone() * seed).sum().backward();
        (to_vec(y.inner()), to_vec(x.grad(&grads).expect("x has a gradient")))
    };
    let ((y, dx), (want_y, want_dx)) = (run(true), run(false));
    assert!(max_rel_err(&y, &want_y) <= tol, "silu values differ");
    let err = max_rel_err(&dx, &want_dx);
    assert!(err <= tol, "silu input gradients differ by {err:e}");
}

#[test]
fn silu_matches_burns_silu_on_cpu_f64() {
    check::<A64>(&Default::default(), 1e-14);
}

#[test]
fn silu_matches_burns_silu_on_wgpu() {
    check::<Autodiff<burn::backend::Wgpu>>(&WgpuDevice::default(), 1e-6);
}
