//! The model's prefill and decode step over a [`DecodeCache`].

use burn::tensor::{Int, Tensor};
use nsa_kernels::DecodeAttentionBackend;

use super::cache::{DecodeCache, LayerCache, NsaLayerCache};
use super::linear::{normed, step_linear};
use super::positions::DecodePositions;
use super::store::{KeyValues, TokenStore};
use crate::attention::projection::apply;
use crate::config::NsaConfig;
use crate::model::{embed, norm, Attention, NsaLm};
use crate::rope::Rope;

/// A decode step's logits and, per NSA layer, the blocks each sequence's token selected.
pub struct DecodeOutput<B: DecodeAttentionBackend> {
    /// `[B, vocab]`.
    pub logits: Tensor<B, 2>,
    /// `[B, 1, H_kv, n]` per NSA layer (as the training forward lists them).
    pub blocks: Vec<Tensor<B, 4, Int>>,
}

impl<B: DecodeAttentionBackend> NsaLm<B> {
    /// An empty cache for `batch` sequences of up to `max_len` positions (at most the model's
    /// `seq_len`), in the dtype of the model's weights.
    pub fn decode_cache(&self, batch: usize, max_len: usize, device: &B::Device) -> DecodeCache<B> {
        assert!(max_len <= self.seq_len(), "a cache of {max_len} positions is longer than the model's seq_len");
        let dtype = self.embedding.weight.val().dtype();
        let layers = self
            .blocks
            .iter()
            .map(|block| match &block.attention {
                Attention::Nsa(layer) => LayerCache::Nsa(NsaLayerCache::new(layer, batch, max_len, dtype, device)),
                Attention::Dense(layer) => {
                    let c = &layer.config;
                    let kv = KeyValues::zeros(batch, c.n_kv_heads, max_len, [c.d_k, c.d_v], dtype, device);
                    LayerCache::Dense(TokenStore(kv))
                }
            })
            .collect();
        DecodeCache { layers, lengths: vec![0; batch], max_len }
    }

    /// Runs `tokens: [1, T]` (the training forward) as row `row` of `cache`, which must be empty
    /// there, and fills that row: the logits of the last position `[1, vocab]` and the cache.
    pub fn prefill(
        &self,
        tokens: Tensor<B, 2, Int>,
        row: usize,
        mut cache: DecodeCache<B>,
    ) -> (Tensor<B, 2>, DecodeCache<B>) {
        let t = tokens.dims()[1];
        assert!(t >= 1 && t <= cache.max_len, "a prompt of {t} tokens does not fit a cache of {}", cache.max_len);
        assert_eq!(cache.lengths[row], 0, "row {row} of the cache is already filled");
        let mut x = embed(&self.embedding, tokens);
        let mut layers = Vec::with_capacity(self.blocks.len());
        for (block, layer) in self.blocks.iter().zip(cache.layers) {
            let normed = norm(&block.attention_norm, x.clone());
            let (attended, layer) = match (&block.attention, layer) {
                (Attention::Nsa(nsa), LayerCache::Nsa(layer)) => {
                    let (out, _, fill) = nsa.prefill(normed);
                    (out, LayerCache::Nsa(layer.fill(row, &fill)))
                }
                (Attention::Dense(dense), LayerCache::Dense(store)) => {
                    let (out, kv) = dense.prefill(normed);
                    (out, LayerCache::Dense(store.fill(row, &kv)))
                }
                _ => panic!("the cache was made for another model"),
            };
            layers.push(layer);
            x = x.clone() + attended;
            x = x.clone() + block.mlp.forward(norm(&block.mlp_norm, x));
        }
        cache.layers = layers;
        cache.lengths[row] = t;
        let last = norm(&self.norm, x.narrow(1, t - 1, 1));
        (apply(&self.lm_head, last).reshape([1, -1]), cache)
    }

    /// One token per sequence, `tokens: [B, 1]`, each at its row's length: the logits and the
    /// cache with the tokens appended. Every tensor's shape is fixed by the batch and the
    /// cache's maximum length, so a GPU compiles a step's kernels once.
    pub fn decode(&self, tokens: Tensor<B, 2, Int>, cache: DecodeCache<B>) -> (DecodeOutput<B>, DecodeCache<B>) {
        let DecodeCache { layers, lengths, max_len } = cache;
        assert_eq!(tokens.dims(), [lengths.len(), 1], "one token per cached sequence");
        if let Some(full) = lengths.iter().find(|&&t| t >= max_len) {
            panic!("a sequence of {full} tokens fills its cache of {max_len}: no room for another");
        }
        let device = tokens.device();
        // The table's rows: one gather, where the training forward's one-hot product (cheaper to
        // differentiate) would be several ops a step.
        let mut x = self.embedding.forward(tokens);
        let rope = (self.rope(), x.dtype());
        let positions = DecodePositions::new(&lengths, max_len, self.nsa_config(), self.has_dense(), rope, &device);
        let (mut next, mut blocks) = (Vec::with_capacity(layers.len()), Vec::new());
        for (block, layer) in self.blocks.iter().zip(layers) {
            let (attended, layer) = match (&block.attention, layer) {
                (Attention::Nsa(nsa), LayerCache::Nsa(layer)) => {
                    let (x, selected, layer) = nsa.decode(x, &block.attention_norm, layer, &positions);
                    blocks.push(selected);
                    (x, LayerCache::Nsa(layer))
                }
                (Attention::Dense(dense), LayerCache::Dense(store)) => {
                    let (out, store) = dense.decode(norm(&block.attention_norm, x.clone()), store, &positions);
                    (x + out, LayerCache::Dense(store))
                }
                _ => panic!("the cache was made for another model"),
            };
            next.push(layer);
            x = block.mlp.decode(attended, &block.mlp_norm);
        }
        let b = lengths.len();
        let logits = step_linear(&self.lm_head, x, normed(&self.norm), None).reshape([b as i32, -1]);
        let lengths = lengths.into_iter().map(|t| t + 1).collect();
        (DecodeOutput { logits, blocks }, DecodeCache { layers: next, lengths, max_len })
    }

    /// The NSA layers' shape (all layers share one), when the model has NSA layers.
    fn nsa_config(&self) -> Option<&NsaConfig> {
        self.blocks.iter().find_map(|block| match &block.attention {
            Attention::Nsa(layer) => Some(&layer.config),
            Attention::Dense(_) => None,
        })
    }

    /// The rotation table (every layer's is the same).
    fn rope(&self) -> &Rope<B> {
        match &self.blocks[0].attention {
            Attention::Nsa(layer) => &layer.rope,
            Attention::Dense(layer) => &layer.rope,
        }
    }

    fn has_dense(&self) -> bool {
        self.blocks.iter().any(|block| matches!(block.attention, Attention::Dense(_)))
    }
}
