//! `phi = mlp` starts exactly equal to `phi = avg`.

use nsa_core::attention::compress::Compressor;
use nsa_core::{NsaAttention, NsaConfig, Phi};
use nsa_tests::{fresh_rng, max_rel_err, random_input, randomized, to_vec, B64};

#[test]
fn mlp_phi_at_initialisation_equals_avg() {
    let cfg = NsaConfig::new()
        .with_dim(24)
        .with_n_heads(4)
        .with_n_kv_heads(2)
        .with_d_k(8)
        .with_d_v(12)
        .with_l(8)
        .with_d(4)
        .with_l_sel(8)
        .with_n(4)
        .with_w(12);
    let (t, device) = (57, Default::default());
    let mut rng = fresh_rng("phi_init");
    // Random everything else, then the freshly initialised compressors of each kind.
    let random: NsaAttention<B64> = randomized(cfg.init_nsa(t, 0.02, 0.02, &device), &mut rng, 0.4);
    let with_phi = |phi| {
        let mut layer = random.clone();
        layer.compressor = Compressor::new(phi, cfg.l, cfg.d, cfg.d_k, cfg.d_v, &device);
        layer
    };
    let (mlp, avg) = (with_phi(Phi::Mlp), with_phi(Phi::Avg));
    let (x, _) = random_input::<B64>(&mut rng, 2, t, cfg.dim, &device);

    let (out_mlp, aux_mlp) = mlp.forward_with_aux(x.clone());
    let (out_avg, aux_avg) = avg.forward_with_aux(x.clone());
    let err = max_rel_err(&to_vec(out_mlp), &to_vec(out_avg.clone()));
    assert!(err <= 1e-12, "mlp phi at init differs from avg by {err:e}");
    assert_eq!(aux_mlp.selected.into_data(), aux_avg.selected.into_data());

    // The comparison is live: a trained (random) mlp phi gives a different output.
    let mut trained = mlp;
    trained.compressor = randomized(trained.compressor, &mut rng, 0.3);
    let err = max_rel_err(&to_vec(trained.forward(x)), &to_vec(out_avg));
    assert!(err > 1e-6, "a random mlp phi should change the output");
}
