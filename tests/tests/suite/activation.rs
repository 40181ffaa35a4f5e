//! `nsa_kernels::silu` (its backward recomputes `sigmoid(x)` from the saved input) against
//! Burn's `activation::silu` differentiated through its parts: values and input gradients, in f64
//! on the CPU and f32 on WGPU (through Burn's fusion, as a GPU run calls it). The same for
//! `silu_linear_matmul` (the MLP's down projection, which recomputes `silu(h)` in its backward)
//! against Burn's silu and matmul: values and the gradients of `h` and the weight.

use burn::backend::wgpu::WgpuDevice;
use burn::backend::Autodiff;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{activation, Tensor, TensorData};
use nsa_kernels::{silu, silu_linear_matmul, ActivationBackend};
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

fn check_linear<B: AutodiffBackend + ActivationBackend>(device: &B::Device, tol: f64) {
    let mut rng = fresh_rng("silu linear");
    let ([b, t, k], n) = ([2, 5, 12], 7);
    let h = normal(&mut rng, b * t * k, 2.0);
    let w = normal(&mut rng, k * n, 0.5);
    let seed = normal(&mut rng, b * t * n, 1.0);
    let run = |ours: bool| {
        let h = Tensor::<B, 3>::from_data(TensorData::new(h.clone(), [b, t, k]), device).require_grad();
        let w = Tensor::<B, 2>::from_data(TensorData::new(w.clone(), [k, n]), device).require_grad();
        let y = match ours {
            true => silu_linear_matmul(h.clone(), w.clone()),
            false => activation::silu(h.clone()).matmul(w.clone().unsqueeze()),
        };
        let seed = Tensor::<B, 3>::from_data(TensorData::new(seed.clone(), [b, t, n]), device);
        let grads = (y.clone() * seed).sum().backward();
        let dh = to_vec(h.grad(&grads).expect("h has a gradient"));
        (to_vec(y.inner()), dh, to_vec(w.grad(&grads).expect("w has a gradient")))
    };
    let ((y, dh, dw), (want_y, want_dh, want_dw)) = (run(true), run(false));
    for (name, got, want) in [("values", y, want_y), ("h gradients", dh, want_dh), ("w gradients", dw, want_dw)] {
        let err = max_rel_err(&got, &want);
        assert!(err <= tol, "silu(h) w: {name} differ by {err:e}");
    }
}

#[test]
fn silu_linear_matches_burns_silu_and_matmul_on_cpu_f64() {
    check_linear::<A64>(&Default::default(), 1e-13);
}

#[test]
fn silu_linear_matches_burns_silu_and_matmul_on_wgpu() {
    check_linear::<Autodiff<burn::backend::Wgpu>>(&WgpuDevice::default(), 1e-5);
}
