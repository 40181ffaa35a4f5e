//! Decoding with the cache is the training forward, one token at a time (spec, "Prefill,
//! decode, varlen"): a prefill of `T` tokens then `k` decode steps give the logits and the
//! selected blocks of one forward over `T + k`, in float64 on the CPU and in f32 on WGPU; the
//! cache a prefill fills equals the one token-by-token decoding fills; rows of different lengths
//! decode in one batch; a packed row's last document decodes as a prompt of its own.
//!
//! The small shape (`l = 8, d = 4, l_sel = 8, w = 16`) over 40 positions crosses compression
//! emits, selection-block boundaries and the window's edge, and starts below `l`.

use burn::tensor::{Int, Tensor, TensorData};
use nsa_core::decode::{DecodeCache, LayerCache};
use nsa_core::{AttentionKind, DecodeAttentionBackend, Documents, MlpKind, NsaConfig, NsaLm, NsaLmConfig, Phi};
use nsa_tests::{fresh_rng, max_rel_err, randomized, small_config, to_vec, B64};
use rand::rngs::StdRng;
use rand::Rng;

const LEN: usize = 40;

fn model<B: DecodeAttentionBackend>(rng: &mut StdRng, attention: NsaConfig, device: &B::Device) -> NsaLm<B> {
    let cfg = NsaLmConfig::new().with_vocab_size(32).with_n_layers(2).with_seq_len(LEN).with_attention(attention);
    cfg.validate().unwrap();
    randomized(cfg.init::<B>(device), rng, 0.3)
}

fn tokens(rng: &mut StdRng, t: usize) -> Vec<i64> {
    (0..t).map(|_| rng.random_range(0..32)).collect()
}

fn row<B: DecodeAttentionBackend>(tokens: &[i64], device: &B::Device) -> Tensor<B, 2, Int> {
    Tensor::from_data(TensorData::new(tokens.to_vec(), [1, tokens.len()]), device)
}

/// Logits `[T, vocab]` and, per NSA layer, the block lists `[T][H_kv * n]` of one forward.
#[allow(clippy::type_complexity)]
fn full_forward<B: DecodeAttentionBackend>(
    model: &NsaLm<B>,
    tokens: &[i64],
    documents: Option<&Documents<B>>,
    device: &B::Device,
) -> (Vec<Vec<f64>>, Vec<Vec<Vec<i64>>>) {
    let (logits, aux) = model.forward_with_aux(row(tokens, device), documents);
    let vocab = logits.dims()[2];
    let logits = to_vec(logits).chunks(vocab).map(<[f64]>::to_vec).collect();
    let blocks = aux
        .into_iter()
        .map(|a| {
            let [_, t, h, n] = a.blocks.dims();
            let list: Vec<i64> = a.blocks.into_data().convert::<i64>().to_vec().unwrap();
            list.chunks(h * n).take(t).map(<[i64]>::to_vec).collect()
        })
        .collect();
    (logits, blocks)
}

/// Prefills `rows[b][..prompt[b]]` into row `b`, then decodes the rest one token per step;
/// checks every step's logits (to `tol`) and blocks against each row's own full forward.
fn check_decode<B: DecodeAttentionBackend>(
    name: &str,
    model: &NsaLm<B>,
    rows: &[Vec<i64>],
    prompt: &[usize],
    tol: f64,
    device: &B::Device,
) {
    let mut cache = model.decode_cache(rows.len(), LEN, device);
    let wants: Vec<_> = rows.iter().map(|r| full_forward(model, r, None, device)).collect();
    for (b, (tokens, &t)) in rows.iter().zip(prompt).enumerate() {
        let (logits, filled) = model.prefill(row(&tokens[..t], device), b, cache);
        cache = filled;
        let err = max_rel_err(&to_vec(logits), &wants[b].0[t - 1]);
        assert!(err <= tol, "{name}: prefill logits of row {b} differ by {err:e}");
    }
    let steps = rows.iter().zip(prompt).map(|(r, &t)| r.len() - t).min().unwrap();
    for step in 0..steps {
        let next: Vec<i64> = rows.iter().zip(prompt).map(|(r, &t)| r[t + step]).collect();
        let input = Tensor::<B, 2, Int>::from_data(TensorData::new(next, [rows.len(), 1]), device);
        let (out, next_cache) = model.decode(input, cache);
        cache = next_cache;
        let vocab = out.logits.dims()[1];
        let logits = to_vec(out.logits);
        for (b, &t) in prompt.iter().enumerate() {
            let position = t + step;
            let err = max_rel_err(&logits[b * vocab..(b + 1) * vocab], &wants[b].0[position]);
            assert!(err <= tol, "{name}: row {b} position {position}: logits differ by {err:e}");
            for (layer, blocks) in out.blocks.iter().enumerate() {
                let [_, _, h, n] = blocks.dims();
                let got: Vec<i64> = blocks.clone().into_data().convert::<i64>().to_vec().unwrap();
                let want = &wants[b].1[layer][position];
                assert_eq!(
                    &got[b * h * n..(b + 1) * h * n],
                    &want[..],
                    "{name}: row {b} position {position} layer {layer}: blocks"
                );
            }
        }
    }
}

fn check_shape(name: &str, attention: NsaConfig) {
    let mut rng = fresh_rng(name);
    let device = Default::default();
    let model = model::<B64>(&mut rng, attention, &device);
    let sequence = tokens(&mut rng, LEN);
    // A prompt shorter than a compressed block, then every kind of boundary while decoding.
    check_decode(name, &model, &[sequence], &[3], 1e-9, &device);
}

#[test]
fn decode_matches_the_forward_phi_avg_g2() {
    check_shape("decode_phi_avg_g2", small_config().with_phi(Phi::Avg));
}

#[test]
fn decode_matches_the_forward_phi_linear_g1_dk_differs_from_dv() {
    check_shape("decode_phi_linear_g1", small_config().with_phi(Phi::Linear).with_n_heads(2).with_d_v(4));
}

#[test]
fn decode_matches_the_forward_phi_mlp_g6_shared_kv() {
    let shape = small_config().with_phi(Phi::Mlp).with_n_heads(6).with_n_kv_heads(1).with_shared_kv(true);
    check_shape("decode_phi_mlp_g6", shape);
}

#[test]
fn decode_matches_the_forward_dense() {
    check_shape("decode_dense", small_config().with_attention(AttentionKind::Dense));
}

/// The gated MLP, which a step runs in tensor ops (the SiLU MLP's step is two fused products).
#[test]
fn decode_matches_the_forward_swiglu() {
    let mut rng = fresh_rng("decode_swiglu");
    let device = Default::default();
    let cfg = NsaLmConfig::new().with_vocab_size(32).with_n_layers(2).with_seq_len(LEN).with_mlp(MlpKind::Swiglu);
    let model = randomized(cfg.with_attention(small_config()).init::<B64>(&device), &mut rng, 0.3);
    check_decode("decode_swiglu", &model, &[tokens(&mut rng, LEN)], &[3], 1e-9, &device);
}

/// Two rows of different lengths in one batch: each decodes as it would alone.
#[test]
fn rows_of_different_lengths_decode_together() {
    let mut rng = fresh_rng("rows_of_different_lengths_decode_together");
    let device = Default::default();
    let model = model::<B64>(&mut rng, small_config().with_phi(Phi::Linear), &device);
    let rows = [tokens(&mut rng, LEN), tokens(&mut rng, 30)];
    check_decode("ragged batch", &model, &rows, &[17, 5], 1e-9, &device);
}

/// The last document of a packed row decodes as a prompt of its own, from position 0 (how
/// generation continues a prompt of several documents: `nsa_train::generate::continued`): a
/// prefill of its first tokens and a decode step per token after them give the logits of one
/// forward over the packed row, and its selected blocks counted from the document's first block.
#[test]
fn the_last_document_of_a_packed_row_decodes_as_its_own_prompt() {
    let mut rng = fresh_rng("the_last_document_of_a_packed_row_decodes_as_its_own_prompt");
    let device = Default::default();
    let attention = small_config().with_phi(Phi::Mlp);
    let (align, l_sel) = (attention.document_alignment(), attention.l_sel);
    // Two documents of one alignment step each, then one of 40 tokens: past the window, five
    // selection blocks for four slots (a contested top-n), every compressed block's emit.
    let (len, last) = (56, 2 * align);
    let cfg = NsaLmConfig::new().with_vocab_size(32).with_n_layers(2).with_seq_len(len).with_attention(attention);
    let model = randomized(cfg.init::<B64>(&device), &mut rng, 0.3);
    let packed = tokens(&mut rng, len);
    let starts: Vec<i64> = (0..len).map(|t| (t.min(last) / align * align) as i64).collect();
    let documents = Documents::from_starts(starts, [1, len], align, &device).unwrap();
    let (logits, blocks) = full_forward(&model, &packed, Some(&documents), &device);
    let first_block = (last / l_sel) as i64;
    let document = &packed[last..];
    let prompt = 3;
    let cache = model.decode_cache(1, document.len(), &device);
    let (first, mut cache) = model.prefill(row(&document[..prompt], &device), 0, cache);
    let err = max_rel_err(&to_vec(first), &logits[last + prompt - 1]);
    assert!(err <= 1e-9, "prefill logits differ from the packed forward's by {err:e}");
    for (i, &token) in document[prompt..].iter().enumerate() {
        let position = last + prompt + i;
        let (out, next) = model.decode(row(&[token], &device), cache);
        cache = next;
        let err = max_rel_err(&to_vec(out.logits), &logits[position]);
        assert!(err <= 1e-9, "position {position}: logits differ from the packed forward's by {err:e}");
        for (layer, got) in out.blocks.into_iter().enumerate() {
            let got: Vec<i64> = got.into_data().convert::<i64>().to_vec().unwrap();
            let want: Vec<i64> =
                blocks[layer][position].iter().map(|&j| if j >= 0 { j - first_block } else { j }).collect();
            assert_eq!(got, want, "position {position} layer {layer}: blocks");
        }
    }
}

/// The same on WGPU in f32 (Mesa lavapipe in CI), as a GPU run generates: Burn's fusion, the
/// fused training kernels in the prefill, the decode step's tensor ops on the GPU runtime.
#[test]
fn decode_matches_the_forward_on_wgpu() {
    let mut rng = fresh_rng("decode_matches_the_forward_on_wgpu");
    let device = burn::backend::wgpu::WgpuDevice::default();
    let model = model::<burn::backend::Wgpu>(&mut rng, small_config().with_phi(Phi::Linear), &device);
    // Rows of one length, so the forwards they are held to share one shape: each shape compiles
    // its own fused kernels, minutes on lavapipe. Their prompts differ, so they decode at
    // different positions.
    let rows = [tokens(&mut rng, LEN), tokens(&mut rng, LEN)];
    check_decode("wgpu", &model, &rows, &[17, 5], 1e-4, &device);
}

/// A prefill of `T` tokens fills the cache that one token and `T - 1` decode steps fill.
#[test]
fn prefill_fills_the_cache_decoding_fills() {
    let mut rng = fresh_rng("prefill_fills_the_cache_decoding_fills");
    let device = Default::default();
    let model = model::<B64>(&mut rng, small_config().with_phi(Phi::Mlp), &device);
    let sequence = tokens(&mut rng, 27);
    check_fill("float64", &model, &sequence, 1, 1e-9, &device);
}

/// The same on WGPU, where a kernel writes each step's keys and values into the caches, with
/// one key/value set shared by the branches (written into all three caches). The prompt and the
/// whole sequence have the lengths the WGPU decode test prefills, so no new forward compiles.
#[test]
fn wgpu_prefill_fills_the_cache_decoding_fills() {
    let mut rng = fresh_rng("wgpu_prefill_fills_the_cache_decoding_fills");
    let device = burn::backend::wgpu::WgpuDevice::default();
    let attention = small_config().with_phi(Phi::Linear).with_shared_kv(true);
    let model = model::<burn::backend::Wgpu>(&mut rng, attention, &device);
    let sequence = tokens(&mut rng, LEN);
    check_fill("wgpu", &model, &sequence, 17, 1e-5, &device);
}

/// The cache a prefill of `sequence` fills against a prefill of its first `prompt` tokens and
/// a decode step per token after them: every tensor to `tol`.
fn check_fill<B: DecodeAttentionBackend>(
    name: &str,
    model: &NsaLm<B>,
    sequence: &[i64],
    prompt: usize,
    tol: f64,
    device: &B::Device,
) {
    let (_, prefilled) = model.prefill(row(sequence, device), 0, model.decode_cache(1, LEN, device));
    let (_, mut decoded) = model.prefill(row(&sequence[..prompt], device), 0, model.decode_cache(1, LEN, device));
    for &token in &sequence[prompt..] {
        decoded = model.decode(row(&[token], device), decoded).1;
    }
    assert_eq!(prefilled.lengths, decoded.lengths);
    for (layer, (a, b)) in cache_tensors(prefilled).into_iter().zip(cache_tensors(decoded)).enumerate() {
        let err = max_rel_err(&a, &b);
        assert!(err <= tol, "{name}: tensor {layer} of the caches differs by {err:e}");
    }
}

/// Every tensor of every layer's cache, flattened.
fn cache_tensors<B: DecodeAttentionBackend>(cache: DecodeCache<B>) -> Vec<Vec<f64>> {
    let mut out = Vec::new();
    for layer in cache.layers {
        let LayerCache::Nsa(layer) = layer else { panic!("an NSA model has NSA caches") };
        for kv in [layer.selected.0, layer.window.0, layer.tail.0, layer.compressed.0] {
            out.push(to_vec(kv.keys));
            out.push(to_vec(kv.values));
        }
    }
    out
}
