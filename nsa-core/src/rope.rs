//! Rotary position embedding on interleaved pairs `(2i, 2i+1)`.
//!
//! The cos/sin table is computed once on the host in f64 and stored in the module, so positions
//! stay exact whatever the compute dtype (bf16 cannot even represent position 257 exactly). It
//! holds each pair's angle twice (`[max_len, d]`), so the rotation is an element-wise expression
//! over whole rows: Burn fuses it with 16-byte vector loads, where a trailing pair axis of 2
//! would leave one element per unit.

use burn::config::Config;
use burn::module::Module;
use burn::tensor::{backend::Backend, DType, Int, Tensor, TensorData};
use nsa_kernels::{linear_matmul, Documents, GemmBackend};

use crate::constants::cached;

#[derive(Module, Debug)]
pub struct Rope<B: Backend> {
    /// `cos(pos * theta_i)` at columns `2i` and `2i + 1`, `[max_len, d]`.
    cos: Tensor<B, 2>,
    /// `sin(pos * theta_i)` at columns `2i` and `2i + 1`, `[max_len, d]`.
    sin: Tensor<B, 2>,
}

/// The rotation table: positions `0..max_len` of a head dim `head_dim` (even).
#[derive(Config, Debug)]
pub struct RopeConfig {
    pub max_len: usize,
    pub head_dim: usize,
    /// `theta_i = base^(-2i / head_dim)`.
    #[config(default = 10000.0)]
    pub base: f64,
}

impl RopeConfig {
    pub fn init<B: Backend>(&self, device: &B::Device) -> Rope<B> {
        let RopeConfig { max_len, head_dim, base } = *self;
        let half = head_dim / 2;
        let mut cos = Vec::with_capacity(max_len * head_dim);
        let mut sin = Vec::with_capacity(max_len * head_dim);
        for pos in 0..max_len {
            for i in 0..half {
                let angle = pos as f64 * base.powf(-2.0 * i as f64 / head_dim as f64);
                cos.extend([angle.cos(); 2]);
                sin.extend([angle.sin(); 2]);
            }
        }
        let table = |v: Vec<f64>| Tensor::from_data(TensorData::new(v, [max_len, head_dim]), device);
        Rope { cos: table(cos), sin: table(sin) }
    }
}

impl<B: Backend> Rope<B> {
    /// Longest sequence the table covers.
    pub fn max_len(&self) -> usize {
        self.cos.dims()[0]
    }
}

impl<B: GemmBackend> Rope<B> {
    /// Rotates `x: [B, H, T, d]` at positions `0..T`, or at each position's place in its
    /// document.
    pub fn apply(&self, x: Tensor<B, 4>, documents: Option<&Documents<B>>) -> Tensor<B, 4> {
        self.rotate(x, 2, documents)
    }

    /// Rotates `x: [B, T, H, d]` (tokens before heads) at positions `0..T`, or at each
    /// position's place in its document.
    pub fn apply_tokens_first(&self, x: Tensor<B, 4>, documents: Option<&Documents<B>>) -> Tensor<B, 4> {
        self.rotate(x, 1, documents)
    }

    /// Rotates `x` whose axis `axis` is the position (1 or 2) and last axis the head dim.
    fn rotate(&self, x: Tensor<B, 4>, axis: usize, documents: Option<&Documents<B>>) -> Tensor<B, 4> {
        let [b, d] = [x.dims()[0], x.dims()[3]];
        let t = x.dims()[axis];
        assert!(
            t <= self.max_len(),
            "sequence length {t} exceeds the model's RoPE table ({}); raise seq_len in the config",
            self.max_len()
        );
        // The table is stored at the model's default dtype; a mixed-precision forward rotates in
        // its compute dtype (Burn's binary ops do not promote mismatched dtypes).
        let dtype = x.dtype();
        let rows = |table: &Tensor<B, 2>| match documents {
            None => {
                let mut shape = [1, 1, 1, d];
                shape[axis] = t;
                table.clone().narrow(0, 0, t).cast(dtype).reshape(shape)
            }
            Some(documents) => {
                let mut shape = [b, 1, 1, d];
                shape[axis] = t;
                table.clone().select(0, documents.positions().reshape([b * t])).cast(dtype).reshape(shape)
            }
        };
        rotate_with(x, rows(&self.cos), rows(&self.sin))
    }

    /// The rotation of one token per sequence at each row's position `at: [B]`, in `dtype`: a
    /// decode step takes it from the table once for every layer's queries and keys.
    pub fn rows_at(&self, at: &Tensor<B, 1, Int>, dtype: DType) -> RopeRows<B> {
        let (b, d) = (at.dims()[0], self.cos.dims()[1]);
        let row = |table: &Tensor<B, 2>| table.clone().select(0, at.clone()).cast(dtype).reshape([b, 1, 1, d]);
        RopeRows { cos: row(&self.cos), sin: row(&self.sin) }
    }
}

/// The table's rows at one position per sequence, `[B, 1, 1, d]` each ([`Rope::rows_at`]).
#[derive(Clone, Debug)]
pub struct RopeRows<B: Backend> {
    cos: Tensor<B, 4>,
    sin: Tensor<B, 4>,
}

impl<B: GemmBackend> RopeRows<B> {
    /// Rotates `x: [B, 1, H, d]` (one token per sequence) at the rows' positions.
    pub fn rotate(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        rotate_with(x, self.cos.clone(), self.sin.clone())
    }

    /// The cosines and sines as `[B, d]` rows (each pair's angle twice), for a kernel that
    /// rotates by them.
    pub fn rows(&self) -> [Tensor<B, 2>; 2] {
        [&self.cos, &self.sin].map(|x| {
            let [b, _, _, d] = x.dims();
            x.clone().reshape([b, d])
        })
    }
}

/// `x` rotated by the angles whose cosines and sines `cos` and `sin` hold (broadcast over `x`).
fn rotate_with<B: GemmBackend>(x: Tensor<B, 4>, cos: Tensor<B, 4>, sin: Tensor<B, 4>) -> Tensor<B, 4> {
    let d = x.dims()[3];
    let half = d / 2;
    let dtype = x.dtype();
    // Each pair (e, o) -> (e cos - o sin, e sin + o cos) = (e, o) cos + (-o, e) sin. The
    // swapped, signed pairs are `x S` for a fixed signed permutation `S` (exact in any dtype:
    // each output is one input, negated or not), a product on the tensor cores whose
    // backward is a product too; a flip would be a copy kernel of its own each way, and
    // splitting x into even and odd halves would need slices, fills and slice-assigns.
    let device = x.device();
    let swap = cached::<B, _>(&format!("rope_swap_{dtype:?}"), &[d], &device, || {
        let mut s = vec![0.0f64; d * d];
        for i in 0..half {
            s[(2 * i + 1) * d + 2 * i] = -1.0; // column 2i takes -x[2i + 1]
            s[2 * i * d + 2 * i + 1] = 1.0; // column 2i + 1 takes x[2i]
        }
        Tensor::<B, 2>::from_data(TensorData::new(s, [d, d]), &device).cast(dtype)
    });
    x.clone() * cos + linear_matmul(x, swap) * sin
}
