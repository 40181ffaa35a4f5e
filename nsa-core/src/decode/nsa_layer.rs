//! The NSA layer's prefill (the training forward, plus the keys and values it caches) and its
//! decode step (one new token per sequence against the cache), as the spec's one function.

use burn::nn::RmsNorm;
use burn::tensor::{backend::Backend, Bool, Int, Tensor};
use nsa_kernels::decode::StepOutputs;
use nsa_kernels::sparse::reference::overlap_weights;
use nsa_kernels::sparse::Selection;
use nsa_kernels::{decode_attention, decode_write, stats_dtype, DecodeAttentionBackend, StepInput};

use super::attend::attend;
use super::cache::NsaLayerCache;
use super::linear::{normed, step_linear};
use super::positions::{DecodePositions, NsaPositions, StepMasks};
use super::projection::{Projected, StepProjection};
use super::store::{KeyValues, Slots, TokenStore};
use crate::attention::selection::{selected_list, take_top_n};
use crate::attention::{Branch, NsaAttention, NsaAux};
use crate::constants::cached;

/// What a prefill of `T` tokens leaves for the cache, tokens first (`[1, T, H_kv, d]`).
pub struct NsaFill<B: DecodeAttentionBackend> {
    pub selected: KeyValues<B>,
    pub window: KeyValues<B>,
    /// The compressed branch's raw rotated keys and values (the cache keeps the last `l`).
    pub raw_compressed: KeyValues<B>,
    /// The compressed blocks `[1, N, H_kv, d]`, when one exists.
    pub compressed: Option<KeyValues<B>>,
}

impl<B: DecodeAttentionBackend> NsaLayerCache<B> {
    /// Row `row` filled from a prefill of that sequence.
    pub fn fill(self, row: usize, fill: &NsaFill<B>) -> Self {
        NsaLayerCache {
            selected: self.selected.fill(row, &fill.selected),
            window: self.window.fill_ring(row, &fill.window),
            tail: self.tail.fill_ring(row, &fill.raw_compressed),
            compressed: match &fill.compressed {
                Some(blocks) => self.compressed.fill_front(row, blocks),
                None => self.compressed,
            },
            projection: self.projection,
        }
    }
}

/// The caches a step writes its token into: the compression tail, the selected store, the
/// window ring.
type WrittenStores<B> = (Slots<B>, TokenStore<B>, Slots<B>);

/// The masks of a step in tensor ops, which a backend without a decode kernel has.
fn masks<B: Backend>(p: &NsaPositions<B>) -> &StepMasks<B> {
    p.masks.as_ref().expect("a step without a decode kernel has its masks")
}

/// `[B, 1, H, d]` (one token, tokens first) -> `[B, H, 1, d]` (heads first, as the cache holds).
fn heads_first<B: DecodeAttentionBackend>(x: Tensor<B, 4>) -> Tensor<B, 4> {
    x.swap_dims(1, 2)
}

impl<B: DecodeAttentionBackend> NsaAttention<B> {
    /// The forward of `x: [1, T, dim]` (the training path, fused kernels included) and what a
    /// decode cache keeps of it. The keys and values are computed again beside the forward's,
    /// by the same ops, so the training forward stays as it is.
    pub fn prefill(&self, x: Tensor<B, 3>) -> (Tensor<B, 3>, NsaAux<B>, NsaFill<B>) {
        let (out, aux) = self.forward_with_aux(x.clone(), None);
        let kv = |branch| {
            let (keys, values) = self.kv(branch).forward(x.clone(), &self.rope, None);
            KeyValues { keys, values }
        };
        let raw_compressed = kv(Branch::Compressed);
        let compressed = self
            .compressor
            .forward(raw_compressed.keys.clone(), raw_compressed.values.clone())
            .map(|(keys, values)| KeyValues { keys, values });
        let fill = NsaFill { selected: kv(Branch::Selected), window: kv(Branch::Window), raw_compressed, compressed };
        (out, aux, fill)
    }

    /// One new token per sequence on the residual stream `x: [B, 1, dim]` at the positions
    /// `at`, the layer's input being `norm(x)`, against `cache` (which takes the token's keys
    /// and values first): `x` plus the layer's output `[B, 1, dim]`, the selected blocks
    /// `[B, 1, H_kv, n]` (as the training forward lists them) and the cache.
    pub fn decode(
        &self,
        x: Tensor<B, 3>,
        norm: &RmsNorm<B>,
        cache: NsaLayerCache<B>,
        at: &DecodePositions<B>,
    ) -> (Tensor<B, 3>, Tensor<B, 4, Int>, NsaLayerCache<B>) {
        let c = &self.config;
        let p = at.nsa.as_ref().expect("decode positions built for an NSA model");
        let NsaLayerCache { selected, window, tail, compressed, projection } = cache;
        let y = projection.product(x.clone(), normed(norm));
        let (q, gates, (tail, selected, window)) = Self::write_token(&projection, y, (tail, selected, window), at, p);
        // The compression reads the tail only on a step that completes a block.
        let compressed = match &p.emit {
            Some(emit) => compressed.write(self.compress_tail(&tail, &emit.tail_order), &emit.emit_hit),
            None => compressed,
        };
        let selection = Selection { length: c.l, stride: c.d, block_size: c.l_sel, n: c.n };
        let caches = [&compressed.0, &selected.0, &window.0].map(|kv| (&kv.keys, &kv.values));
        let (branches, blocks) = match decode_attention(q.clone(), caches, at.at.clone(), selection) {
            Some(kernel) => kernel,
            None => self.decode_branches(q, [&compressed.0, &selected.0, &window.0], masks(p)),
        };
        // The gated mix is the output projection's input function: one launch for both.
        let [o_compressed, o_selected, o_window] = branches;
        let [b, t, h, d_v] = o_compressed.dims();
        let flat = |o: Tensor<B, 4>| o.reshape([b * t * h * d_v]);
        let mix = StepInput::Mix {
            selected: flat(o_selected),
            window: flat(o_window),
            gates: gates.reshape([b * t * 3 * h]),
        };
        let out = step_linear(&self.output, o_compressed.reshape([b, t, h * d_v]), mix, Some(x));
        (out, blocks, NsaLayerCache { selected, window, tail, compressed, projection })
    }

    /// The token's projections `y: [B, width]` split, and its keys and values written into the
    /// tail, selected and window caches: the rotated queries `[B, 1, H, d_k]`, the gates
    /// `[B, 1, 3, H]` and the caches. One kernel where the backend has one, tensor ops elsewhere.
    fn write_token(
        projection: &StepProjection<B>,
        y: Tensor<B, 2>,
        (tail, selected, window): WrittenStores<B>,
        at: &DecodePositions<B>,
        p: &NsaPositions<B>,
    ) -> (Tensor<B, 4>, Tensor<B, 4>, WrittenStores<B>) {
        if B::has_decode_kernel() {
            let caches = [tail.0, selected.0, window.0].map(|kv| [kv.keys, kv.values]);
            let rotation = at.rope.rows();
            let written = decode_write(y, projection.gate_bias(), rotation, at.at.clone(), caches, projection.layout());
            let [tail, selected, window] = written.caches.map(|[keys, values]| KeyValues { keys, values });
            return (written.queries, written.gates, (Slots(tail), TokenStore(selected), Slots(window)));
        }
        let Projected { queries, branches: [cmp, slc, win], gates } = projection.split(y, &at.rope);
        let new = |kv: KeyValues<B>| KeyValues { keys: heads_first(kv.keys), values: heads_first(kv.values) };
        let tail = tail.write(new(cmp), &masks(p).tail_hit);
        let selected = selected.append(new(slc), &at.at);
        let window = window.write(new(win), &masks(p).window_hit);
        (queries, gates, (tail, selected, window))
    }

    /// The decode step's attention in tensor ops (what the kernel of
    /// [`nsa_kernels::decode_attention`] is held to): queries `[B, 1, H, d_k]` against the
    /// compressed blocks, the selected branch's rows and the window ring (heads first) -> the
    /// three branch outputs `[B, 1, H, d_v]` and the blocks `[B, 1, H_kv, n]`.
    fn decode_branches(
        &self,
        q: Tensor<B, 4>,
        [compressed, selected, window]: [&KeyValues<B>; 3],
        p: &StepMasks<B>,
    ) -> StepOutputs<B> {
        let c = &self.config;
        let b = q.dims()[0];
        let g = c.n_heads / c.n_kv_heads;
        let q = q.reshape([b, c.n_kv_heads, g, c.d_k]);
        let (o_cmp, probs) =
            attend(q.clone(), compressed.keys.clone(), compressed.values.clone(), p.compressed_visible.clone());
        let blocks = self.decode_select(probs, p);
        let (keys, visible) = self.selected_keys(selected, blocks.clone(), p);
        let (o_slc, _) = attend(q.clone(), keys.keys, keys.values, visible);
        let (o_win, _) = attend(q, window.keys.clone(), window.values.clone(), p.window_visible.clone());
        let heads = |o: Tensor<B, 4>| o.reshape([b, 1, c.n_heads, c.d_v]);
        ([heads(o_cmp), heads(o_slc), heads(o_win)], blocks)
    }

    /// The block the tail's `l` positions make (`[B, H_kv, 1, d]`), in position order: written
    /// into the compressed slots only by the rows whose token completes a block.
    fn compress_tail(&self, tail: &Slots<B>, order: &Tensor<B, 2, Int>) -> KeyValues<B> {
        let ordered = tail.gather(order); // [B, H, l, d]
        let blocks = |x: Tensor<B, 4>| {
            let [b, h, l, d] = x.dims();
            x.swap_dims(1, 2).reshape([b, 1, l, h, d])
        };
        let (keys, values) = self.compressor.compress(blocks(ordered.keys), blocks(ordered.values));
        KeyValues { keys: heads_first(keys), values: heads_first(values) }
    }

    /// The selected blocks `[B, 1, H_kv, n]` from the compressed branch's probabilities
    /// `[B, H_kv, g, N]`: the spec's scores (Eq. 9, the Eq. 10 group sum) and its top-n.
    fn decode_select(&self, probs: Tensor<B, 4>, p: &StepMasks<B>) -> Tensor<B, 4, Int> {
        let c = &self.config;
        let [b, h, _, n_cmp] = probs.dims();
        let n_sel = p.forced.dims()[3];
        let device = probs.device();
        let stats = stats_dtype(probs.dtype());
        let weights = cached::<B, _>("decode_overlap", &[n_cmp, n_sel, c.l, c.d, c.l_sel], &device, || {
            overlap_weights::<B>(n_cmp, n_sel, c.l, c.d, c.l_sel, &device)
        });
        let summed = probs.sum_dim(2).reshape([b * h, n_cmp]);
        let scores = summed.matmul(weights.cast(stats)).reshape([b, h, 1, n_sel]);
        let chosen = take_top_n(scores, p.forced.clone(), p.candidate.clone(), p.remaining.clone());
        selected_list(chosen, c.n)
    }

    /// The keys and values of the selected blocks `[B, 1, H_kv, n]`, `[B, H_kv, n * l_sel, d]`,
    /// and which of them the token sees (`[B, H_kv, 1, n * l_sel]`: listed, and not after it).
    fn selected_keys(
        &self,
        store: &KeyValues<B>,
        blocks: Tensor<B, 4, Int>,
        p: &StepMasks<B>,
    ) -> (KeyValues<B>, Tensor<B, 4, Bool>) {
        let (l_sel, n) = (self.config.l_sel, self.config.n);
        let [b, _, h, _] = blocks.dims();
        let len = store.keys.dims()[2];
        let device = blocks.device();
        let shape = [b, h, n, l_sel];
        let offset = Tensor::<B, 1, Int>::arange(0..l_sel as i64, &device).reshape([1, 1, 1, l_sel]).expand(shape);
        let block = blocks.reshape([b, h, n, 1]).expand(shape);
        let position = block.clone().mul_scalar(l_sel as i64) + offset;
        let visible = block
            .greater_equal_elem(0)
            .bool_and(position.clone().lower_equal(p.last_key.clone().expand(shape)))
            .reshape([b, h, 1, n * l_sel]);
        let index = position.clamp(0, len as i64 - 1).reshape([b, h, n * l_sel, 1]);
        let take = |x: &Tensor<B, 4>| {
            let d = x.dims()[3];
            x.clone().gather(2, index.clone().expand([b, h, n * l_sel, d]))
        };
        (KeyValues { keys: take(&store.keys), values: take(&store.values) }, visible)
    }
}
