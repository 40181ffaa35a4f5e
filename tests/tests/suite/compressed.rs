//! The compressed branch's kernels (`Keys::Compressed`) on WGPU (Mesa lavapipe in CI, f32)
//! against the reference tensor path in f64 on the CPU: output, log-sum-exp and the gradients
//! of q, k and v, on fresh random inputs (the selection that follows: `select_kernel.rs`). The reference
//! path itself is held to the float64 loops of the spec by the layer parity tests.
//!
//! Shapes cover rows that see no block (every `t < l - 1`), ragged `T`, `l % d != 0`, groups of
//! 1, 2 and 6, `d_k != d_v` (and head dims that are not multiples of 4), batch 2, block counts
//! that pad the products' width (149 blocks) and several cubes of score rows; one case runs
//! through Burn's fusion, and strides of 1 and longer than a block. The branch runs as a causal
//! attention over its interleaved rows (`nsa_kernels::sparse::compressed::Interleaved`: the window
//! kernels, portable here, tensor cores on CUDA, checked there by `nsa-bench kernels`).

use burn::backend::wgpu::{CubeBackend, WgpuDevice, WgpuRuntime};
use burn::backend::Autodiff;
use burn::tensor::{backend::AutodiffBackend, Int, Tensor, TensorData};
use nsa_kernels::{sparse_attention, Keys, SparseAttentionBackend};
use nsa_tests::{fresh_rng, max_rel_err, normal, random_starts, to_vec, A64};
use rand::rngs::StdRng;

type Wgpu = Autodiff<CubeBackend<WgpuRuntime, f32, i32, u32>>;
type WgpuFusion = Autodiff<burn::backend::Wgpu>;

struct Case {
    /// `[b, t, h_q, h_kv, d_k, d_v]` and the block geometry `[l, d, l_sel]`.
    dims: [usize; 6],
    geometry: [usize; 3],
    q: Vec<f64>,
    k: Vec<f64>,
    v: Vec<f64>,
    grad_out: Vec<f64>,
    /// Packed rows: each position's document start `[B, T]` (empty: one document per row).
    starts: Vec<i64>,
}

impl Case {
    fn new(rng: &mut StdRng, dims: [usize; 6], geometry: [usize; 3]) -> Self {
        let [b, t, h_q, h_kv, d_k, d_v] = dims;
        let n = Self::blocks(t, geometry);
        Case {
            dims,
            geometry,
            q: normal(rng, b * t * h_q * d_k, 1.0),
            k: normal(rng, b * n * h_kv * d_k, 1.0),
            v: normal(rng, b * n * h_kv * d_v, 1.0),
            grad_out: normal(rng, b * t * h_q * d_v, 1.0),
            starts: Vec::new(),
        }
    }

    /// The case on packed rows: documents starting at random multiples of the stride (as
    /// packing aligns them), some shorter than a block.
    fn packed(mut self, rng: &mut StdRng) -> Self {
        let [b, t, ..] = self.dims;
        self.starts = random_starts(rng, b, t, self.geometry[1], 0.3);
        self
    }

    fn blocks(t: usize, [l, d, _]: [usize; 3]) -> usize {
        (t - l) / d + 1
    }

    /// `[out, lse of the rows that see a block, dq, dk, dv]` on `B`.
    fn run<B: AutodiffBackend + SparseAttentionBackend>(&self, device: &B::Device) -> [Vec<f64>; 5] {
        let [b, t, h_q, h_kv, d_k, d_v] = self.dims;
        let [l, d, _] = self.geometry;
        let n = Self::blocks(t, self.geometry);
        let tensor = |data: &[f64], shape: [usize; 4]| {
            Tensor::<B, 4>::from_data(TensorData::new(data.to_vec(), shape), device).require_grad()
        };
        let q = tensor(&self.q, [b, t, h_q, d_k]);
        let k = tensor(&self.k, [b, n, h_kv, d_k]);
        let v = tensor(&self.v, [b, n, h_kv, d_v]);
        let documents = (!self.starts.is_empty()).then(|| {
            Tensor::<B, 2, Int>::from_data(TensorData::new(self.starts.clone(), [b, t]), device).into_primitive()
        });
        let keys = Keys::Compressed { length: l, stride: d, documents };
        let (out, lse) = sparse_attention(q.clone(), k.clone(), v.clone(), &keys);
        let grad_out = Tensor::<B, 4>::from_data(TensorData::new(self.grad_out.clone(), [b, t, h_q, d_v]), device);
        let grads = (out.clone() * grad_out).sum().backward();
        let grad = |x: &Tensor<B, 4>| to_vec(x.grad(&grads).expect("input has a gradient"));
        // Rows before the first block (of their document) carry a log-sum-exp of -1e30, which
        // would swamp the relative error: they are checked through their zero output and
        // gradients instead.
        let lse =
            to_vec(lse.narrow(1, l - 1, t + 1 - l)).into_iter().map(|x| if x < -1e29 { 0.0 } else { x }).collect();
        [to_vec(out), lse, grad(&q), grad(&k), grad(&v)]
    }

    fn check<B: AutodiffBackend + SparseAttentionBackend>(&self, device: &B::Device, tol: f64) {
        let want = self.run::<A64>(&Default::default());
        let got = self.run::<B>(device);
        for (i, name) in ["out", "lse", "dq", "dk", "dv"].iter().enumerate() {
            let err = max_rel_err(&got[i], &want[i]);
            assert!(err <= tol, "{name}: relative error {err:e} > {tol:e} for {:?} {:?}", self.dims, self.geometry);
        }
    }
}

/// Each head shape and group compiles its own kernels, which costs lavapipe a minute or more: the
/// cases share the shapes of `kernels.rs`' window cases (the compressed branch runs on the window
/// kernels), and vary what the kernels take at run time (lengths, strides, blocks, batch).
fn cases(rng: &mut StdRng) -> Vec<Case> {
    vec![
        Case::new(rng, [2, 45, 6, 1, 16, 8], [8, 4, 8]),
        // `l % d != 0`, and selection blocks smaller than a compressed block.
        Case::new(rng, [1, 50, 6, 1, 16, 8], [6, 4, 4]),
        // Head dims that are not multiples of 4.
        Case::new(rng, [1, 40, 4, 2, 6, 10], [8, 4, 8]),
        // A stride of 1 (one query per group: no key copies), and a stride longer than a block.
        Case::new(rng, [1, 30, 2, 2, 8, 8], [4, 1, 4]),
        Case::new(rng, [2, 45, 2, 2, 8, 8], [5, 8, 8]),
        // 149 blocks: the products' width padded to 160.
        Case::new(rng, [1, 600, 2, 2, 8, 8], [8, 4, 16]),
        // The production group and head dim (g = 6, d = 64, l = 32, d = 16, l' = 64), several
        // query tiles.
        Case::new(rng, [1, 300, 12, 2, 64, 64], [32, 16, 64]),
    ]
}

#[test]
fn compressed_kernels_match_the_reference() {
    let mut rng = fresh_rng("compressed_kernels_match_the_reference");
    for case in cases(&mut rng) {
        case.check::<Wgpu>(&WgpuDevice::default(), 1e-5);
    }
}

#[test]
fn compressed_kernels_through_fusion_match_the_reference() {
    let mut rng = fresh_rng("compressed_kernels_through_fusion_match_the_reference");
    Case::new(&mut rng, [2, 45, 6, 1, 16, 8], [8, 4, 8]).check::<WgpuFusion>(&WgpuDevice::default(), 1e-5);
}

/// Packed rows: each row sees only the blocks of its document, on the kernels and through fusion.
#[test]
fn compressed_kernels_keep_to_each_document() {
    let mut rng = fresh_rng("compressed_kernels_keep_to_each_document");
    let case = Case::new(&mut rng, [2, 45, 6, 1, 16, 8], [8, 4, 8]).packed(&mut rng);
    case.check::<Wgpu>(&WgpuDevice::default(), 1e-5);
    case.check::<WgpuFusion>(&WgpuDevice::default(), 1e-5);
}

/// A sequence shorter than one block (`T < l`): no row sees a key, so the output is zero, the
/// log-sum-exp `-1e30` and every gradient zero, whatever keys the caller passes.
#[test]
fn a_sequence_shorter_than_a_block_sees_no_key() {
    let mut rng = fresh_rng("a_sequence_shorter_than_a_block_sees_no_key");
    let device = WgpuDevice::default();
    let ([b, t, h_q, h_kv, d_k, d_v], l) = ([2, 7, 4, 2, 8, 6], 8);
    let mut tensor = |shape: [usize; 4]| {
        let data = normal(&mut rng, shape.iter().product(), 1.0);
        Tensor::<Wgpu, 4>::from_data(TensorData::new(data, shape), &device).require_grad()
    };
    let (q, k, v) = (tensor([b, t, h_q, d_k]), tensor([b, 1, h_kv, d_k]), tensor([b, 1, h_kv, d_v]));
    let grad_out = tensor([b, t, h_q, d_v]);
    let (out, lse) = sparse_attention(q.clone(), k.clone(), v.clone(), &Keys::compressed(l, 4, None));
    let grads = (out.clone() * grad_out.detach()).sum().backward();
    assert!(to_vec(out).iter().all(|&x| x == 0.0), "output");
    assert!(to_vec(lse).iter().all(|&x| x <= -1e29), "log-sum-exp");
    for (name, x) in [("q", &q), ("k", &k), ("v", &v)] {
        let grad = to_vec(x.grad(&grads).expect("input has a gradient"));
        assert!(grad.iter().all(|&g| g == 0.0), "d{name}");
    }
}
