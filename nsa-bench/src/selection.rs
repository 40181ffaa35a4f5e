//! `nsa-bench selection`: the block selection kernel (`nsa_kernels::select_blocks`: the spec's
//! scores and top-n in one pass) on the device, at the production shape and geometry.
//!
//! Per length: the kernel's f32 lists against the float64 reference on the CPU (scores by
//! `nsa_kernels::sparse::reference::block_scores`, top-n by nsa-core's tensor-op rank; up to
//! `--check-len`, as the reference materialises `T x n_sel^2` booleans), skipping only rows
//! whose reference cut is a near-tie f32 cannot rank; the share of rows whose bf16 selection
//! (bf16 q and keys, the bf16 branch's log-sum-exp; the tensor-core kernel on CUDA) differs
//! from the f32 one, and its lists against the f64 reference fed the same bf16 values; and
//! the kernels' synced median times. Inputs are standard normal `q` and compressed keys (scores of order 1,
//! so selections are decided, not near-uniform).

use burn::tensor::backend::Backend;
use burn::tensor::{DType, Distribution, Int, Tensor};
use nsa_kernels::{select_blocks, sparse_attention, Documents, Keys, Selection, SparseAttentionBackend};
use serde::Serialize;

use crate::timing::median_ms;

/// The production shape: 12 query heads on 2 KV heads of 64, `l = 32, d = 16, l' = 64, n = 16`.
const H_Q: usize = 12;
const H_KV: usize = 2;
const D: usize = 64;
const SELECTION: Selection = Selection { length: 32, stride: 16, block_size: 64, n: 16 };
/// The selection block, which packed documents start on a multiple of.
pub const BLOCK: usize = SELECTION.block_size;
/// Relative score gap under which f32 may rank two blocks either way.
const NEAR_TIE: f64 = 1e-5;
/// The same for the bf16 path, whose products accumulate in the tensor cores' order.
const NEAR_TIE_BF16: f64 = 1e-4;

#[derive(Serialize, Debug)]
pub struct SelectionRow {
    pub t: usize,
    /// Query rows `(t, KV head)`.
    pub rows: usize,
    pub f32_ms: f64,
    /// Against the f64 reference: rows compared, rows that differ, near-tie rows skipped.
    pub checked: Option<usize>,
    pub mismatches: Option<usize>,
    pub near_ties: Option<usize>,
    /// bf16 against f32 (CUDA only).
    pub bf16_ms: Option<f64>,
    pub bf16_flips: Option<usize>,
    /// The bf16 lists against the f64 reference fed the same bf16 values: rows compared, rows
    /// that differ, near-tie rows skipped.
    pub bf16_checked: Option<usize>,
    pub bf16_mismatches: Option<usize>,
    pub bf16_near_ties: Option<usize>,
}

impl SelectionRow {
    pub fn ok(&self) -> bool {
        self.mismatches.unwrap_or(0) == 0 && self.bf16_mismatches.unwrap_or(0) == 0
    }
}

/// The compressed branch's inputs at length `t` in `dtype`, and its log-sum-exp from the fused
/// forward.
fn inputs<B: Backend + SparseAttentionBackend>(
    q: &Tensor<B, 4>,
    k: &Tensor<B, 4>,
    dtype: DType,
    documents: Option<&Documents<B>>,
) -> (Tensor<B, 4>, Tensor<B, 4>, Tensor<B, 3>) {
    let (q, k) = (q.clone().cast(dtype), k.clone().cast(dtype));
    let keys = Keys::compressed(SELECTION.length, SELECTION.stride, documents);
    let (_, lse) = sparse_attention(q.clone(), k.clone(), k.clone(), &keys);
    (q, k, lse)
}

fn lists<B: Backend + SparseAttentionBackend>(
    q: &Tensor<B, 4>,
    k: &Tensor<B, 4>,
    lse: &Tensor<B, 3>,
    documents: Option<&Documents<B>>,
) -> Tensor<B, 4, Int> {
    select_blocks(q.clone(), k.clone(), lse.clone(), SELECTION, documents)
        .expect("the backend has the selection kernel")
}

/// Each position's document start for documents of `len` tokens.
fn starts(t: usize, len: usize) -> Vec<i64> {
    (0..t).map(|pos| (pos / len * len) as i64).collect()
}

fn host_ints<B: Backend>(t: Tensor<B, 4, Int>) -> Vec<i64> {
    t.into_data().convert::<i64>().to_vec::<i64>().expect("int tensor data")
}

pub fn bench_selection<B: Backend + SparseAttentionBackend>(
    device: &B::Device,
    lengths: &[usize],
    check_len: usize,
    iters: usize,
    bf16: bool,
    document_len: Option<usize>,
) -> Vec<SelectionRow> {
    lengths
        .iter()
        .map(|&t| {
            let n_keys = (t.max(SELECTION.length) - SELECTION.length) / SELECTION.stride + 1;
            let q = Tensor::<B, 4>::random([1, t, H_Q, D], Distribution::Normal(0.0, 1.0), device);
            let k = Tensor::<B, 4>::random([1, n_keys, H_KV, D], Distribution::Normal(0.0, 1.0), device);
            let starts = document_len.map(|len| starts(t, len));
            let documents = starts.clone().map(|starts| {
                Documents::from_starts(starts, [1, t], BLOCK, device).expect("starts on block multiples")
            });
            let docs = documents.as_ref();
            let (q32, k32, lse32) = inputs(&q, &k, DType::F32, docs);
            let f32_lists = lists(&q32, &k32, &lse32, docs);
            let f32_ms = median_ms::<B>(device, iters, || drop(lists(&q32, &k32, &lse32, docs)));
            let got = host_ints(f32_lists);
            let check = (t <= check_len)
                .then(|| check_against_f64(&q32, &k32, &lse32, &got, NEAR_TIE, starts.as_deref()))
                .flatten();
            let (checked, mismatches, near_ties) = (check.map(|c| c.0), check.map(|c| c.1), check.map(|c| c.2));
            let mut row = SelectionRow {
                t,
                rows: t * H_KV,
                f32_ms,
                checked,
                mismatches,
                near_ties,
                bf16_ms: None,
                bf16_flips: None,
                bf16_checked: None,
                bf16_mismatches: None,
                bf16_near_ties: None,
            };
            if bf16 {
                let (qb, kb, lseb) = inputs(&q, &k, DType::BF16, docs);
                let bf16_got = host_ints(lists(&qb, &kb, &lseb, docs));
                let flips = bf16_got.chunks(SELECTION.n).zip(got.chunks(SELECTION.n)).filter(|(a, b)| a != b).count();
                row.bf16_flips = Some(flips);
                row.bf16_ms = Some(median_ms::<B>(device, iters, || drop(lists(&qb, &kb, &lseb, docs))));
                let check = (t <= check_len)
                    .then(|| check_against_f64(&qb, &kb, &lseb, &bf16_got, NEAR_TIE_BF16, starts.as_deref()))
                    .flatten();
                row.bf16_checked = check.map(|c| c.0);
                row.bf16_mismatches = check.map(|c| c.1);
                row.bf16_near_ties = check.map(|c| c.2);
            }
            println!("{row:?}");
            row
        })
        .collect()
}

/// The kernel's lists `got` (`[1, T, H_kv, n]` flat) against the f64 reference on the CPU fed the
/// same values (and document `starts`): `(rows compared, rows that differ, near-tie rows
/// skipped)`; `None` without the `cpu` feature.
#[cfg(not(feature = "cpu"))]
fn check_against_f64<B: Backend>(
    _: &Tensor<B, 4>,
    _: &Tensor<B, 4>,
    _: &Tensor<B, 3>,
    _: &[i64],
    _: f64,
    _: Option<&[i64]>,
) -> Option<(usize, usize, usize)> {
    None
}

#[cfg(feature = "cpu")]
fn check_against_f64<B: Backend>(
    q: &Tensor<B, 4>,
    k: &Tensor<B, 4>,
    lse: &Tensor<B, 3>,
    got: &[i64],
    near: f64,
    starts: Option<&[i64]>,
) -> Option<(usize, usize, usize)> {
    use nsa_core::attention::selection::{select_top_n, selected_list};
    type Cpu = burn::backend::NdArray<f64>;
    let cpu = Default::default();
    let to_cpu4 = |x: &Tensor<B, 4>| Tensor::<Cpu, 4>::from_data(x.to_data().convert::<f64>(), &cpu);
    let lse = Tensor::<Cpu, 3>::from_data(lse.to_data().convert::<f64>(), &cpu);
    let t_len = q.dims()[1];
    let documents = starts.map(|starts| {
        Documents::<Cpu>::from_starts(starts.to_vec(), [1, t_len], BLOCK, &cpu).expect("starts on block multiples")
    });
    let s = SELECTION;
    let scores = nsa_kernels::sparse::reference::block_scores(to_cpu4(q), to_cpu4(k), lse, s, documents.as_ref());
    let [_, h_kv, t_len, nb] = scores.dims();
    let values = scores.to_data().convert::<f64>().to_vec::<f64>().expect("float data");
    let want = host_ints(selected_list(select_top_n(scores, s.block_size, s.n, documents.as_ref()), s.n));
    let (mut checked, mut mismatches, mut near_ties) = (0, 0, 0);
    for hk in 0..h_kv {
        for t in 0..t_len {
            let at = (t * h_kv + hk) * s.n;
            let row = &values[(hk * t_len + t) * nb..][..nb];
            let first = starts.map_or(0, |starts| starts[t] as usize / BLOCK);
            if near_tie(t, first, row, &want[at..at + s.n], near) {
                near_ties += 1;
                continue;
            }
            checked += 1;
            mismatches += usize::from(got[at..at + s.n] != want[at..at + s.n]);
        }
    }
    Some((checked, mismatches, near_ties))
}

#[cfg(feature = "cpu")]
/// Whether the lowest score taken on merit and the highest left out are within `near` of the
/// row's top score (blocks from the document's `first` on).
fn near_tie(t: usize, first: usize, scores: &[f64], chosen: &[i64], near: f64) -> bool {
    let current = t / SELECTION.block_size;
    let merit = |j: usize| j != first && j != current && j + 1 != current;
    let taken = |j: usize| chosen.contains(&(j as i64));
    let eligible = first + 1..=current;
    let low = eligible.clone().filter(|&j| merit(j) && taken(j)).map(|j| scores[j]).fold(f64::INFINITY, f64::min);
    let high = eligible.filter(|&j| merit(j) && !taken(j)).map(|j| scores[j]).fold(f64::NEG_INFINITY, f64::max);
    let top = scores.iter().cloned().fold(0.0, f64::max);
    (low - high).abs() <= near * top
}
