//! The decode step's kernel (`nsa_kernels::decode_attention`: the three branches and the block
//! selection for one query per sequence) on WGPU (Mesa lavapipe in CI, f32) against float64
//! loops of the spec on fresh random caches: outputs to 1e-4, block lists identical (a row whose
//! reference scores nearly tie at the cut is not compared, and such rows must be rare).
//!
//! The shapes cross every boundary of the kernels: in every branch more keys than one tile (64
//! rows) and a partly filled last tile, more compressed tiles than a merge takes in one pass, a
//! partly visible selected block, selection blocks
//! smaller than a tile and larger (a block over two tiles, the second partly filled), a wrapped
//! window ring, a value width that is not a multiple of the lanes, an odd group, and rows at
//! different positions in one batch, one before any compressed block exists.

use burn::tensor::{Int, Tensor, TensorData};
use nsa_kernels::{decode_attention, Selection};
use nsa_tests::reference::select_blocks as reference_top_n;
use nsa_tests::{fresh_rng, max_rel_err, normal, to_vec};

type Wgpu = burn::backend::Wgpu;

const H_KV: usize = 2;
const G: usize = 3;
const D_K: usize = 12;
const D_V: usize = 40;
const MAX_LEN: usize = 3200;
const RING: usize = 300;
const NEAR_TIE: f64 = 1e-5;

/// A cache `[B, H_kv, S, d]` of standard normal draws, flat.
struct Cache {
    rows: usize,
    d: usize,
    data: Vec<f64>,
}

impl Cache {
    fn new(rng: &mut rand::rngs::StdRng, batch: usize, rows: usize, d: usize) -> Self {
        Cache { rows, d, data: normal(rng, batch * H_KV * rows * d, 1.0) }
    }

    fn row(&self, b: usize, hk: usize, i: usize) -> &[f64] {
        &self.data[((b * H_KV + hk) * self.rows + i) * self.d..][..self.d]
    }

    fn tensor(&self, batch: usize) -> Tensor<Wgpu, 4> {
        let shape = [batch, H_KV, self.rows, self.d];
        Tensor::from_data(TensorData::new(self.data.iter().map(|&x| x as f32).collect(), shape), &Default::default())
    }
}

/// Softmax attention of `q` over `keys` (row indices into `k`/`v`): the output and, per key,
/// the probability.
fn attend(q: &[f64], k: &Cache, v: &Cache, b: usize, hk: usize, keys: &[usize]) -> (Vec<f64>, Vec<f64>) {
    let scores: Vec<f64> = keys
        .iter()
        .map(|&i| q.iter().zip(k.row(b, hk, i)).map(|(a, c)| a * c).sum::<f64>() / (D_K as f64).sqrt())
        .collect();
    let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let exp: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
    let sum: f64 = exp.iter().sum();
    let probs: Vec<f64> = exp.iter().map(|e| e / sum).collect();
    let mut out = vec![0.0; D_V];
    for (p, &i) in probs.iter().zip(keys) {
        out.iter_mut().zip(v.row(b, hk, i)).for_each(|(o, x)| *o += p * x);
    }
    (out, probs)
}

/// The spec's decode step for row `b` at position `t`: outputs `[3][G][D_V]` of KV head `hk`,
/// its blocks, and whether the cut is a near-tie.
fn reference(
    s: Selection,
    q: &[f64],
    caches: &[Cache; 6],
    b: usize,
    hk: usize,
    t: usize,
) -> ([Vec<Vec<f64>>; 3], Vec<usize>, bool) {
    let [ck, cv, sk, sv, wk, wv] = caches;
    let head = |h: usize| &q[((b * H_KV + hk) * G + h) * D_K..][..D_K];
    let visible: Vec<usize> = match t + 1 >= s.length {
        true => (0..((t + 1 - s.length) / s.stride + 1).min(ck.rows)).collect(),
        false => Vec::new(),
    };
    let compressed: Vec<_> = (0..G).map(|h| attend(head(h), ck, cv, b, hk, &visible)).collect();
    let mut scores = vec![0.0; MAX_LEN.div_ceil(s.block_size)];
    for (m, &i) in visible.iter().enumerate() {
        let p: f64 = compressed.iter().map(|(_, probs)| probs[m]).sum();
        for (j, score) in scores.iter_mut().enumerate() {
            let (lo, hi) =
                ((i * s.stride).max(j * s.block_size), (i * s.stride + s.length).min((j + 1) * s.block_size));
            if lo < hi {
                *score += p * (hi - lo) as f64 / s.length as f64;
            }
        }
    }
    let blocks = reference_top_n(t, &scores, s.block_size, s.n);
    let current = t / s.block_size;
    let chosen = &blocks;
    let merit = |taken: bool| {
        let forced = |j: usize| j == 0 || j == current || j + 1 == current;
        (0..=current).filter(move |&j| !forced(j) && chosen.contains(&j) == taken)
    };
    let low = merit(true).map(|j| scores[j]).fold(f64::INFINITY, f64::min);
    let high = merit(false).map(|j| scores[j]).fold(f64::NEG_INFINITY, f64::max);
    let near_tie = (low - high).abs() <= NEAR_TIE * scores.iter().cloned().fold(0.0, f64::max);
    let selected: Vec<usize> =
        blocks.iter().flat_map(|&j| j * s.block_size..((j + 1) * s.block_size).min(t + 1)).collect();
    let window: Vec<usize> = (0..(t + 1).min(RING)).collect();
    let outputs = [
        compressed.into_iter().map(|(o, _)| o).collect(),
        (0..G).map(|h| attend(head(h), sk, sv, b, hk, &selected).0).collect(),
        (0..G).map(|h| attend(head(h), wk, wv, b, hk, &window).0).collect(),
    ];
    (outputs, blocks, near_tie)
}

#[test]
fn decode_kernel_matches_the_spec_on_wgpu() {
    // Blocks of half a tile, then of a tile and a half.
    check(Selection { length: 8, stride: 4, block_size: 32, n: 10 }, [1300, 5, 77, 1399]);
    check(Selection { length: 16, stride: 8, block_size: 96, n: 5 }, [1250, 14, 130, 1399]);
    // A compressed key per position: more tiles than a merge's units take in one pass.
    check(Selection { length: 8, stride: 1, block_size: 32, n: 10 }, [3150, 5, 77, 3199]);
    // More selection blocks (394) than the top-n's cube has units (256): a unit scans several.
    check(Selection { length: 8, stride: 4, block_size: 8, n: 10 }, [3150, 5, 77, 3199]);
}

fn check(selection: Selection, positions: [usize; 4]) {
    let mut rng = fresh_rng("decode_kernel_matches_the_spec_on_wgpu");
    let batch = positions.len();
    let n_compressed = (MAX_LEN - selection.length) / selection.stride + 1;
    let caches = [
        Cache::new(&mut rng, batch, n_compressed, D_K),
        Cache::new(&mut rng, batch, n_compressed, D_V),
        Cache::new(&mut rng, batch, MAX_LEN, D_K),
        Cache::new(&mut rng, batch, MAX_LEN, D_V),
        Cache::new(&mut rng, batch, RING, D_K),
        Cache::new(&mut rng, batch, RING, D_V),
    ];
    let q = normal(&mut rng, batch * H_KV * G * D_K, 1.0);
    let device = Default::default();
    let q_tensor = Tensor::<Wgpu, 4>::from_data(
        TensorData::new(q.iter().map(|&x| x as f32).collect(), [batch, 1, H_KV * G, D_K]),
        &device,
    );
    let t: Vec<i64> = positions.iter().map(|&t| t as i64).collect();
    let at = Tensor::<Wgpu, 1, Int>::from_data(TensorData::new(t, [batch]), &device);
    let tensors: Vec<Tensor<Wgpu, 4>> = caches.iter().map(|c| c.tensor(batch)).collect();
    let pairs = [(&tensors[0], &tensors[1]), (&tensors[2], &tensors[3]), (&tensors[4], &tensors[5])];
    let (outputs, blocks) = decode_attention(q_tensor, pairs, at, selection).expect("WGPU runs the decode kernel");
    let outputs = outputs.map(to_vec);
    let blocks: Vec<i64> = blocks.into_data().convert::<i64>().to_vec().unwrap();

    let mut near_ties = 0;
    for (b, &t) in positions.iter().enumerate() {
        for hk in 0..H_KV {
            let (want, want_blocks, near_tie) = reference(selection, &q, &caches, b, hk, t);
            for (branch, (got, want)) in outputs.iter().zip(&want).enumerate() {
                for (h, want) in want.iter().enumerate() {
                    let got = &got[((b * H_KV + hk) * G + h) * D_V..][..D_V];
                    let err = max_rel_err(got, want);
                    assert!(err <= 1e-4, "row {b} (t = {t}) head {hk}.{h} branch {branch}: differs by {err:e}");
                }
            }
            let got = &blocks[(b * H_KV + hk) * selection.n..][..selection.n];
            let mut want: Vec<i64> = want_blocks.iter().map(|&j| j as i64).collect();
            want.resize(selection.n, -1);
            if near_tie {
                near_ties += 1;
            } else {
                assert_eq!(got, &want[..], "row {b} (t = {t}) head {hk}: blocks");
            }
        }
    }
    assert!(near_ties <= 1, "{near_ties} rows of {} nearly tie at the cut", batch * H_KV);
}
