//! The compressed branch's `phi`: one key (value) per block of `l` raw tokens, stride `d`.

use burn::module::{Module, Param};
use burn::tensor::{backend::Backend, Int, Tensor, TensorData};

use crate::config::Phi;

/// `phi = mlp`: add a learned intra-block position embedding, flatten the block, map `l*h -> h`
/// with one matrix shared by all heads.
///
/// Keys carry no position embedding: `(k + P) W = k W + P W` adds the same vector to every
/// compressed key, which moves every logit of a query's softmax equally. Such a `P` changes
/// neither the output nor the selection, and its gradient is exactly zero, so it is left out:
/// the function computed is the spec's for any value of the key-side `P`.
#[derive(Module, Debug)]
pub struct MlpPhi<B: Backend> {
    /// Intra-block position embedding `[l, h]`, initialised to zero; values only.
    pub position: Option<Param<Tensor<B, 2>>>,
    /// `[l*h, h]`, initialised to `1/l` on each of the `l` identity blocks, so the map starts
    /// as the block mean (exactly `phi = avg`).
    pub weight: Param<Tensor<B, 2>>,
}

impl<B: Backend> MlpPhi<B> {
    pub fn new(l: usize, head_dim: usize, with_position: bool, device: &B::Device) -> Self {
        let mut weight = vec![0.0f64; l * head_dim * head_dim];
        for r in 0..l {
            for a in 0..head_dim {
                weight[(r * head_dim + a) * head_dim + a] = 1.0 / l as f64;
            }
        }
        Self {
            position: with_position.then(|| Param::from_tensor(Tensor::zeros([l, head_dim], device))),
            weight: Param::from_tensor(Tensor::from_data(TensorData::new(weight, [l * head_dim, head_dim]), device)),
        }
    }

    /// `blocks: [B, N, l, H, h]` -> `[B, N, H, h]`.
    fn forward(&self, blocks: Tensor<B, 5>) -> Tensor<B, 4> {
        let [b, n, l, h, d] = blocks.dims();
        let shifted = match &self.position {
            Some(position) => blocks + position.val().reshape([1, 1, l, 1, d]),
            None => blocks,
        };
        let rows = shifted.permute([0, 1, 3, 2, 4]).reshape([b * n * h, l * d]);
        rows.matmul(self.weight.val()).reshape([b, n, h, d])
    }
}

/// Compresses rotated keys and values block by block.
#[derive(Module, Debug)]
pub struct Compressor<B: Backend> {
    /// `None` means `phi = avg`.
    key_phi: Option<MlpPhi<B>>,
    value_phi: Option<MlpPhi<B>>,
    l: usize,
    d: usize,
}

impl<B: Backend> Compressor<B> {
    pub fn new(phi: Phi, l: usize, d: usize, d_k: usize, d_v: usize, device: &B::Device) -> Self {
        let mlp = |h, with_position| (phi == Phi::Mlp).then(|| MlpPhi::new(l, h, with_position, device));
        Self { key_phi: mlp(d_k, false), value_phi: mlp(d_v, true), l, d }
    }

    /// The learned `phi` of keys and values (`None` for `phi = avg`).
    pub fn mlp_phi(&self) -> (Option<&MlpPhi<B>>, Option<&MlpPhi<B>>) {
        (self.key_phi.as_ref(), self.value_phi.as_ref())
    }

    /// Compressed blocks that exist in a sequence of `t` tokens.
    pub fn num_blocks(&self, t: usize) -> usize {
        if t < self.l {
            0
        } else {
            (t - self.l) / self.d + 1
        }
    }

    /// `k: [B, T, H, d_k]`, `v: [B, T, H, d_v]` -> compressed `[B, N, H, d_k]`, `[B, N, H, d_v]`,
    /// or `None` when `T < l` (no block exists yet). With `l % d == 0` (every paper and shipped
    /// configuration) a block is `l / d` consecutive stride-`d` chunks, and the blocks are
    /// sums of chunk terms ([`Self::forward_chunked`]); otherwise each block's tokens are
    /// gathered ([`Self::forward_gathered`]).
    pub fn forward(&self, k: Tensor<B, 4>, v: Tensor<B, 4>) -> Option<(Tensor<B, 4>, Tensor<B, 4>)> {
        match self.l % self.d {
            0 => self.forward_chunked(k, v),
            _ => self.forward_gathered(k, v),
        }
    }

    /// [`Self::forward`] through chunks: block `i` covers chunks `i .. i + l/d` of `d` tokens, so
    /// `phi = avg` is a chunk sum followed by a sum of `l/d` shifted views, and `phi = mlp`
    /// (`flatten(block) W`) is the same sum over chunk products `flatten(chunk) W_j`, `W_j` the
    /// rows of `W` that chunk `j` of a block meets. No token is copied `l/d` times, and the
    /// backward is reshapes and adds instead of a scatter-add.
    pub fn forward_chunked(&self, k: Tensor<B, 4>, v: Tensor<B, 4>) -> Option<(Tensor<B, 4>, Tensor<B, 4>)> {
        let n = self.num_blocks(k.dims()[1]);
        if n == 0 {
            return None;
        }
        let (key, value) = (self.chunked(&self.key_phi, k, n), self.chunked(&self.value_phi, v, n));
        Some((key, value))
    }

    fn chunked(&self, phi: &Option<MlpPhi<B>>, x: Tensor<B, 4>, n: usize) -> Tensor<B, 4> {
        let [b, _, h, dh] = x.dims();
        let (d, per_block) = (self.d, self.l / self.d);
        let chunks = n + per_block - 1;
        let x = x.narrow(1, 0, chunks * d).reshape([b, chunks, d, h, dh]);
        // Chunk `j` of block `i` is chunk `i + j`: the block is the sum of `per_block` views.
        let shifted_sum = |terms: Tensor<B, 4>| {
            (1..per_block).fold(terms.clone().narrow(1, 0, n), |acc, j| acc + terms.clone().narrow(1, j, n))
        };
        match phi {
            None => shifted_sum(x.sum_dim(2).reshape([b, chunks, h, dh])).div_scalar(self.l as f64),
            Some(mlp) => {
                // One row per (chunk, head): the chunk's `d` tokens of that head, flattened.
                let rows = x.permute([0, 1, 3, 2, 4]).reshape([b * chunks * h, d * dh]);
                let weight = mlp.weight.val(); // [l * dh, dh]: chunk j of a block meets rows j*d*dh..
                let products: Vec<Tensor<B, 4>> = (0..per_block)
                    .map(|j| {
                        let w_j = weight.clone().narrow(0, j * d * dh, d * dh);
                        rows.clone().matmul(w_j).reshape([b, chunks, h, dh]).narrow(1, j, n)
                    })
                    .collect();
                let sum = products.into_iter().reduce(|acc, p| acc + p).expect("l / d >= 1");
                match &mlp.position {
                    // `(chunk + P_j) W_j = chunk W_j + P_j W_j`: the position adds one vector.
                    Some(position) => {
                        let flat = position.val().reshape([1, self.l * dh]);
                        sum + flat.matmul(weight).reshape([1, 1, 1, dh])
                    }
                    None => sum,
                }
            }
        }
    }

    /// [`Self::forward`] by gathering each block's `l` tokens: any `l` and `d`.
    pub fn forward_gathered(&self, k: Tensor<B, 4>, v: Tensor<B, 4>) -> Option<(Tensor<B, 4>, Tensor<B, 4>)> {
        let n = self.num_blocks(k.dims()[1]);
        if n == 0 {
            return None;
        }
        let device = k.device();
        // Raw position of token r of block i: i*d + r, flattened block-major.
        let starts = Tensor::<B, 1, Int>::arange(0..n as i64, &device).mul_scalar(self.d as i64);
        let offsets = Tensor::<B, 1, Int>::arange(0..self.l as i64, &device);
        let positions = (starts.reshape([n, 1]) + offsets.reshape([1, self.l])).reshape([n * self.l]);
        let k_blocks = self.gather_blocks(k, positions.clone(), n);
        let v_blocks = self.gather_blocks(v, positions, n);
        Some((apply_phi(&self.key_phi, k_blocks), apply_phi(&self.value_phi, v_blocks)))
    }

    fn gather_blocks(&self, x: Tensor<B, 4>, positions: Tensor<B, 1, Int>, n: usize) -> Tensor<B, 5> {
        let [b, _, h, d] = x.dims();
        x.select(1, positions).reshape([b, n, self.l, h, d])
    }
}

fn apply_phi<B: Backend>(phi: &Option<MlpPhi<B>>, blocks: Tensor<B, 5>) -> Tensor<B, 4> {
    match phi {
        Some(mlp) => mlp.forward(blocks),
        None => {
            let [b, n, _, h, d] = blocks.dims();
            blocks.mean_dim(2).reshape([b, n, h, d])
        }
    }
}
