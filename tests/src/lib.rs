//! Support code for the cross-crate tests: the float64 reference, random inputs and weights,
//! and extraction of a layer's weights into plain matrices.
//!
//! The references are index loops written to read like the spec's sums, so clippy's iterator
//! rewrites are not applied to them.
#![allow(clippy::needless_range_loop)]

pub mod attention;
pub mod reference;

use burn::backend::{Autodiff, NdArray};
use burn::module::{Module, ModuleMapper, Param};
use burn::tensor::{backend::Backend, Int, Tensor, TensorData};
use nsa_core::attention::compress::{LinearPhi, MlpPhi};
use nsa_core::NsaAttention;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use reference::{Mat, NsaWeights, PhiWeights};

/// Float64 CPU backend: parity tests run the layer in f64 so selection never flips on rounding.
pub type B64 = NdArray<f64>;
/// Float64 with autodiff, for gradient checks.
pub type A64 = Autodiff<NdArray<f64>>;

/// The small shape most tests start from: dim 24, 4 query heads on 2 KV heads, `d_k = d_v = 8`,
/// `l = 8, d = 4, l_sel = 8, n = 4, w = 16`.
pub fn small_config() -> nsa_core::NsaConfig {
    nsa_core::NsaConfig::new()
        .with_dim(24)
        .with_n_heads(4)
        .with_n_kv_heads(2)
        .with_d_k(8)
        .with_d_v(8)
        .with_l(8)
        .with_d(4)
        .with_l_sel(8)
        .with_n(4)
        .with_w(16)
}

/// A fresh seed per run (printed, so a failure can be replayed with [`rng_from`]).
pub fn fresh_rng(test: &str) -> StdRng {
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    eprintln!("{test}: seed {seed}");
    rng_from(seed)
}

pub fn rng_from(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

/// Random document starts for `b` rows of `t` positions (`[b * t]`, each position's start): a
/// new document may begin at any multiple of `step` after 0, with probability `p`.
pub fn random_starts(rng: &mut StdRng, b: usize, t: usize, step: usize, p: f64) -> Vec<i64> {
    let mut starts = Vec::with_capacity(b * t);
    for _ in 0..b {
        let mut start = 0;
        for pos in 0..t {
            if pos > 0 && pos % step == 0 && rng.random_bool(p) {
                start = pos as i64;
            }
            starts.push(start);
        }
    }
    starts
}

/// Standard normal draws.
pub fn normal(rng: &mut StdRng, n: usize, std: f64) -> Vec<f64> {
    (0..n)
        .map(|_| {
            // Box-Muller: keeps the test crate free of distribution dependencies.
            let u1: f64 = rng.random::<f64>().max(1e-300);
            let u2: f64 = rng.random();
            std * (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
        })
        .collect()
}

/// Replaces every float parameter of a module with `N(0, std)` draws, so parity tests do not
/// lean on any structure of the initialisation (zero gates, identity `phi`).
pub struct Randomize<'a> {
    pub rng: &'a mut StdRng,
    pub std: f64,
}

impl<B: Backend> ModuleMapper<B> for Randomize<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, tensor, mapper) = param.consume();
        let shape = tensor.shape();
        let data = TensorData::new(normal(self.rng, shape.num_elements(), self.std), shape);
        // A fresh tensor is a leaf without grad tracking: keep the original's flag.
        let fresh = Tensor::from_data(data, &tensor.device()).set_require_grad(tensor.is_require_grad());
        Param::from_mapped_value(id, fresh, mapper)
    }
}

pub fn randomized<B: Backend, M: Module<B>>(module: M, rng: &mut StdRng, std: f64) -> M {
    module.map(&mut Randomize { rng, std })
}

pub fn to_vec<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f64> {
    t.into_data().convert::<f64>().to_vec::<f64>().unwrap()
}

/// Block lists `[B, T, H_kv, n]` (`-1` in unused slots) as the selected blocks of each
/// `[b][kv head][query]`, ascending.
pub fn selection_sets<B: Backend>(list: Tensor<B, 4, Int>) -> Vec<Vec<Vec<Vec<usize>>>> {
    let [b, t, h, n] = list.dims();
    let flat = list.into_data().convert::<i64>().to_vec::<i64>().unwrap();
    let row = |bi: usize, ti: usize, hi: usize| -> Vec<usize> {
        let slots = &flat[((bi * t + ti) * h + hi) * n..][..n];
        slots.iter().filter(|&&j| j >= 0).map(|&j| j as usize).collect()
    };
    (0..b).map(|bi| (0..h).map(|hi| (0..t).map(|ti| row(bi, ti, hi)).collect()).collect()).collect()
}

fn mat<B: Backend>(t: Tensor<B, 2>) -> Mat {
    let [rows, cols] = t.dims();
    Mat { rows, cols, data: to_vec(t) }
}

fn linear_weights<B: Backend>(phi: &LinearPhi<B>) -> PhiWeights {
    PhiWeights::Linear { position: phi.position.as_ref().map(|p| mat(p.val())), weight: mat(phi.weight.val()) }
}

fn mlp_weights<B: Backend>(phi: &MlpPhi<B>) -> PhiWeights {
    let bias = |linear: &burn::nn::Linear<B>| {
        linear.bias.as_ref().map(|b| to_vec(b.val())).expect("phi's linears have biases")
    };
    PhiWeights::Mlp {
        position: mat(phi.position.val()),
        hidden: mat(phi.hidden.weight.val()),
        hidden_bias: bias(&phi.hidden),
        output: mat(phi.output.weight.val()),
        output_bias: bias(&phi.output),
    }
}

/// Every weight of a layer, as plain matrices for the reference.
pub fn weights_of<B: Backend>(layer: &NsaAttention<B>) -> NsaWeights {
    let gate_bias =
        layer.gate.bias.as_ref().map(|b| to_vec(b.val())).unwrap_or_else(|| vec![0.0; layer.gate.weight.dims()[1]]);
    let ((linear_key, linear_value), (mlp_key, mlp_value)) =
        (layer.compressor.linear_phi(), layer.compressor.mlp_phi());
    let phi_key = linear_key.map(linear_weights).or_else(|| mlp_key.map(mlp_weights));
    let phi_value = linear_value.map(linear_weights).or_else(|| mlp_value.map(mlp_weights));
    NsaWeights {
        query: mat(layer.query.weight.val()),
        kv: layer.kv.iter().map(|kv| (mat(kv.key.weight.val()), mat(kv.value.weight.val()))).collect(),
        phi_key,
        phi_value,
        gate: mat(layer.gate.weight.val()),
        gate_bias,
        output: mat(layer.output.weight.val()),
    }
}

/// A random input `[B, T, dim]` as a tensor and as per-sequence flat vectors.
pub fn random_input<B: Backend>(
    rng: &mut StdRng,
    b: usize,
    t: usize,
    dim: usize,
    device: &B::Device,
) -> (Tensor<B, 3>, Vec<Vec<f64>>) {
    let rows: Vec<Vec<f64>> = (0..b).map(|_| normal(rng, t * dim, 1.0)).collect();
    let flat: Vec<f64> = rows.concat();
    (Tensor::from_data(TensorData::new(flat, [b, t, dim]), device), rows)
}

/// Runs the calling test binary's test `name` (one marked `#[ignore]`, so a plain run skips it) in
/// a process of its own, failing with its output if it fails: for a test that changes what a whole
/// process does (its panic hook).
pub fn in_own_process(name: &str) {
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new(exe).args([name, "--exact", "--ignored", "--nocapture"]).output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && stdout.contains("1 passed"), "{name} in its own process:\n{stdout}\n{stderr}");
}

/// `max |a - b| / max |b|`: the error relative to the reference's scale.
pub fn max_rel_err(a: &[f64], reference: &[f64]) -> f64 {
    assert_eq!(a.len(), reference.len(), "length mismatch");
    let scale = reference.iter().fold(0.0f64, |m, v| m.max(v.abs())).max(1e-12);
    a.iter().zip(reference).fold(0.0f64, |m, (x, y)| m.max((x - y).abs())) / scale
}
