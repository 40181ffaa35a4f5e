//! The layer against the float64 loop reference: outputs and selected block sets.

use nsa_core::{NsaAttentionConfig, NsaConfig, Phi};
use nsa_tests::reference::nsa_reference;
use nsa_tests::{
    fresh_rng, max_rel_err, random_input, randomized, selection_sets, small_config, to_vec, weights_of, B64,
};

/// Small-shape base: l=8, d=4, l_sel=8, n=4, w=16.
fn base() -> NsaConfig {
    small_config()
}

/// Runs layer and reference on fresh random weights and inputs; returns how many queries had a
/// real choice to make (more candidates than free slots), so cases can assert they test top-n.
fn check(name: &str, cfg: NsaConfig, batch: usize, t: usize) -> usize {
    cfg.validate().unwrap();
    let device = Default::default();
    let mut rng = fresh_rng(name);
    let layer = randomized(NsaAttentionConfig::new(cfg.clone(), t).init::<B64>(&device), &mut rng, 0.4);
    let (x, rows) = random_input::<B64>(&mut rng, batch, t, cfg.dim, &device);
    let (out, aux) = layer.forward_with_aux(x, None);
    let expected = nsa_reference(&cfg, &weights_of(&layer), &rows, t);

    let err = max_rel_err(&to_vec(out), &expected.output.concat());
    assert!(err <= 1e-5, "{name}: output differs from the reference by {err:e} (relative)");

    let sets = selection_sets(aux.blocks);
    let mut contested = 0;
    assert_eq!((sets.len(), sets[0].len(), sets[0][0].len()), (batch, cfg.n_kv_heads, t));
    for (b, heads) in sets.iter().enumerate() {
        for (kh, queries) in heads.iter().enumerate() {
            for (q, got) in queries.iter().enumerate() {
                let want = &expected.selected[b][kh][q];
                assert_eq!(got, want, "{name}: batch {b}, kv head {kh}, query {q}: selected blocks differ");
                contested += usize::from(q / cfg.l_sel + 1 > cfg.n);
            }
        }
    }
    contested
}

#[test]
fn parity_t_below_l_has_no_compressed_block() {
    check("t_below_l", base().with_w(4), 1, 6);
}

#[test]
fn parity_t_below_l_sel_single_partial_block() {
    check("t_below_l_sel", base().with_l_sel(16).with_w(32), 1, 13);
}

#[test]
fn parity_t_below_w() {
    check("t_below_w", base().with_w(64), 1, 37);
}

#[test]
fn parity_ragged_t_not_multiple_of_d_l_l_sel() {
    // 70 = 17*4 + 2 = 8*8 + 6: ragged against d, l and l_sel; 9 selection blocks, n = 4.
    let contested = check("ragged", base(), 1, 70);
    assert!(contested > 0, "the case must exercise the top-n, not only forced blocks");
}

#[test]
fn parity_non_overlapping_compression_l_equals_d() {
    check("l_equals_d", base().with_l(8).with_d(8).with_l_sel(16).with_n(3), 1, 75);
}

#[test]
fn parity_group_size_1() {
    check("g1", base().with_n_heads(2).with_n_kv_heads(2), 1, 50);
}

#[test]
fn parity_group_size_6() {
    check("g6", base().with_n_heads(12).with_n_kv_heads(2).with_d_k(4).with_d_v(4), 1, 50);
}

#[test]
fn parity_group_size_16() {
    check("g16", base().with_n_heads(16).with_n_kv_heads(1).with_d_k(4).with_d_v(4), 1, 50);
}

#[test]
fn parity_d_k_differs_from_d_v() {
    check("dk_ne_dv", base().with_d_k(12).with_d_v(6), 1, 45);
}

#[test]
fn parity_batch_of_two_different_sequences() {
    let contested = check("batch2", base(), 2, 61);
    assert!(contested > 0);
}

#[test]
fn parity_phi_linear_with_trained_weights() {
    let contested = check("phi_linear", base().with_phi(Phi::Linear), 2, 66);
    assert!(contested > 0);
}

#[test]
fn parity_phi_linear_short_and_ragged() {
    check("phi_linear_short", base().with_phi(Phi::Linear).with_d_k(6).with_d_v(10), 1, 11);
}

#[test]
fn parity_phi_mlp_with_trained_weights() {
    let contested = check("phi_mlp", base().with_phi(Phi::Mlp).with_phi_hidden(Some(20)), 2, 66);
    assert!(contested > 0);
}

#[test]
fn parity_phi_mlp_short_and_ragged() {
    check("phi_mlp_short", base().with_phi(Phi::Mlp).with_d_k(6).with_d_v(10), 1, 11);
}

#[test]
fn parity_shared_kv() {
    check("shared_kv", base().with_shared_kv(true), 1, 47);
}
