//! The linear layers' product (`GemmBackend::gemm`, cuBLASLt on CUDA) through autodiff: output
//! and both gradients equal Burn's matmul of the transposed operands, for every transpose pair,
//! in float64.

use burn::tensor::{Tensor, TensorPrimitive};
use nsa_kernels::GemmBackend;
use nsa_tests::{fresh_rng, max_rel_err, random_input, to_vec, A64};

#[test]
fn gemm_and_its_gradients_match_burns_matmul_for_every_transpose() {
    let device = Default::default();
    let mut rng = fresh_rng("gemm");
    let (m, k, n) = (7, 5, 6);
    for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
        let a = random_input::<A64>(&mut rng, 1, if ta { k } else { m }, if ta { m } else { k }, &device).0;
        let b = random_input::<A64>(&mut rng, 1, if tb { n } else { k }, if tb { k } else { n }, &device).0;
        let (a, b): (Tensor<A64, 2>, Tensor<A64, 2>) = (a.squeeze_dim(0), b.squeeze_dim(0));
        let seed: Tensor<A64, 2> = random_input::<A64>(&mut rng, 1, m, n, &device).0.squeeze_dim(0);
        let run = |ours: bool| {
            let (a, b) = (a.clone().require_grad(), b.clone().require_grad());
            let c = match ours {
                true => {
                    let (pa, pb) = (a.clone().into_primitive().tensor(), b.clone().into_primitive().tensor());
                    Tensor::<A64, 2>::from_primitive(TensorPrimitive::Float(A64::gemm(pa, pb, ta, tb)))
                }
                false => {
                    let a = if ta { a.clone().transpose() } else { a.clone() };
                    let b = if tb { b.clone().transpose() } else { b.clone() };
                    a.matmul(b)
                }
            };
            let grads = (c.clone() * seed.clone()).sum().backward();
            [to_vec(c.inner()), to_vec(a.grad(&grads).unwrap()), to_vec(b.grad(&grads).unwrap())]
        };
        let (ours, reference) = (run(true), run(false));
        for (what, (x, r)) in ["output", "grad a", "grad b"].iter().zip(ours.iter().zip(&reference)) {
            let err = max_rel_err(x, r);
            assert!(err <= 1e-12, "transposes ({ta}, {tb}): {what} differs by {err:e}");
        }
    }
}
