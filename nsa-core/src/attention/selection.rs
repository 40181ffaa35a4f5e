//! Block selection in tensor ops: the top-n with forced blocks and lower-index ties, and the
//! kernels' block lists (indices never leave the device). The scores (Eq. 9, the Eq. 10 group
//! sum) are `nsa_kernels::sparse::reference::block_scores`; fused backends run `nsa_kernels::select_blocks`,
//! one kernel for scores and top-n, instead.

use burn::tensor::{backend::Backend, Bool, IndexingUpdateOp, Int, Tensor};
use nsa_kernels::Documents;

use super::masks::{index_row, query_positions};
use crate::constants::cached;

/// Selection blocks covering `t` tokens.
pub fn num_selection_blocks(t: usize, l_sel: usize) -> usize {
    t.div_ceil(l_sel)
}

/// The selected blocks `[B, H_kv, T, n_sel]` for scores `[B, H_kv, T, n_sel]`.
///
/// Block `j` is eligible for query `t` when `j * l_sel <= t` and it starts in `t`'s document
/// (block 0 without `documents`). The document's first block and the local blocks `t / l_sel`
/// and `t / l_sel - 1` are always taken and count towards `n`; the rest of the `n` go to the
/// eligible blocks with the highest score, ties to the lower index.
///
/// The top-n is a rank computed by pairwise comparison (`rank(j)` = number of candidates that
/// beat `j`), exact and deterministic on every backend; it materialises `B*H_kv*T*n_sel^2`
/// booleans, small next to the reference path's `T x T` scores.
pub fn select_top_n<B: Backend>(
    scores: Tensor<B, 4>,
    l_sel: usize,
    n: usize,
    documents: Option<&Documents<B>>,
) -> Tensor<B, 4, Bool> {
    let [_, _, t, nb] = scores.dims();
    let device = scores.device();
    let query = || query_positions::<B>(t, &device).reshape([1, t, 1]);
    let (forced, candidate, remaining) = match documents {
        None => cached::<B, _>("top_n", &[t, nb, l_sel, n], &device, || {
            top_n_masks::<B>(query(), Tensor::zeros([1, t, 1], &device), nb, l_sel, n)
        }),
        Some(documents) => {
            let b = documents.starts().dims()[0];
            let first = documents.starts().div_scalar(l_sel as i64).reshape([b, t, 1]);
            top_n_masks::<B>(query().expand([b, t, 1]), first, nb, l_sel, n)
        }
    };
    let row = |r: usize| [r, 1, t, nb];
    let r = forced.dims()[0];
    take_top_n(scores, forced.reshape(row(r)), candidate.reshape(row(r)), remaining.reshape(row(r)))
}

/// The top-n of `scores: [B, H, T, nb]` given, per row, the `forced` blocks, the `candidate`
/// blocks and how many candidates it takes (`remaining`), each `[B or 1, 1, T, nb]`: the
/// forced blocks and the candidates that fewer than `remaining` candidates beat.
pub fn take_top_n<B: Backend>(
    scores: Tensor<B, 4>,
    forced: Tensor<B, 4, Bool>,
    candidate: Tensor<B, 4, Bool>,
    remaining: Tensor<B, 4, Int>,
) -> Tensor<B, 4, Bool> {
    let shape = scores.dims();
    let rank = candidate_rank(scores, candidate.clone());
    let wins = rank.lower(remaining.expand(shape));
    wins.bool_and(candidate.expand(shape)).bool_or(forced.expand(shape))
}

/// The position-only parts of [`select_top_n`], `[R, T, nb]` each, for query positions `query`
/// and their document's first block `first` (`[R, T, 1]` each): the forced blocks, the
/// candidates (eligible and not forced), and how many candidates each row may still take.
#[allow(clippy::type_complexity)]
fn top_n_masks<B: Backend>(
    query: Tensor<B, 3, Int>,
    first: Tensor<B, 3, Int>,
    nb: usize,
    l_sel: usize,
    n: usize,
) -> (Tensor<B, 3, Bool>, Tensor<B, 3, Bool>, Tensor<B, 3, Int>) {
    let [r, t, _] = query.dims();
    let shape = [r, t, nb];
    let block = index_row::<B>(nb, &query.device()).reshape([1, 1, nb]).expand(shape);
    let (query, first) = (query.expand(shape), first.expand(shape));
    let current = query.clone().div_scalar(l_sel as i64);

    let eligible =
        block.clone().mul_scalar(l_sel as i64).lower_equal(query).bool_and(block.clone().greater_equal(first.clone()));
    let is_forced = block
        .clone()
        .equal(first.clone())
        .bool_or(block.clone().equal(current.clone()))
        .bool_or(block.add_scalar(1).equal(current.clone()));
    let forced = eligible.clone().bool_and(is_forced.clone());
    let candidate = eligible.bool_and(is_forced.bool_not());
    // Distinct forced blocks: {first} in the document's first block, {first, first + 1} in its
    // second, three from its third on.
    let remaining = (current - first).clamp_max(2).add_scalar(1).neg().add_scalar(n as i64);
    (forced, candidate, remaining)
}

/// For each block, how many candidate blocks beat it: a higher score, or an equal score and a
/// lower index. `scores: [B, H, T, nb]`, `candidate: [B or 1, 1, T, nb]` -> `[B, H, T, nb]`.
fn candidate_rank<B: Backend>(scores: Tensor<B, 4>, candidate: Tensor<B, 4, Bool>) -> Tensor<B, 4, Int> {
    let [b, h, t, nb] = scores.dims();
    let device = scores.device();
    let pair = [b, h, t, nb, nb];
    // Axis 3 is the block ranked, axis 4 the rival.
    let own = scores.clone().reshape([b, h, t, nb, 1]).expand(pair);
    let rival = scores.reshape([b, h, t, 1, nb]).expand(pair);
    let rival_lower_index = cached::<B, _>("rival_lower_index", &[nb], &device, || {
        let square = [1, 1, 1, nb, nb];
        index_row::<B>(nb, &device)
            .reshape([1, 1, 1, 1, nb])
            .expand(square)
            .lower(index_row::<B>(nb, &device).reshape([1, 1, 1, nb, 1]).expand(square))
    })
    .expand(pair);
    let beats = rival
        .clone()
        .greater(own.clone())
        .bool_or(rival.equal(own).bool_and(rival_lower_index))
        .bool_and(candidate.unsqueeze_dim::<5>(3).expand(pair));
    beats.int().sum_dim(4).reshape([b, h, t, nb])
}

/// The selected blocks `[B, H_kv, T, n_sel]` as the kernels' lists `[B, T, H_kv, n]`: block
/// indices in ascending order, `-1` in unused slots. Each selected block's slot is its rank
/// among the row's selected blocks (a cumulative sum), and a scatter-add writes `j + 1` there;
/// unselected blocks add 0.
pub fn selected_list<B: Backend>(selected: Tensor<B, 4, Bool>, n: usize) -> Tensor<B, 4, Int> {
    let [b, h, t, nb] = selected.dims();
    let taken = selected.int();
    let slot = (taken.clone().cumsum(3) - 1).clamp(0, n as i64 - 1);
    let device = taken.device();
    let ids = cached::<B, _>("block_ids", &[nb], &device, || {
        index_row::<B>(nb, &device).add_scalar(1).reshape([1, 1, 1, nb])
    });
    let value = ids.expand([b, h, t, nb]) * taken;
    let list = Tensor::<B, 4, Int>::zeros([b, h, t, n], &slot.device()).scatter(3, slot, value, IndexingUpdateOp::Add);
    list.sub_scalar(1).permute([0, 2, 1, 3])
}
