//! Properties of the top-n selection: group consistency, forced blocks, deterministic ties.

use burn::module::Param;
use burn::tensor::{Tensor, TensorData};
use nsa_core::attention::selection::select_top_n;
use nsa_core::{NsaAttention, NsaAttentionConfig, NsaConfig};
use nsa_tests::reference::select_blocks;
use nsa_tests::{fresh_rng, normal, random_input, randomized, selection_sets, small_config, to_vec, B64};

/// A selection mask `[B, H, T, nb]` as the selected blocks of each row `(b, h, t)`.
fn mask_sets(mask: Tensor<B64, 4, burn::tensor::Bool>) -> Vec<Vec<usize>> {
    let [_, _, _, nb] = mask.dims();
    let flat: Vec<bool> = mask.into_data().to_vec().unwrap();
    flat.chunks(nb).map(|row| (0..nb).filter(|j| row[*j]).collect()).collect()
}

fn cfg() -> NsaConfig {
    small_config().with_n_heads(6).with_n(5).with_w(8)
}

/// Swaps query heads inside each KV group (W_q columns): per-head scores move between heads
/// but their group sum, and so the selection, must not change.
#[test]
fn selection_depends_only_on_the_group_sum() {
    let cfg = cfg();
    let device = Default::default();
    let mut rng = fresh_rng("group_consistency");
    let t = 80;
    let layer: NsaAttention<B64> = randomized(NsaAttentionConfig::new(cfg.clone(), t).init(&device), &mut rng, 0.4);
    let (x, _) = random_input::<B64>(&mut rng, 1, t, cfg.dim, &device);
    let (_, before) = layer.forward_with_aux(x.clone(), None);

    let (g, dk) = (cfg.group_size(), cfg.d_k);
    let w = layer.query.weight.val();
    let [rows, cols] = w.dims();
    let old = to_vec(w);
    let mut new = old.clone();
    for r in 0..rows {
        for c in 0..cols {
            // Head h -> head (h rotated by one within its group).
            let (head, a) = (c / dk, c % dk);
            let (kv, gi) = (head / g, head % g);
            let src = (kv * g + (gi + 1) % g) * dk + a;
            new[r * cols + c] = old[r * cols + src];
        }
    }
    let mut permuted = layer.clone();
    permuted.query.weight = Param::from_tensor(Tensor::from_data(TensorData::new(new, [rows, cols]), &device));
    let (_, after) = permuted.forward_with_aux(x, None);
    assert_eq!(selection_sets(before.blocks), selection_sets(after.blocks));
}

#[test]
fn forced_blocks_always_selected_and_counts_are_exact() {
    let cfg = cfg();
    let device = Default::default();
    let mut rng = fresh_rng("forced_blocks");
    let t = 90;
    let layer: NsaAttention<B64> = randomized(NsaAttentionConfig::new(cfg.clone(), t).init(&device), &mut rng, 0.4);
    let (x, _) = random_input::<B64>(&mut rng, 2, t, cfg.dim, &device);
    let (_, aux) = layer.forward_with_aux(x, None);
    for (row, blocks) in selection_sets(aux.blocks).concat().concat().iter().enumerate() {
        let q = row % t;
        let current = q / cfg.l_sel;
        assert!(blocks.contains(&0), "query {q}: block 0 missing from {blocks:?}");
        assert!(blocks.contains(&current), "query {q}: current block missing from {blocks:?}");
        if current >= 1 {
            assert!(blocks.contains(&(current - 1)), "query {q}: previous block missing from {blocks:?}");
        }
        assert!(blocks.iter().all(|j| *j <= current), "query {q}: a future block in {blocks:?}");
        assert_eq!(blocks.len(), cfg.n.min(current + 1), "query {q}: wrong count in {blocks:?}");
    }
}

/// All-equal scores: the free slots go to the lowest-index candidates, identically every run.
#[test]
fn ties_go_to_the_lower_block_index_deterministically() {
    let device = Default::default();
    let (t, nb, l_sel, n) = (100, 10, 10, 6);
    let scores = Tensor::<B64, 4>::ones([1, 1, t, nb], &device);
    let first = mask_sets(select_top_n(scores.clone(), l_sel, n, None));
    for (q, blocks) in first.iter().enumerate() {
        let current = q / l_sel;
        let mut want: Vec<usize> = vec![0];
        want.extend((1..current.saturating_sub(1)).take(n.saturating_sub(3)));
        want.extend([current.saturating_sub(1), current]);
        want.sort();
        want.dedup();
        assert_eq!(blocks, &want, "query {q}");
    }
    for _ in 0..3 {
        assert_eq!(mask_sets(select_top_n(scores.clone(), l_sel, n, None)), first);
    }
}

/// Random scores with planted exact ties: the tensor top-n equals the reference sort.
#[test]
fn top_n_matches_the_reference_on_random_scores_with_ties() {
    let device = Default::default();
    let mut rng = fresh_rng("top_n_random");
    let (t, nb, l_sel, n) = (120, 15, 8, 5);
    // Values on a coarse grid, so many scores tie exactly.
    let values: Vec<f64> = normal(&mut rng, t * nb, 1.0).iter().map(|v| (v * 2.0).round()).collect();
    let scores = Tensor::<B64, 4>::from_data(TensorData::new(values.clone(), [1, 1, t, nb]), &device);
    let got = mask_sets(select_top_n(scores, l_sel, n, None));
    for q in 0..t {
        assert_eq!(got[q], select_blocks(q, &values[q * nb..(q + 1) * nb], l_sel, n), "query {q}");
    }
}
