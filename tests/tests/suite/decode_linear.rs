//! A decode step's linear layer with its input function and residual add
//! (`nsa_kernels::decode_linear`: `residual + f(x) w`, `f` nothing, RMSNorm, SiLU or the
//! attention branches' gated mix) against
//! float64 loops on fresh random inputs: the kernel on WGPU (Mesa lavapipe in CI, f32, through
//! Burn's fusion as generation runs it) to 1e-5, and the tensor ops that back every other
//! backend on the CPU in f64 to 1e-9.
//!
//! Shapes cover a cube's rows (one, several, more rows than a cube serves), every vector width
//! (widths of 36, 6 and 7 columns), columns past the last full cube and a `k` of several chunks.

use burn::tensor::{Tensor, TensorData};
use nsa_kernels::{decode_linear, DecodeAttentionBackend, StepInput};
use nsa_tests::{fresh_rng, max_rel_err, normal, to_vec, B64};

const EPSILON: f64 = 1e-5;

#[derive(Clone, Copy, Debug)]
enum Input {
    Plain,
    Norm,
    Silu,
    /// The gated mix of three branches of this many heads, `x` the first branch.
    Mix(usize),
}

/// The input function's tensors: the norm's gain `[k]`, the mix's other branches `[m, k]` and
/// gates `[m, 3, heads]`.
struct Extra {
    gamma: Vec<f64>,
    selected: Vec<f64>,
    window: Vec<f64>,
    gates: Vec<f64>,
}

/// `residual + f(x) w` in f64 loops.
fn expected(
    x: &[f64],
    w: &[f64],
    extra: &Extra,
    residual: Option<&[f64]>,
    input: Input,
    [m, k, n]: [usize; 3],
) -> Vec<f64> {
    let mut out = Vec::with_capacity(m * n);
    for (r, row) in x.chunks(k).enumerate() {
        let scale = 1.0 / (row.iter().map(|v| v * v).sum::<f64>() / k as f64 + EPSILON).sqrt();
        let a: Vec<f64> = match input {
            Input::Plain => row.to_vec(),
            Input::Norm => row.iter().zip(&extra.gamma).map(|(v, g)| v * scale * g).collect(),
            Input::Silu => row.iter().map(|v| v / (1.0 + (-v).exp())).collect(),
            Input::Mix(heads) => (0..k)
                .map(|i| {
                    let gate = |branch: usize| extra.gates[(r * 3 + branch) * heads + i / (k / heads)];
                    let at = r * k + i;
                    row[i] * gate(0) + extra.selected[at] * gate(1) + extra.window[at] * gate(2)
                })
                .collect(),
        };
        out.extend((0..n).map(|j| (0..k).map(|i| a[i] * w[i * n + j]).sum::<f64>()));
    }
    if let Some(residual) = residual {
        out.iter_mut().zip(residual).for_each(|(o, r)| *o += r);
    }
    out
}

fn check<B: DecodeAttentionBackend>(
    device: &B::Device,
    input: Input,
    with_residual: bool,
    [m, k, n]: [usize; 3],
    tol: f64,
) {
    let mut rng = fresh_rng(&format!("decode_linear_{input:?}_{with_residual}_{m}_{k}_{n}"));
    let (x, w) = (normal(&mut rng, m * k, 1.5), normal(&mut rng, k * n, 0.2));
    let residual = normal(&mut rng, m * n, 1.0);
    let heads = match input {
        Input::Mix(heads) => heads,
        _ => 1,
    };
    let extra = Extra {
        gamma: normal(&mut rng, k, 1.0),
        selected: normal(&mut rng, m * k, 1.5),
        window: normal(&mut rng, m * k, 1.5),
        gates: normal(&mut rng, m * 3 * heads, 1.0),
    };
    let tensor =
        |data: &[f64], shape: [usize; 2]| Tensor::<B, 2>::from_data(TensorData::new(data.to_vec(), shape), device);
    let flat = |data: &[f64]| Tensor::<B, 1>::from_data(TensorData::new(data.to_vec(), [data.len()]), device);
    let step_input = match input {
        Input::Plain => StepInput::Plain,
        Input::Norm => StepInput::Norm(flat(&extra.gamma), EPSILON),
        Input::Silu => StepInput::Silu,
        Input::Mix(_) => {
            StepInput::Mix { selected: flat(&extra.selected), window: flat(&extra.window), gates: flat(&extra.gates) }
        }
    };
    // Laid side by side as a decode step's projection weight is (rows a backend may pad).
    let weight = tensor(&w, [k, n]);
    let weight = Tensor::cat(vec![weight.clone().narrow(1, 0, n / 2), weight.narrow(1, n / 2, n - n / 2)], 1);
    let got = decode_linear(tensor(&x, [m, k]), step_input, weight, with_residual.then(|| tensor(&residual, [m, n])));
    let want = expected(&x, &w, &extra, with_residual.then_some(&residual[..]), input, [m, k, n]);
    let err = max_rel_err(&to_vec(got), &want);
    assert!(err <= tol, "{input:?} (residual: {with_residual}) at [m, k, n] = {:?} differs by {err:e}", [m, k, n]);
}

/// `silu_tol` for the SiLU case, `tol` for the others.
fn cases<B: DecodeAttentionBackend>(device: &B::Device, tol: f64, silu_tol: f64) {
    check::<B>(device, Input::Norm, false, [3, 70, 36], tol);
    check::<B>(device, Input::Silu, true, [11, 300, 36], silu_tol);
    check::<B>(device, Input::Plain, true, [1, 64, 6], tol);
    check::<B>(device, Input::Norm, true, [2, 40, 7], tol);
    // Past one chunk of `k` (a slice reads at most 8 of a chunk's 512).
    check::<B>(device, Input::Norm, true, [6, 1100, 20], tol);
    // The attention branches' gated mix: heads of 16 and of 3 columns.
    check::<B>(device, Input::Mix(4), true, [5, 64, 36], tol);
    check::<B>(device, Input::Mix(7), true, [2, 21, 8], tol);
}

#[test]
fn decode_linear_matches_loops_on_cpu_f64() {
    // Burn's sigmoid, which the tensor ops' SiLU calls, computes in f32 whatever the dtype.
    cases::<B64>(&Default::default(), 1e-9, 1e-6);
}

#[test]
fn decode_linear_matches_loops_on_wgpu() {
    cases::<burn::backend::Wgpu>(&burn::backend::wgpu::WgpuDevice::default(), 1e-5, 1e-5);
}
