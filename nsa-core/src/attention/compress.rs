//! The compressed branch's `phi`: one key (value) per block of `l` raw tokens, stride `d`.

use burn::config::Config;
use burn::module::{Module, Param};
use burn::nn::{Linear, LinearConfig};
use burn::tensor::{backend::Backend, Tensor, TensorData};
use nsa_kernels::{linear_matmul, GemmBackend};

use super::projection::apply;
use crate::config::Phi;

/// `phi = linear`: add a learned intra-block position embedding, flatten the block, map
/// `l*h -> h` with one matrix shared by all heads.
///
/// Keys carry no position embedding: `(k + P) W = k W + P W` adds the same vector to every
/// compressed key, which moves every logit of a query's softmax equally. Such a `P` changes
/// neither the output nor the selection, and its gradient is exactly zero, so it is left out:
/// the function computed is the spec's for any value of the key-side `P`.
#[derive(Module, Debug)]
pub struct LinearPhi<B: Backend> {
    /// Intra-block position embedding `[l, h]`, initialised to zero; values only.
    pub position: Option<Param<Tensor<B, 2>>>,
    /// `[l*h, h]`, initialised to `1/l` on each of the `l` identity blocks, so the map starts
    /// as the block mean (exactly `phi = avg`).
    pub weight: Param<Tensor<B, 2>>,
}

/// `phi = linear` over blocks of `l` rows of `head_dim`; `with_position` adds the position
/// embedding (values only).
#[derive(Config, Debug)]
pub struct LinearPhiConfig {
    pub l: usize,
    pub head_dim: usize,
    #[config(default = false)]
    pub with_position: bool,
}

impl LinearPhiConfig {
    pub fn init<B: Backend>(&self, device: &B::Device) -> LinearPhi<B> {
        let LinearPhiConfig { l, head_dim, with_position } = *self;
        let mut weight = vec![0.0f64; l * head_dim * head_dim];
        for r in 0..l {
            for a in 0..head_dim {
                weight[(r * head_dim + a) * head_dim + a] = 1.0 / l as f64;
            }
        }
        LinearPhi {
            position: with_position.then(|| Param::from_tensor(Tensor::zeros([l, head_dim], device))),
            weight: Param::from_tensor(Tensor::from_data(TensorData::new(weight, [l * head_dim, head_dim]), device)),
        }
    }
}

impl<B: GemmBackend> LinearPhi<B> {
    /// `blocks: [B, N, l, H, h]` -> `[B, N, H, h]`, the product through the backend's (plain f32
    /// in f32 on CUDA, as the layer's projections).
    fn forward(&self, blocks: Tensor<B, 5>) -> Tensor<B, 4> {
        let [b, n, l, h, d] = blocks.dims();
        let shifted = match &self.position {
            Some(position) => blocks + position.val().reshape([1, 1, l, 1, d]),
            None => blocks,
        };
        let rows = shifted.permute([0, 1, 3, 2, 4]).reshape([b * n * h, l * d]);
        linear_matmul(rows, self.weight.val()).reshape([b, n, h, d])
    }
}

/// `phi = mlp`, the paper's "learnable MLP with intra-block position encoding": add a learned
/// position embedding, flatten the block, `Linear(l*h -> hidden)`, GELU, `Linear(hidden -> h)`,
/// shared by all heads. Unlike [`LinearPhi`] the map is not linear, so keys carry the position
/// embedding too.
#[derive(Module, Debug)]
pub struct MlpPhi<B: Backend> {
    /// Intra-block position embedding `[l, h]`, initialised to zero.
    pub position: Param<Tensor<B, 2>>,
    /// `l*h -> hidden` and `hidden -> h`, with biases, Burn's default initialisation.
    pub hidden: Linear<B>,
    pub output: Linear<B>,
}

/// `phi = mlp` over blocks of `l` rows of `head_dim`, `hidden` wide.
#[derive(Config, Debug)]
pub struct MlpPhiConfig {
    pub l: usize,
    pub head_dim: usize,
    pub hidden: usize,
}

impl MlpPhiConfig {
    pub fn init<B: Backend>(&self, device: &B::Device) -> MlpPhi<B> {
        let MlpPhiConfig { l, head_dim, hidden } = *self;
        MlpPhi {
            position: Param::from_tensor(Tensor::zeros([l, head_dim], device)),
            hidden: LinearConfig::new(l * head_dim, hidden).init(device),
            output: LinearConfig::new(hidden, head_dim).init(device),
        }
    }
}

impl<B: GemmBackend> MlpPhi<B> {
    /// `blocks: [B, N, l, H, h]` -> `[B, N, H, h]`, the products through the backend's.
    fn forward(&self, blocks: Tensor<B, 5>) -> Tensor<B, 4> {
        let [b, n, l, h, d] = blocks.dims();
        let shifted = blocks + self.position.val().reshape([1, 1, l, 1, d]);
        let rows = shifted.permute([0, 1, 3, 2, 4]).reshape([b * n * h, l * d]);
        apply(&self.output, gelu(apply(&self.hidden, rows))).reshape([b, n, h, d])
    }
}

/// GELU, `x Phi(x)` with `Phi` through `erf`, from tensor ops: Burn 0.21's fused `gelu` takes
/// its gradient from the tanh approximation's derivative, which is not this function's.
fn gelu<B: Backend>(x: Tensor<B, 2>) -> Tensor<B, 2> {
    let phi = x.clone().div_scalar(std::f64::consts::SQRT_2).erf().add_scalar(1.0).div_scalar(2.0);
    x * phi
}

/// Compresses rotated keys and values block by block.
#[derive(Module, Debug)]
pub struct Compressor<B: Backend> {
    /// `phi = linear`'s maps (the field names of checkpoints saved when it was called `mlp`).
    key_phi: Option<LinearPhi<B>>,
    value_phi: Option<LinearPhi<B>>,
    /// `phi = mlp`'s networks.
    key_mlp: Option<MlpPhi<B>>,
    value_mlp: Option<MlpPhi<B>>,
    l: usize,
    d: usize,
}

/// Compression of keys (`d_k` wide) and values (`d_v`) by `phi`: blocks of `l` tokens every `d`.
#[derive(Config, Debug)]
pub struct CompressorConfig {
    pub phi: Phi,
    pub l: usize,
    pub d: usize,
    pub d_k: usize,
    pub d_v: usize,
    /// `phi = mlp`'s hidden width for keys and values (`None`: twice the head dim).
    #[config(default = "None")]
    pub hidden: Option<usize>,
}

impl CompressorConfig {
    pub fn init<B: Backend>(&self, device: &B::Device) -> Compressor<B> {
        let CompressorConfig { phi, l, d, d_k, d_v, hidden } = *self;
        let linear = |h, with_position| {
            (phi == Phi::Linear).then(|| LinearPhiConfig::new(l, h).with_with_position(with_position).init(device))
        };
        let mlp = |h: usize| (phi == Phi::Mlp).then(|| MlpPhiConfig::new(l, h, hidden.unwrap_or(2 * h)).init(device));
        Compressor {
            key_phi: linear(d_k, false),
            value_phi: linear(d_v, true),
            key_mlp: mlp(d_k),
            value_mlp: mlp(d_v),
            l,
            d,
        }
    }
}

impl<B: Backend> Compressor<B> {
    /// The `phi` whose parameters this compressor holds.
    pub fn phi(&self) -> Phi {
        match (&self.key_phi, &self.key_mlp) {
            (Some(_), _) => Phi::Linear,
            (None, Some(_)) => Phi::Mlp,
            (None, None) => Phi::Avg,
        }
    }

    /// `phi = linear`'s maps of keys and values (`None` for the other `phi`s).
    pub fn linear_phi(&self) -> (Option<&LinearPhi<B>>, Option<&LinearPhi<B>>) {
        (self.key_phi.as_ref(), self.value_phi.as_ref())
    }

    /// `phi = mlp`'s networks of keys and values (`None` for the other `phi`s).
    pub fn mlp_phi(&self) -> (Option<&MlpPhi<B>>, Option<&MlpPhi<B>>) {
        (self.key_mlp.as_ref(), self.value_mlp.as_ref())
    }

    /// Compressed blocks that exist in a sequence of `t` tokens.
    pub fn num_blocks(&self, t: usize) -> usize {
        if t < self.l {
            0
        } else {
            (t - self.l) / self.d + 1
        }
    }
}

impl<B: GemmBackend> Compressor<B> {
    /// `k: [B, T, H, d_k]`, `v: [B, T, H, d_v]` -> compressed `[B, N, H, d_k]`, `[B, N, H, d_v]`,
    /// or `None` when `T < l` (no block exists yet). A block is `l / d` consecutive stride-`d`
    /// chunks (`l % d == 0`), so with `phi = avg` or `linear` the blocks are sums of chunk terms
    /// ([`Self::forward_chunked`]); `phi = mlp` takes each block's tokens whole
    /// ([`Self::forward_gathered`]).
    pub fn forward(&self, k: Tensor<B, 4>, v: Tensor<B, 4>) -> Option<(Tensor<B, 4>, Tensor<B, 4>)> {
        match self.key_mlp.is_none() {
            true => self.forward_chunked(k, v),
            false => self.forward_gathered(k, v),
        }
    }

    /// [`Self::forward`] through chunks: block `i` covers chunks `i .. i + l/d` of `d` tokens, so
    /// `phi = avg` is a chunk sum followed by a sum of `l/d` shifted views, and `phi = linear`
    /// (`flatten(block) W`) is the same sum over chunk products `flatten(chunk) W_j`, `W_j` the
    /// rows of `W` that chunk `j` of a block meets. No token is copied `l/d` times, and the
    /// backward is reshapes and adds instead of a scatter-add. Panics for `phi = mlp` (not a
    /// sum over chunks).
    pub fn forward_chunked(&self, k: Tensor<B, 4>, v: Tensor<B, 4>) -> Option<(Tensor<B, 4>, Tensor<B, 4>)> {
        assert!(self.key_mlp.is_none(), "phi = mlp has no chunked form");
        let n = self.num_blocks(k.dims()[1]);
        if n == 0 {
            return None;
        }
        let (key, value) = (self.chunked(&self.key_phi, k, n), self.chunked(&self.value_phi, v, n));
        Some((key, value))
    }

    fn chunked(&self, phi: &Option<LinearPhi<B>>, x: Tensor<B, 4>, n: usize) -> Tensor<B, 4> {
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
                        linear_matmul(rows.clone(), w_j).reshape([b, chunks, h, dh]).narrow(1, j, n)
                    })
                    .collect();
                let sum = products.into_iter().reduce(|acc, p| acc + p).expect("l / d >= 1");
                match &mlp.position {
                    // `(chunk + P_j) W_j = chunk W_j + P_j W_j`: the position adds one vector.
                    Some(position) => {
                        let flat = position.val().reshape([1, self.l * dh]);
                        sum + linear_matmul(flat, weight).reshape([1, 1, 1, dh])
                    }
                    None => sum,
                }
            }
        }
    }

    /// Blocks of `l` tokens each, keys `[B, N, l, H, d_k]` and values `[B, N, l, H, d_v]`, to
    /// one compressed key and value each (`[B, N, H, d]`): what a decode step does with the
    /// block its token completes.
    pub fn compress(&self, k_blocks: Tensor<B, 5>, v_blocks: Tensor<B, 5>) -> (Tensor<B, 4>, Tensor<B, 4>) {
        let key = self.apply_phi(&self.key_phi, &self.key_mlp, k_blocks);
        let value = self.apply_phi(&self.value_phi, &self.value_mlp, v_blocks);
        (key, value)
    }

    /// [`Self::forward`] from each block's `l` tokens whole ([`Self::gather_blocks`]).
    pub fn forward_gathered(&self, k: Tensor<B, 4>, v: Tensor<B, 4>) -> Option<(Tensor<B, 4>, Tensor<B, 4>)> {
        let n = self.num_blocks(k.dims()[1]);
        if n == 0 {
            return None;
        }
        Some(self.compress(self.gather_blocks(k, n), self.gather_blocks(v, n)))
    }

    /// `blocks: [B, N, l, H, h]` -> `[B, N, H, h]` through whichever `phi` is configured.
    fn apply_phi(&self, linear: &Option<LinearPhi<B>>, mlp: &Option<MlpPhi<B>>, blocks: Tensor<B, 5>) -> Tensor<B, 4> {
        match (linear, mlp) {
            (Some(linear), _) => linear.forward(blocks),
            (None, Some(mlp)) => mlp.forward(blocks),
            (None, None) => {
                let [b, n, _, h, d] = blocks.dims();
                blocks.mean_dim(2).reshape([b, n, h, d])
            }
        }
    }

    /// Each block's `l` tokens, `[B, N, l, H, h]`. Block `i` is chunks `i .. i + l/d` of `d`
    /// tokens (`NsaConfig` requires `l % d == 0`), so the blocks are `l/d` shifted views of the
    /// chunks side by side: no gather, and the backward is slices and adds, where a gather's
    /// would be a scatter-add over `N * l` rows.
    fn gather_blocks(&self, x: Tensor<B, 4>, n: usize) -> Tensor<B, 5> {
        assert!(self.l.is_multiple_of(self.d), "l = {} is not a multiple of d = {}", self.l, self.d);
        let [b, _, h, dh] = x.dims();
        let (d, per_block) = (self.d, self.l / self.d);
        let chunks = n + per_block - 1;
        let x = x.narrow(1, 0, chunks * d).reshape([b, chunks, d, h, dh]);
        Tensor::cat((0..per_block).map(|j| x.clone().narrow(1, j, n)).collect(), 2)
    }
}
