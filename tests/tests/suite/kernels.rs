//! Sparse attention (`nsa-kernels`) against the float64 loop version: forward output,
//! log-sum-exp and the gradients of q, k, v, on fresh random inputs.
//!
//! The fused CubeCL kernels run on WGPU (Mesa lavapipe in CI) in f32; the reference tensor path
//! runs on the f64 CPU backend. Shapes cover ragged `T`, `g = 1, 2, 6, 16`, `d_k != d_v`, batch 2,
//! windows wider than `T`, random duplicate-free block sets that include the forced blocks, and
//! the kernels' tilings: several query and key tiles, partial chunks, rows split over units;
//! and, for two cases, through Burn's fusion, as a GPU training run calls them.

use burn::backend::wgpu::{CubeBackend, WgpuDevice, WgpuRuntime};
use burn::backend::Autodiff;
use burn::tensor::{backend::AutodiffBackend, Int, Tensor, TensorData, TensorMetadata, TensorPrimitive};
use nsa_core::NsaAttentionConfig;
use nsa_kernels::sparse::launch::{backward_with, forward_with, problem};
use nsa_kernels::sparse::plan::{BackwardPlan, Capabilities, ForwardPlan};
use nsa_kernels::{sparse_attention, Keys, SparseAttentionBackend, TokenKeys};
use nsa_tests::attention::{attention, block_keys, window_keys, AttentionResult, Dims};
use nsa_tests::{fresh_rng, max_rel_err, normal, random_input, random_starts, randomized, small_config, to_vec, A64};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;

type Wgpu = Autodiff<CubeBackend<WgpuRuntime, f32, i32, u32>>;
/// What a GPU run trains on: Burn's fusion over the same kernels (each call is a custom
/// operation on the fusion stream).
type WgpuFusion = Autodiff<burn::backend::Wgpu>;
/// The kernels' own backend, which runs a plan without autodiff.
type Plain = CubeBackend<WgpuRuntime, f32, i32, u32>;

#[derive(Clone, Copy, Debug)]
enum Spec {
    Window { w: usize },
    Selected { l_sel: usize, n: usize },
}

/// A selection for each `(b, t, hk)`: the forced blocks (0 and the two local ones) plus random
/// eligible blocks up to `n`, in random order, padded with -1 at random slots.
fn random_blocks(rng: &mut StdRng, dims: Dims, l_sel: usize, n: usize) -> Vec<i64> {
    let mut out = Vec::with_capacity(dims.b * dims.t * dims.h_kv * n);
    for _ in 0..dims.b {
        for t in 0..dims.t {
            for _ in 0..dims.h_kv {
                let current = t / l_sel;
                let mut forced: Vec<usize> = vec![0, current, current.saturating_sub(1)];
                forced.sort_unstable();
                forced.dedup();
                let mut others: Vec<usize> = (0..=current).filter(|j| !forced.contains(j)).collect();
                others.shuffle(rng);
                let take = rng.random_range(0..=(n - forced.len()).min(others.len()));
                let mut row: Vec<i64> = forced.iter().chain(&others[..take]).map(|&j| j as i64).collect();
                row.resize(n, -1);
                row.shuffle(rng);
                out.extend(row);
            }
        }
    }
    out
}

struct Case {
    dims: Dims,
    spec: Spec,
    q: Vec<f64>,
    k: Vec<f64>,
    v: Vec<f64>,
    grad_out: Vec<f64>,
    blocks: Vec<i64>,
    /// Packed rows: each position's document start `[B, T]` (empty: one document per row).
    starts: Vec<i64>,
}

impl Case {
    fn new(rng: &mut StdRng, dims: Dims, spec: Spec) -> Self {
        let Dims { b, t, h_q, h_kv, d_k, d_v } = dims;
        let blocks = match spec {
            Spec::Window { .. } => vec![],
            Spec::Selected { l_sel, n } => random_blocks(rng, dims, l_sel, n),
        };
        Case {
            dims,
            spec,
            q: normal(rng, b * t * h_q * d_k, 1.0),
            k: normal(rng, b * t * h_kv * d_k, 1.0),
            v: normal(rng, b * t * h_kv * d_v, 1.0),
            grad_out: normal(rng, b * t * h_q * d_v, 1.0),
            blocks,
            starts: Vec::new(),
        }
    }

    /// The case on packed rows: documents of random lengths (about 16 on average, some past
    /// the window), each row's first at 0.
    fn packed(mut self, rng: &mut StdRng) -> Self {
        let Dims { b, t, .. } = self.dims;
        self.starts = random_starts(rng, b, t, 1, 1.0 / 16.0);
        self
    }

    fn expected(&self) -> AttentionResult {
        let d = self.dims;
        attention(d, &self.q, &self.k, &self.v, &self.grad_out, |b, t, hk| match self.spec {
            Spec::Window { w } => {
                let start = self.starts.get(b * d.t + t).map_or(0, |&s| s as usize);
                window_keys(t, w).into_iter().filter(|&s| s >= start).collect()
            }
            Spec::Selected { l_sel, n } => {
                let at = ((b * d.t + t) * d.h_kv + hk) * n;
                block_keys(t, &self.blocks[at..at + n], l_sel)
            }
        })
    }

    /// Runs the op on `B` and returns `[out, lse, dq, dk, dv]`.
    fn run<B: AutodiffBackend + SparseAttentionBackend>(&self, device: &B::Device) -> [Vec<f64>; 5] {
        self.run_indexed::<B>(device, None)
    }

    /// [`Case::run`], a selection's key set carrying the backend's inverted index of
    /// `index_of` (another block list) when given.
    fn run_indexed<B: AutodiffBackend + SparseAttentionBackend>(
        &self,
        device: &B::Device,
        index_of: Option<&[i64]>,
    ) -> [Vec<f64>; 5] {
        let Dims { b, t, h_q, h_kv, d_k, d_v } = self.dims;
        let tensor = |data: &[f64], shape: [usize; 4]| {
            Tensor::<B, 4>::from_data(TensorData::new(data.to_vec(), shape), device).require_grad()
        };
        let q = tensor(&self.q, [b, t, h_q, d_k]);
        let k = tensor(&self.k, [b, t, h_kv, d_k]);
        let v = tensor(&self.v, [b, t, h_kv, d_v]);
        let keys = match self.spec {
            Spec::Window { w } => Keys::Window {
                w,
                documents: (!self.starts.is_empty()).then(|| {
                    Tensor::<B, 2, Int>::from_data(TensorData::new(self.starts.clone(), [b, t]), device)
                        .into_primitive()
                }),
            },
            Spec::Selected { l_sel, n } => {
                let list = |blocks: &[i64]| {
                    let data = TensorData::new(blocks.to_vec(), [b, t, h_kv, n]);
                    Tensor::<B, 4, Int>::from_data(data, device).into_primitive()
                };
                let index = index_of.map(|other| B::block_index(&list(other), l_sel).expect("a fused backend indexes"));
                Keys::Selected { blocks: list(&self.blocks), block_size: l_sel, index }
            }
        };
        let (out, lse) = sparse_attention(q.clone(), k.clone(), v.clone(), &keys);
        let grad_out = Tensor::<B, 4>::from_data(TensorData::new(self.grad_out.clone(), [b, t, h_q, d_v]), device);
        let grads = (out.clone() * grad_out).sum().backward();
        let grad = |x: &Tensor<B, 4>| to_vec(x.grad(&grads).expect("input has a gradient"));
        [to_vec(out), to_vec(lse), grad(&q), grad(&k), grad(&v)]
    }

    /// Runs the portable plans `caps` gives, forward then backward, and returns
    /// `[out, lse, dq, dk, dv]`.
    fn run_portable(&self, device: &WgpuDevice, caps: &Capabilities) -> [Vec<f64>; 5] {
        let Dims { b, t, h_q, h_kv, d_k, d_v } = self.dims;
        let tensor = |data: &[f64], shape: [usize; 4]| {
            Tensor::<Plain, 4>::from_data(TensorData::new(data.to_vec(), shape), device).into_primitive().tensor()
        };
        let floats = |x| to_vec(Tensor::<Plain, 4>::from_primitive(TensorPrimitive::Float(x)));
        let (q, k, v) =
            (tensor(&self.q, [b, t, h_q, d_k]), tensor(&self.k, [b, t, h_kv, d_k]), tensor(&self.v, [b, t, h_kv, d_v]));
        let grad_out = tensor(&self.grad_out, [b, t, h_q, d_v]);
        // A window reads no block list: one empty slot per query stands in.
        let (n, list) = match self.spec {
            Spec::Window { .. } => (1, vec![-1; b * t * h_kv]),
            Spec::Selected { n, .. } => (n, self.blocks.clone()),
        };
        let blocks = Tensor::<Plain, 4, Int>::from_data(TensorData::new(list, [b, t, h_kv, n]), device);
        let blocks = blocks.into_primitive();
        let keys: TokenKeys<'_, Plain> = match self.spec {
            Spec::Window { w } => TokenKeys::Window { w, documents: None },
            Spec::Selected { l_sel, .. } => TokenKeys::Selected { blocks: &blocks, block_size: l_sel, index: None },
        };
        let problem = problem(&q, &k, &v, keys);
        let (out, lse) = forward_with(q.clone(), k.clone(), v.clone(), keys, &ForwardPlan::portable(&problem, caps));
        let plan = BackwardPlan::portable(&problem, caps);
        let grads = backward_with(q, k, v, out.clone(), lse.clone(), grad_out, keys, &plan);
        let lse = to_vec(Tensor::<Plain, 3>::from_primitive(TensorPrimitive::Float(lse)));
        [floats(out), lse, floats(grads.q), floats(grads.k), floats(grads.v)]
    }

    fn check<B: AutodiffBackend + SparseAttentionBackend>(&self, device: &B::Device, tol: f64) {
        self.check_result(&self.run::<B>(device), tol);
    }

    fn check_result(&self, got: &[Vec<f64>; 5], tol: f64) {
        let e = self.expected();
        for (name, got, want) in [
            ("out", &got[0], &e.out),
            ("lse", &got[1], &e.lse),
            ("dq", &got[2], &e.dq),
            ("dk", &got[3], &e.dk),
            ("dv", &got[4], &e.dv),
        ] {
            let err = max_rel_err(got, want);
            assert!(err <= tol, "{name}: relative error {err:e} > {tol:e} for {:?} {:?}", self.dims, self.spec);
        }
    }
}

fn dims(b: usize, t: usize, h_q: usize, h_kv: usize, d_k: usize, d_v: usize) -> Dims {
    Dims { b, t, h_q, h_kv, d_k, d_v }
}

/// The window shapes every implementation is checked on. A head shape costs lavapipe seconds to
/// tens of seconds to compile (LLVM's coroutine split of the barriers), so the cases reuse a
/// few head shapes and vary what the kernels take at run time; the benchmark's
/// parity check (`nsa-bench kernels`) covers the production and paper shapes (d = 128 and 192)
/// on a GPU. The compressed branch runs on the window kernels (`compressed.rs` reuses these
/// head shapes).
fn window_cases(rng: &mut StdRng) -> Vec<Case> {
    vec![
        Case::new(rng, dims(2, 37, 6, 1, 16, 8), Spec::Window { w: 8 }),
        Case::new(rng, dims(1, 20, 2, 2, 8, 8), Spec::Window { w: 64 }),
        Case::new(rng, dims(1, 70, 6, 1, 16, 8), Spec::Window { w: 16 }),
        // The production group (g = 6, d = 64) over several query and key tiles, ragged chunks,
        // and rows split over units (dQ, dK/dV).
        Case::new(rng, dims(1, 150, 12, 2, 64, 64), Spec::Window { w: 40 }),
    ]
}

/// The selection shapes every implementation is checked on (head shapes chosen as above).
fn selected_cases(rng: &mut StdRng) -> Vec<Case> {
    vec![
        Case::new(rng, dims(2, 45, 6, 1, 16, 8), Spec::Selected { l_sel: 8, n: 3 }),
        Case::new(rng, dims(1, 33, 16, 1, 32, 16), Spec::Selected { l_sel: 4, n: 5 }),
        Case::new(rng, dims(1, 70, 2, 2, 8, 8), Spec::Selected { l_sel: 16, n: 4 }),
        // The production group (g = 6, d = 64), rows split over units (dQ, dK/dV, the
        // selection forward).
        Case::new(rng, dims(1, 100, 6, 1, 64, 64), Spec::Selected { l_sel: 32, n: 3 }),
        // Blocks larger than a key cube (64 keys at d = 64: two sub-tiles per block).
        Case::new(rng, dims(1, 300, 6, 1, 64, 64), Spec::Selected { l_sel: 128, n: 3 }),
        // A block picked by every query (block 0 is forced) over a longer sequence: its query
        // list is cut in two segments, per KV head.
        Case::new(rng, dims(1, 600, 4, 2, 8, 8), Spec::Selected { l_sel: 16, n: 3 }),
        // Several KV heads with a group each (the benchmark's selection: h_kv = 2, g = 6, n = 16).
        Case::new(rng, dims(2, 300, 12, 2, 64, 64), Spec::Selected { l_sel: 64, n: 16 }),
        // Head dims off every vector width (`sum_segments` adds one element per unit there).
        Case::new(rng, dims(1, 40, 4, 2, 6, 10), Spec::Selected { l_sel: 8, n: 3 }),
    ]
}

#[test]
fn reference_path_matches_float64_loops() {
    let mut rng = fresh_rng("reference_path_matches_float64_loops");
    for case in window_cases(&mut rng).into_iter().chain(selected_cases(&mut rng)) {
        case.check::<A64>(&Default::default(), 1e-10);
    }
}

/// The window kernels and the selection kernels are two tests, so that `cargo xtask test` can
/// compile their `d = 64` kernels in two processes at once.
#[test]
fn wgpu_window_kernels_match_float64_loops() {
    check_on_wgpu("wgpu_window_kernels_match_float64_loops", window_cases);
}

#[test]
fn wgpu_selected_kernels_match_float64_loops() {
    check_on_wgpu("wgpu_selected_kernels_match_float64_loops", selected_cases);
}

/// `cases` on the WGPU kernels, against the float64 loops.
fn check_on_wgpu(test: &str, cases: fn(&mut StdRng) -> Vec<Case>) {
    let mut rng = fresh_rng(test);
    assert!(<Wgpu as SparseAttentionBackend>::has_fused_sparse_attention());
    for case in cases(&mut rng) {
        case.check::<Wgpu>(&WgpuDevice::default(), 1e-5);
    }
}

/// The portable kernels as a GPU runs them, their loops unrolled (lavapipe, which CI runs on,
/// gets them as loops: see `Unroll`), on small head shapes whose unrolled compile is cheap.
#[test]
fn wgpu_unrolled_portable_kernels_match_float64_loops() {
    let mut rng = fresh_rng("wgpu_unrolled_portable_kernels_match_float64_loops");
    let gpu = Capabilities { unrolls_loops: true, ..Capabilities::WGPU };
    let cases = [
        Case::new(&mut rng, dims(2, 37, 6, 1, 16, 8), Spec::Window { w: 8 }),
        Case::new(&mut rng, dims(2, 45, 6, 1, 16, 8), Spec::Selected { l_sel: 8, n: 3 }),
    ];
    for case in cases {
        case.check_result(&case.run_portable(&WgpuDevice::default(), &gpu), 1e-5);
    }
}

/// Packed rows: a window stops at each row's document start, on the reference path, on the
/// kernels (WGPU runs the portable plans; the tensor-core ones are checked on CUDA by
/// `nsa-bench kernels`) and through fusion.
#[test]
fn wgpu_window_kernels_keep_to_each_document() {
    let mut rng = fresh_rng("wgpu_window_kernels_keep_to_each_document");
    for case in [
        Case::new(&mut rng, dims(2, 37, 6, 1, 16, 8), Spec::Window { w: 8 }).packed(&mut rng),
        Case::new(&mut rng, dims(1, 70, 6, 1, 16, 8), Spec::Window { w: 24 }).packed(&mut rng),
        // A window as long as the row (the dense layer's) over several key cubes: each cube's
        // walk ends with the document of its last key.
        Case::new(&mut rng, dims(1, 600, 6, 1, 16, 8), Spec::Window { w: 600 }).packed(&mut rng),
    ] {
        case.check::<A64>(&Default::default(), 1e-10);
        case.check::<Wgpu>(&WgpuDevice::default(), 1e-5);
        case.check::<WgpuFusion>(&WgpuDevice::default(), 1e-5);
    }
}

/// The layer takes the fused kernels or the reference path by `fused_kernels`: the same function
/// on the same device, so a run can switch paths (for speed or memory) without changing results.
#[test]
fn layer_fused_and_reference_paths_agree_on_wgpu() {
    type Plain = CubeBackend<WgpuRuntime, f32, i32, u32>;
    let (t, device) = (70, WgpuDevice::default());
    let mut rng = fresh_rng("layer_fused_and_reference_paths_agree_on_wgpu");
    let fused = randomized(NsaAttentionConfig::new(small_config(), t).init::<Plain>(&device), &mut rng, 0.4);
    let mut reference = fused.clone();
    reference.config.fused_kernels = false;
    let (x, _) = random_input::<Plain>(&mut rng, 2, t, small_config().dim, &device);
    let err = max_rel_err(&to_vec(fused.forward(x.clone())), &to_vec(reference.forward(x)));
    assert!(err <= 1e-5, "fused and reference layer outputs differ by {err:e} (relative)");
}

/// The inverted block index is built once, in the forward, and carried to the backward in the
/// key set: the backward walks the index it is given (one made for other blocks gives other
/// dK), and the index has the shapes the backend declares for fusion to record.
#[test]
fn the_backward_walks_the_index_its_key_set_carries() {
    fn check<B: AutodiffBackend + SparseAttentionBackend>(rng: &mut StdRng, device: &B::Device) {
        // Three of the six slots are the forced blocks; the others differ between the lists.
        let (d, spec) = (dims(1, 100, 6, 1, 16, 16), Spec::Selected { l_sel: 8, n: 6 });
        let case = Case::new(rng, d, spec);
        let other = random_blocks(rng, d, 8, 6);
        let blocks = Tensor::<B, 4, Int>::from_data(TensorData::new(other.clone(), [1, 100, 1, 6]), device);
        let shapes = B::block_index_shapes(&blocks.shape(), 8).expect("a fused backend declares its index");
        let index = B::block_index(&blocks.into_primitive(), 8).expect("a fused backend indexes");
        let built: Vec<_> = index.tensors.iter().map(|tensor| tensor.shape()).collect();
        assert_eq!(built, shapes, "the index has the shapes declared for it");

        let want = case.expected();
        let [.., own_dk, _] = case.run_indexed::<B>(device, Some(&case.blocks));
        assert!(max_rel_err(&own_dk, &want.dk) <= 1e-5, "an index of the key set's own blocks gives its dK");
        let [.., other_dk, _] = case.run_indexed::<B>(device, Some(&other));
        assert!(max_rel_err(&other_dk, &want.dk) > 1e-2, "the backward walked the carried index, not its own");
    }
    let mut rng = fresh_rng("the_backward_walks_the_index_its_key_set_carries");
    check::<Wgpu>(&mut rng, &WgpuDevice::default());
    check::<WgpuFusion>(&mut rng, &WgpuDevice::default());
}

#[test]
fn wgpu_fusion_kernels_match_float64_loops() {
    let mut rng = fresh_rng("wgpu_fusion_kernels_match_float64_loops");
    assert!(<WgpuFusion as SparseAttentionBackend>::has_fused_sparse_attention());
    // Small head dims: this checks the fusion path (custom operations, the recorded index), not
    // the tilings, and new d = 64 kernels would cost lavapipe minutes to compile.
    for case in [
        Case::new(&mut rng, dims(1, 50, 12, 2, 16, 8), Spec::Window { w: 12 }),
        Case::new(&mut rng, dims(2, 90, 12, 2, 16, 8), Spec::Selected { l_sel: 8, n: 6 }),
    ] {
        case.check::<WgpuFusion>(&WgpuDevice::default(), 1e-5);
    }
}
