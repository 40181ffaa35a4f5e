//! The NSA layer's parts, forward + backward each (the selection has no backward), on random
//! inputs of the real shape: milliseconds per layer and what each forward holds.

use burn::tensor::Tensor;
use nsa_core::attention::NsaAttention;

use super::stopwatch::Stopwatch;
use crate::TrainBackend;

/// One part: its name, ms per layer, and GiB its forward holds.
pub(crate) type Part = (&'static str, f64, Option<f64>);

/// Each part of `nsa` on inputs `[batch, seq, dim]` (`shape`).
pub(crate) fn attention_parts<B: TrainBackend>(
    sw: &Stopwatch<B>,
    nsa: &NsaAttention<B>,
    shape: [usize; 3],
) -> Vec<Part> {
    let c = &nsa.config;
    let [b, t, _] = shape;
    let x = || sw.random(shape, 1.0);
    let heads = |d: usize| sw.random([b, t, c.n_heads, d], 1.0);
    let q = || heads(c.d_k);
    let backward = |o: Tensor<B, 4>| drop(o.sum().backward());
    let queries = (
        "queries (W_q, RoPE)",
        sw.time_with(x, |x| drop(nsa.queries(x, None).sum().backward())),
        sw.held(|| nsa.queries(x(), None)),
    );
    let compressed = (
        "compressed branch (K/V, phi, attention)",
        sw.time_with(|| (q(), x()), |(q, x)| backward(nsa.compressed_branch(q, x, None).0)),
        sw.held(|| nsa.compressed_branch(q(), x(), None)),
    );
    let q_fixed = q().detach();
    let (_, p_cmp) = nsa.compressed_branch(q_fixed.clone(), x().detach(), None);
    let selection = (
        "selection (scores, top-n, lists; forward only)",
        sw.time_with(|| (p_cmp.clone(), x()), |(p, x)| drop(nsa.select(q_fixed.clone(), p, &x, None).sum())),
        None,
    );
    let blocks = nsa.select(q_fixed, p_cmp, &x(), None);
    let selected = (
        "selected branch (K/V, kernels)",
        sw.time_with(|| (q(), x()), |(q, x)| backward(nsa.selected_branch(q, x, blocks.clone(), None))),
        sw.held(|| nsa.selected_branch(q(), x(), blocks.clone(), None)),
    );
    let window = (
        "window branch (K/V, kernels)",
        sw.time_with(|| (q(), x()), |(q, x)| backward(nsa.window_branch(q, x, None))),
        sw.held(|| nsa.window_branch(q(), x(), None)),
    );
    let outputs = || [0; 3].map(|_| heads(c.d_v));
    let mix = (
        "gates, mix, W_o",
        sw.time_with(|| (x(), outputs()), |(x, o)| drop(nsa.mix(x, o).0.sum().backward())),
        sw.held(|| nsa.mix(x(), outputs())),
    );
    vec![queries, compressed, selection, selected, window, mix]
}
