//! `nsa_kernels::gated_mix` (the kernels of `kernel/mix.rs` on WGPU, through Burn's fusion as a
//! GPU run calls it) against the same sum in tensor ops differentiated by autodiff: the output
//! and the gradients of the three branches and of the gates, on fresh random inputs; on the CPU
//! in f64 too (the backend extension's tensor-op defaults).

use burn::backend::wgpu::WgpuDevice;
use burn::backend::Autodiff;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Tensor, TensorData};
use nsa_kernels::{gated_mix, gated_mix_reference, GatedMixBackend};
use nsa_tests::{fresh_rng, max_rel_err, normal, to_vec, A64};

fn check<B: AutodiffBackend + GatedMixBackend>(device: &B::Device, [b, t, h, d]: [usize; 4], tol: f64) {
    let mut rng = fresh_rng(&format!("gated_mix_{b}_{t}_{h}_{d}"));
    let branches: Vec<Vec<f64>> = (0..3).map(|_| normal(&mut rng, b * t * h * d, 1.0)).collect();
    let gates = normal(&mut rng, b * t * 3 * h, 1.0);
    let seed = normal(&mut rng, b * t * h * d, 1.0);
    let run = |ours: bool| {
        let leaf = |v: &Vec<f64>, shape: [usize; 4]| {
            Tensor::<B, 4>::from_data(TensorData::new(v.clone(), shape), device).require_grad()
        };
        let os = [0, 1, 2].map(|i| leaf(&branches[i], [b, t, h, d]));
        let g = leaf(&gates, [b, t, 3, h]);
        let out = match ours {
            true => gated_mix(os.clone(), g.clone()),
            false => gated_mix_reference(os.clone(), g.clone()),
        };
        let seed = Tensor::<B, 4>::from_data(TensorData::new(seed.clone(), [b, t, h, d]), device);
        let grads = (out.clone() * seed).sum().backward();
        let mut values = vec![to_vec(out.inner())];
        values.extend(os.iter().map(|o| to_vec(o.grad(&grads).expect("a branch has a gradient"))));
        values.push(to_vec(g.grad(&grads).expect("the gates have a gradient")));
        values
    };
    let (ours, want) = (run(true), run(false));
    for (name, (got, want)) in ["output", "d o_cmp", "d o_slc", "d o_win", "d gates"].iter().zip(ours.iter().zip(&want))
    {
        let err = max_rel_err(got, want);
        assert!(err <= tol, "{name} differs by {err:e} at [B, T, H, d] = {:?}", [b, t, h, d]);
    }
}

#[test]
fn gated_mix_matches_tensor_ops_on_cpu_f64() {
    check::<A64>(&Default::default(), [2, 5, 3, 8], 1e-14);
}

#[test]
fn gated_mix_matches_tensor_ops_on_wgpu() {
    let device = WgpuDevice::default();
    // The production head dim, one not divisible by 4 (vectors of 2), and rows that do not
    // fill the backward's last cube.
    for shape in [[2, 37, 3, 64], [1, 9, 5, 6], [3, 7, 2, 17]] {
        check::<Autodiff<burn::backend::Wgpu>>(&device, shape, 1e-6);
    }
}
