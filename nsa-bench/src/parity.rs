//! `nsa-bench kernels`' parity check: the op's output and gradients on every branch
//! ([`BRANCHES`]: the three key sets, then the window and the compressed branch on packed
//! documents), and every plan of the window, the selection and the packed window, against the
//! reference path (f64 on the CPU where built with the `cpu` feature).

use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{DType, Int, Tensor, TensorData};
use nsa_kernels::sparse::reference;
use nsa_kernels::{sparse_attention, Documents, Keys};
use nsa_train::measure::rel_err;
use nsa_train::TrainBackend;
use rand::rngs::StdRng;
use serde::Serialize;

use crate::kernels::{
    compressed_keys, forward_backward, host, inputs, random_blocks, BenchOptions, Inputs, KernelReport, Seed, Shape,
    D_CMP, L_CMP, L_SEL, N, W,
};
use crate::plans::{PlanCase, PlanCheck};

/// The parity check's branches, in the order of [`key_sets`]: the three key sets, then the
/// window and the compressed branch on packed documents.
const BRANCHES: [&str; 5] = ["window", "selected", "compressed", "window, documents", "compressed, documents"];

/// Packed documents start on multiples of this (`lcm(D_CMP, L_SEL)`, as a model's would).
const DOCUMENT_ALIGN: usize = 64;

/// Whether branch `i` of [`BRANCHES`] runs on the compressed inputs ([`Inputs::compressed`]).
fn on_compressed(i: usize) -> bool {
    BRANCHES[i].starts_with("compressed")
}

/// [`BRANCHES`]' key sets on `R`: the selection lists `blocks` (`[1, T, H_kv, N]`) and the
/// packed documents' `starts` (`[1, T]`).
fn key_sets<R: Backend>(blocks: &[i64], dims: [usize; 4], starts: &[i64], device: &R::Device) -> [Keys<R>; 5] {
    let blocks = Tensor::<R, 4, Int>::from_data(TensorData::new(blocks.to_vec(), dims), device);
    let documents = Documents::<R>::from_starts(starts.to_vec(), [1, dims[1]], DOCUMENT_ALIGN, device)
        .expect("the parity check's document starts are valid");
    [
        Keys::window(W, None),
        Keys::selected(blocks, L_SEL),
        compressed_keys(),
        Keys::window(W, Some(&documents)),
        Keys::compressed(L_CMP, D_CMP, Some(&documents)),
    ]
}

/// Random document starts for one row of `t` positions: a document may begin at any multiple
/// of [`DOCUMENT_ALIGN`], so documents shorter and longer than the window and the blocks occur.
fn random_starts(rng: &mut StdRng, t: usize) -> Vec<i64> {
    use rand::Rng;
    let mut start = 0;
    (0..t)
        .map(|pos| {
            if pos > 0 && pos % DOCUMENT_ALIGN == 0 && rng.random_bool(0.3) {
                start = pos as i64;
            }
            start
        })
        .collect()
}

/// `[out, dq, dk, dv]` of the reference path on the parity inputs, on the host.
fn reference_grads<R: AutodiffBackend>(x: &Inputs<R::InnerBackend>, keys: &Keys<R>) -> [Vec<f64>; 4] {
    forward_backward::<R>(x, Seed::GradOut, |q, k, v| reference::forward(q, k, v, keys).0).map(host)
}

/// The parity reference of every branch of [`BRANCHES`]: f64 on the CPU where built with it,
/// else the device's storage dtype.
#[cfg(feature = "cpu")]
fn parity_reference<B: AutodiffBackend>(
    x: &Inputs<B::InnerBackend>,
    blocks: &[i64],
    dims: [usize; 4],
    starts: &[i64],
    _device: &B::Device,
) -> (DType, Vec<[Vec<f64>; 4]>) {
    type Cpu = burn::backend::Autodiff<burn::backend::NdArray>;
    let device = Default::default();
    let x = x.to::<burn::backend::NdArray>(DType::F64, &device);
    (DType::F64, references::<Cpu>(&x, key_sets(blocks, dims, starts, &device)))
}

#[cfg(not(feature = "cpu"))]
fn parity_reference<B: AutodiffBackend>(
    x: &Inputs<B::InnerBackend>,
    blocks: &[i64],
    dims: [usize; 4],
    starts: &[i64],
    device: &B::Device,
) -> (DType, Vec<[Vec<f64>; 4]>) {
    (x.q.dtype(), references::<B>(x, key_sets(blocks, dims, starts, device)))
}

/// [`reference_grads`] of each key set, on the compressed inputs where the branch takes them.
fn references<R: AutodiffBackend>(x: &Inputs<R::InnerBackend>, keys: [Keys<R>; 5]) -> Vec<[Vec<f64>; 4]> {
    let compressed = x.compressed();
    keys.iter()
        .enumerate()
        .map(|(i, keys)| reference_grads::<R>(if on_compressed(i) { &compressed } else { x }, keys))
        .collect()
}

/// Parity tolerance (max error over max magnitude): f32 against an f64 reference 1e-4, against
/// an f32 one (maybe TF32 matmuls) 1e-3; 16-bit storage 3e-2.
fn tolerance(storage: DType, reference: DType) -> f64 {
    match (storage, reference) {
        (DType::F32, DType::F64) => 1e-4,
        (DType::F32, _) => 1e-3,
        _ => 3e-2,
    }
}

/// One branch's parity check: the largest error of the output and each gradient over the
/// largest magnitude of the reference's.
#[derive(Debug, Clone, Serialize)]
pub struct Parity {
    pub shape: &'static str,
    pub branch: &'static str,
    pub t: usize,
    /// The reference's dtype (f64 on the CPU where built with the `cpu` feature).
    pub reference: String,
    pub out: f64,
    pub dq: f64,
    pub dk: f64,
    pub dv: f64,
    pub tolerance: f64,
    pub pass: bool,
}

/// Parity of `shape` on a ragged length (`opts.check_len`), all three key sets through the op,
/// and the window and selection through every plan the device can run (`plans`).
pub(crate) fn check_parity<B: TrainBackend>(
    shape: Shape,
    opts: &BenchOptions,
    plans: PlanCheck,
    rng: &mut StdRng,
    device: &B::Device,
    report: &mut KernelReport,
) {
    let t = opts.check_len;
    let x = inputs::<B::InnerBackend>(shape, t, opts.dtype, device);
    let (blocks, _) = random_blocks(rng, t, shape.h_kv);
    let starts = random_starts(rng, t);
    let dims = [1, t, shape.h_kv, N];
    let (ref_dtype, wanted) = parity_reference::<B>(&x, &blocks, dims, &starts, device);
    let tolerance = tolerance(opts.dtype, ref_dtype);
    let data = [&x.q, &x.k, &x.v, &x.grad_out].map(|t| t.to_data().convert::<f32>());
    let block_data = TensorData::new(blocks.clone(), dims);
    let start_data = TensorData::new(starts.clone(), [1, t]);
    // Every plan of the window, the selection and the packed window: `(branch, blocks, starts)`.
    let plan_cases: [(usize, Option<&TensorData>, Option<&TensorData>); 3] =
        [(0, None, None), (1, Some(&block_data), None), (3, None, Some(&start_data))];
    for (i, blocks, starts) in plan_cases {
        let (branch, want, inputs, window, block_size, dtype) = (BRANCHES[i], &wanted[i], &data, W, L_SEL, opts.dtype);
        let case =
            PlanCase { shape: shape.name, branch, inputs, blocks, starts, window, block_size, dtype, want, tolerance };
        report.plans.extend(plans(&case));
    }
    let compressed = x.compressed();
    let key_sets = key_sets::<B>(&blocks, dims, &starts, device);
    for (i, (keys, want)) in key_sets.iter().zip(wanted).enumerate() {
        let (branch, x) = (BRANCHES[i], if on_compressed(i) { &compressed } else { &x });
        let fused = forward_backward::<B>(x, Seed::GradOut, |q, k, v| sparse_attention(q, k, v, keys).0).map(host);
        let errs: Vec<f64> = fused.iter().zip(&want).map(|(a, b)| rel_err(a, b)).collect();
        let [out, dq, dk, dv] = [errs[0], errs[1], errs[2], errs[3]];
        let pass = errs.iter().all(|e| *e <= tolerance);
        println!(
            "parity {} {branch} T={t} (reference {ref_dtype:?}): out {out:.1e} dq {dq:.1e} dk {dk:.1e} dv {dv:.1e} \
             (tolerance {tolerance:.0e}) {}",
            shape.name,
            if pass { "ok" } else { "FAIL" }
        );
        let reference = format!("{ref_dtype:?}");
        report.parity.push(Parity { shape: shape.name, branch, t, reference, out, dq, dk, dv, tolerance, pass });
    }
}
