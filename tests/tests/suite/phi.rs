//! `phi = linear` starts exactly equal to `phi = avg`; the chunked compression equals the
//! block gather; `phi = mlp` is held to the float64 reference in `parity.rs`.

use nsa_core::attention::compress::{Compressor, CompressorConfig};
use nsa_core::{NsaAttention, NsaAttentionConfig, NsaConfig, Phi};
use nsa_tests::{fresh_rng, max_rel_err, random_input, randomized, to_vec, B64};

#[test]
fn linear_phi_at_initialisation_equals_avg() {
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
    let random: NsaAttention<B64> = randomized(NsaAttentionConfig::new(cfg.clone(), t).init(&device), &mut rng, 0.4);
    let with_phi = |phi| {
        let mut layer = random.clone();
        layer.compressor = CompressorConfig::new(phi, cfg.l, cfg.d, cfg.d_k, cfg.d_v).init(&device);
        layer
    };
    let (linear, avg) = (with_phi(Phi::Linear), with_phi(Phi::Avg));
    let (x, _) = random_input::<B64>(&mut rng, 2, t, cfg.dim, &device);

    let (out_linear, aux_linear) = linear.forward_with_aux(x.clone(), None);
    let (out_avg, aux_avg) = avg.forward_with_aux(x.clone(), None);
    let err = max_rel_err(&to_vec(out_linear), &to_vec(out_avg.clone()));
    assert!(err <= 1e-12, "linear phi at init differs from avg by {err:e}");
    assert_eq!(aux_linear.blocks.into_data(), aux_avg.blocks.into_data());

    // The comparison is live: a trained (random) linear phi gives a different output.
    let mut trained = linear;
    trained.compressor = randomized(trained.compressor, &mut rng, 0.3);
    let err = max_rel_err(&to_vec(trained.forward(x)), &to_vec(out_avg));
    assert!(err > 1e-6, "a random linear phi should change the output");
}

/// The chunked compression (`l % d == 0`) computes what gathering each block's tokens does, for
/// `avg` and `linear`, forward and gradients (of the keys, the values and `phi`'s weights), at a length
/// whose chunks end before the sequence does and at one where they end with it.
#[test]
fn chunked_compression_equals_the_block_gather() {
    use nsa_tests::A64;
    let device = Default::default();
    let mut rng = fresh_rng("phi_chunked");
    let (l, d, d_k, d_v) = (8, 4, 6, 5);
    for (phi, t) in [(Phi::Avg, 57), (Phi::Avg, 32), (Phi::Linear, 57), (Phi::Linear, 40)] {
        let compressor: Compressor<A64> =
            randomized(CompressorConfig::new(phi, l, d, d_k, d_v).init(&device), &mut rng, 0.3);
        // `[B, T, H, d]`: tokens before heads, as the layer's projections write them.
        let k = random_input::<A64>(&mut rng, 2, t, 3 * d_k, &device).0.reshape([2, t, 3, d_k]);
        let v = random_input::<A64>(&mut rng, 2, t, 3 * d_v, &device).0.reshape([2, t, 3, d_v]);
        let n = compressor.num_blocks(t);
        let seed_k = random_input::<A64>(&mut rng, 2, n, 3 * d_k, &device).0.reshape([2, n, 3, d_k]);
        let seed_v = random_input::<A64>(&mut rng, 2, n, 3 * d_v, &device).0.reshape([2, n, 3, d_v]);
        let run = |chunked: bool| {
            let (k, v) = (k.clone().require_grad(), v.clone().require_grad());
            let (ck, cv) = match chunked {
                true => compressor.forward_chunked(k.clone(), v.clone()),
                false => compressor.forward_gathered(k.clone(), v.clone()),
            }
            .expect("t >= l");
            let loss = (ck.clone() * seed_k.clone()).sum() + (cv.clone() * seed_v.clone()).sum();
            let grads = loss.backward();
            let mut out = vec![to_vec(ck.inner()), to_vec(cv.inner())];
            out.push(to_vec(k.grad(&grads).expect("k has a gradient")));
            out.push(to_vec(v.grad(&grads).expect("v has a gradient")));
            let (pk, pv) = compressor.linear_phi();
            for p in pk.into_iter().chain(pv) {
                out.push(to_vec(p.weight.val().grad(&grads).expect("phi's weight has a gradient")));
                if let Some(position) = &p.position {
                    out.push(to_vec::<_, 2>(position.val().grad(&grads).expect("the position has a gradient")));
                }
            }
            out
        };
        let (chunked, gathered) = (run(true), run(false));
        assert_eq!(chunked.len(), gathered.len());
        for (i, (a, r)) in chunked.iter().zip(&gathered).enumerate() {
            let err = max_rel_err(a, r);
            assert!(err <= 1e-12, "{phi:?} t={t}: output/gradient {i} differs by {err:e}");
        }
    }
}
