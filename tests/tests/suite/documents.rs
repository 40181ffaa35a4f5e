//! Packed documents (varlen): a row of several documents computes, at every position, what its
//! document alone computes: outputs and selections against the float64 loop reference run on
//! each document by itself, gradients against the layer run on each document by itself, and the
//! whole model (RoPE positions restarting) for NSA and dense attention; and the fused kernels
//! (WGPU, Mesa lavapipe in CI) against that reference path.

use burn::backend::wgpu::{CubeBackend, WgpuDevice, WgpuRuntime};
use burn::backend::Autodiff;
use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::{backend::AutodiffBackend, Int, Tensor, TensorData};
use nsa_core::{
    lm_loss, AttentionKind, DenseAttention, DenseAttentionConfig, Documents, NsaAttention, NsaAttentionConfig,
    NsaConfig, NsaLm, NsaLmConfig, Phi,
};
use nsa_tests::reference::nsa_reference;
use nsa_tests::{
    fresh_rng, max_rel_err, normal, random_input, randomized, selection_sets, small_config, to_vec, weights_of, A64,
    B64,
};
use rand::Rng;

/// Each row's document starts, within `T` positions. With `small_config` (`d = 4, l = 8,
/// l_sel = 8, n = 4, w = 16`) starts are multiples of 8; the documents are 8 long (below `w`,
/// one compressed block), 48 (past the window, with more blocks than `n`: a contested top-n),
/// 16, 40, and in each row a last one of 5 (below `l`: no compressed block, one partial
/// selection block).
const T: usize = 61;
const ROWS: [&[usize]; 2] = [&[0, 8, 56], &[0, 16, 56]];

/// `(row, start, end)` of every document.
fn spans() -> Vec<(usize, usize, usize)> {
    let mut out = Vec::new();
    for (b, starts) in ROWS.iter().enumerate() {
        for (i, &s) in starts.iter().enumerate() {
            out.push((b, s, starts.get(i + 1).copied().unwrap_or(T)));
        }
    }
    out
}

/// The starts as [`Documents`] (`[2, T]`, each position's document start).
fn packed<B: burn::tensor::backend::Backend>(align: usize, device: &B::Device) -> Documents<B> {
    let starts: Vec<i64> = ROWS
        .iter()
        .flat_map(|starts| (0..T).map(move |t| starts.iter().rev().find(|&&s| s <= t).copied().unwrap() as i64))
        .collect();
    Documents::from_starts(starts, [ROWS.len(), T], align, device).unwrap()
}

fn layer_config() -> NsaConfig {
    // Two query heads per KV head; d_k != d_v.
    small_config().with_d_v(6)
}

/// Positions `s..e` of row `b` of a `[B, T, dim]` input, as one sequence.
fn slice<B: burn::tensor::backend::Backend>(x: &Tensor<B, 3>, (b, s, e): (usize, usize, usize)) -> Tensor<B, 3> {
    x.clone().slice([b..b + 1, s..e])
}

#[test]
fn a_packed_row_matches_the_float64_reference_on_each_document_alone() {
    // A learned `phi` mixes the rotated key dimensions, so the compressed keys depend on where
    // RoPE's positions restart (with `avg`, as with every `q . k`, a document-wide offset cancels).
    let cfg = layer_config().with_phi(Phi::Mlp);
    let device = Default::default();
    let mut rng = fresh_rng("packed_reference");
    let layer: NsaAttention<B64> = randomized(NsaAttentionConfig::new(cfg.clone(), T).init(&device), &mut rng, 0.4);
    let (x, rows) = random_input::<B64>(&mut rng, ROWS.len(), T, cfg.dim, &device);
    let (out, aux) = layer.forward_with_aux(x, Some(&packed(cfg.document_alignment(), &device)));
    let out = to_vec(out);
    let sets = selection_sets(aux.blocks);
    let weights = weights_of(&layer);
    for (b, s, e) in spans() {
        let alone = nsa_reference(&cfg, &weights, &[rows[b][s * cfg.dim..e * cfg.dim].to_vec()], e - s);
        let got = &out[(b * T + s) * cfg.dim..(b * T + e) * cfg.dim];
        let err = max_rel_err(got, &alone.output[0]);
        assert!(err <= 1e-9, "row {b}, document {s}..{e}: output differs from it alone by {err:e}");
        let first = s / cfg.l_sel;
        for (kh, queries) in sets[b].iter().enumerate() {
            for (t, got) in queries.iter().enumerate().take(e).skip(s) {
                let want: Vec<usize> = alone.selected[0][kh][t - s].iter().map(|j| j + first).collect();
                assert_eq!(*got, want, "row {b}, kv head {kh}, query {t}: selected blocks differ");
            }
        }
    }
}

/// Every float parameter's gradient, in visiting order.
struct Grads<'a, B: AutodiffBackend> {
    grads: &'a B::Gradients,
    out: Vec<Vec<f64>>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Grads<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        self.out.push(param.val().grad(self.grads).map(to_vec).unwrap_or_default());
    }
}

fn param_grads<B: AutodiffBackend, M: Module<B>>(module: &M, grads: &B::Gradients) -> Vec<Vec<f64>> {
    let mut visitor = Grads::<B> { grads, out: Vec::new() };
    module.visit(&mut visitor);
    visitor.out
}

/// A packed batch's input (tracking its gradient) and a random seed for its output's gradient.
fn input_and_seed<B: AutodiffBackend>(
    rng: &mut rand::rngs::StdRng,
    dim: usize,
    device: &B::Device,
) -> (Tensor<B, 3>, Tensor<B, 3>) {
    let (x, _) = random_input::<B>(rng, ROWS.len(), T, dim, device);
    let seed = Tensor::from_data(TensorData::new(normal(rng, ROWS.len() * T * dim, 1.0), [ROWS.len(), T, dim]), device);
    (x.require_grad(), seed)
}

#[test]
fn a_packed_row_has_the_gradients_of_its_documents_alone() {
    let cfg = layer_config();
    let device = Default::default();
    let mut rng = fresh_rng("packed_gradients");
    let layer: NsaAttention<A64> = randomized(NsaAttentionConfig::new(cfg.clone(), T).init(&device), &mut rng, 0.4);
    let (x, seed) = input_and_seed::<A64>(&mut rng, cfg.dim, &device);
    let documents = packed(cfg.document_alignment(), &device);
    let grads = (layer.forward_with_aux(x.clone(), Some(&documents)).0 * seed.clone()).sum().backward();
    let packed_dx = to_vec(x.grad(&grads).unwrap());
    let packed_params = param_grads(&layer, &grads);

    let mut summed: Vec<Vec<f64>> = packed_params.iter().map(|g| vec![0.0; g.len()]).collect();
    for doc in spans() {
        let (b, s, e) = doc;
        let x_doc = Tensor::<A64, 3>::from_data(slice(&x, doc).into_data(), &device).require_grad();
        let grads = (layer.forward(x_doc.clone()) * slice(&seed, doc)).sum().backward();
        let dx = to_vec(x_doc.grad(&grads).unwrap());
        let got = &packed_dx[(b * T + s) * cfg.dim..(b * T + e) * cfg.dim];
        let err = max_rel_err(got, &dx);
        assert!(err <= 1e-9, "row {b}, document {s}..{e}: input gradient differs from it alone by {err:e}");
        for (total, alone) in summed.iter_mut().zip(param_grads(&layer, &grads)) {
            for (t, a) in total.iter_mut().zip(alone) {
                *t += a;
            }
        }
    }
    for (i, (got, want)) in packed_params.iter().zip(&summed).enumerate() {
        let err = max_rel_err(got, want);
        assert!(err <= 1e-9, "parameter {i}: gradient differs from the documents' sum by {err:e}");
    }
}

#[test]
fn a_packed_model_gives_each_document_its_own_logits_and_loss() {
    for attention in [AttentionKind::Nsa, AttentionKind::Dense] {
        let cfg = NsaLmConfig::new()
            .with_vocab_size(40)
            .with_n_layers(2)
            .with_seq_len(T)
            .with_attention(layer_config().with_attention(attention));
        cfg.validate().unwrap();
        let device = Default::default();
        let mut rng = fresh_rng("packed_model");
        let model: NsaLm<B64> = cfg.init(&device);
        let tokens: Vec<i64> = (0..ROWS.len() * T).map(|_| rng.random_range(0..40)).collect();
        let tokens = Tensor::<B64, 2, Int>::from_data(TensorData::new(tokens, [ROWS.len(), T]), &device);
        let documents = packed(cfg.attention.document_alignment(), &device);
        let logits = model.forward_with_aux(tokens.clone(), Some(&documents)).0;
        for (b, s, e) in spans() {
            let alone = to_vec(model.forward(tokens.clone().slice([b..b + 1, s..e])));
            let got = to_vec(logits.clone().slice([b..b + 1, s..e]));
            let err = max_rel_err(&got, &alone);
            assert!(err <= 1e-9, "{attention:?}, row {b}, document {s}..{e}: logits differ from it alone by {err:e}");
        }

        // Targets of -1 are left out of the loss: the mean over the others.
        let targets: Vec<i64> = (0..ROWS.len() * T).map(|i| if i % 3 == 0 { -1 } else { (i % 40) as i64 }).collect();
        let loss =
            to_vec(lm_loss(logits.clone(), Tensor::from_data(TensorData::new(targets.clone(), [2, T]), &device)));
        let flat = to_vec(logits);
        let mut want = Vec::new();
        for (i, &target) in targets.iter().enumerate().filter(|(_, &t)| t >= 0) {
            let row = &flat[i * 40..(i + 1) * 40];
            let max = row.iter().cloned().fold(f64::MIN, f64::max);
            let norm = row.iter().map(|v| (v - max).exp()).sum::<f64>().ln() + max;
            want.push(norm - row[target as usize]);
        }
        let want = want.iter().sum::<f64>() / want.len() as f64;
        assert!((loss[0] - want).abs() <= 1e-9 * want.abs(), "{attention:?}: loss {} against {want}", loss[0]);
    }
}

/// The fused kernels on packed rows (the window's and the compressed branch's, the selection's)
/// against the reference path on the same device: outputs and selected blocks. The kernels'
/// gradients on packed rows, through autodiff and fusion, are checked kernel by kernel against
/// float64 loops (`kernels.rs`, `compressed.rs`); this checks that the layer hands every kernel
/// its documents. It runs at `small_config`'s head shape, whose other kernels the suite's
/// unpacked layer test compiles already (on lavapipe each new kernel costs seconds to minutes).
#[test]
fn the_wgpu_kernels_keep_to_each_document() {
    type Wgpu = CubeBackend<WgpuRuntime, f32, i32, u32>;
    let (cfg, device) = (small_config(), WgpuDevice::default());
    let mut rng = fresh_rng("wgpu_kernels_keep_to_each_document");
    let fused: NsaAttention<Wgpu> = randomized(NsaAttentionConfig::new(cfg.clone(), T).init(&device), &mut rng, 0.4);
    let mut reference = fused.clone();
    reference.config.fused_kernels = false;
    let (x, _) = random_input::<Wgpu>(&mut rng, ROWS.len(), T, cfg.dim, &device);
    let documents = packed(cfg.document_alignment(), &device);
    let run = |layer: &NsaAttention<Wgpu>| {
        let (out, aux) = layer.forward_with_aux(x.clone(), Some(&documents));
        (to_vec(out), selection_sets(aux.blocks))
    };
    let (out, blocks) = run(&fused);
    let (want_out, want_blocks) = run(&reference);
    assert_eq!(blocks, want_blocks, "selected blocks");
    let err = max_rel_err(&out, &want_out);
    assert!(err <= 1e-5, "outputs differ from the reference path by {err:e}");
}

/// The dense layer on the fused window kernels (a window as long as the row) against its
/// reference path on the same device, unpacked and packed: outputs, and the gradients of the
/// input and of every weight.
#[test]
fn the_dense_layer_on_the_wgpu_window_kernels_matches_its_reference() {
    type Wgpu = Autodiff<CubeBackend<WgpuRuntime, f32, i32, u32>>;
    let (cfg, device) = (layer_config(), WgpuDevice::default());
    let mut rng = fresh_rng("dense_layer_on_the_window_kernels");
    let fused: DenseAttention<Wgpu> =
        randomized(DenseAttentionConfig::new(cfg.clone(), T).init(&device), &mut rng, 0.4);
    let mut reference = fused.clone();
    reference.config.fused_kernels = false;
    let (x, seed) = input_and_seed::<Wgpu>(&mut rng, cfg.dim, &device);
    let documents = packed(cfg.document_alignment(), &device);
    for documents in [None, Some(&documents)] {
        let run = |layer: &DenseAttention<Wgpu>| {
            let out = layer.forward(x.clone(), documents);
            let grads = (out.clone() * seed.clone()).sum().backward();
            let mut all = vec![to_vec(out), to_vec(x.grad(&grads).unwrap())];
            all.extend(param_grads(layer, &grads));
            all
        };
        let (got, want) = (run(&fused), run(&reference));
        for (i, (got, want)) in got.iter().zip(&want).enumerate() {
            let err = max_rel_err(got, want);
            let what = ["output", "input gradient"].get(i).copied().unwrap_or("a weight's gradient");
            assert!(err <= 1e-5, "packed {}: {what} ({i}) differs from the reference by {err:e}", documents.is_some());
        }
    }
}

#[test]
fn document_starts_are_checked() {
    let check = |starts: &[i64]| Documents::<B64>::check(starts, [1, starts.len()], 4);
    assert!(check(&[0, 0, 0, 0, 4, 4]).is_ok());
    for bad in [&[0, 0, 2, 2][..], &[0, 0, 0, 0, 4, 0], &[4, 4, 4, 4], &[0, 0, 0, 0, 0, 4]] {
        let err = check(bad).expect_err("invalid starts are refused");
        assert!(!err.contains('\n'), "one line: {err}");
    }
}
