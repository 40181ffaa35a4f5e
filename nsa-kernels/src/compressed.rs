//! The compressed branch on `CubeBackend`: the problem (shapes, block geometry), its products as
//! batched GEMMs ([`batched_gemm`]: cuBLASLt on CUDA) around the row kernels of
//! [`crate::kernel::compression::rows`], and the selection scores ([`crate::kernel::compression::scores`]).

use burn::tensor::{DType, Shape};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::prelude::*;
use cubecl::{calculate_cube_count_elemwise, CubeDim};

use crate::gemm::batched_gemm;
use crate::kernel::compression::rows::{self as compressed_rows, ROW_UNITS};
use crate::kernel::compression::scores as compressed;

/// Rows of the score matrix per cube of the row kernels.
const ROWS_PER_CUBE: usize = 32;
/// The products' key width is a multiple of this: 16-byte aligned bf16 and f32 rows.
const WIDTH_MULTIPLE: usize = 16;

/// `q [B, T, H_q, d_k]` against compressed `k [B, N, H_kv, d_k]`, `v [B, N, H_kv, d_v]`, block
/// `i` covering raw tokens `[i * stride, i * stride + length)`.
pub struct Problem<R: CubeRuntime> {
    q: CubeTensor<R>,
    k: CubeTensor<R>,
    v: CubeTensor<R>,
    length: u32,
    stride: u32,
    scale: f32,
    g: usize,
}

impl<R: CubeRuntime> Problem<R> {
    pub fn new(q: CubeTensor<R>, k: CubeTensor<R>, v: CubeTensor<R>, length: usize, stride: usize) -> Self {
        let (qs, ks, vs) = (q.meta.shape().clone(), k.meta.shape().clone(), v.meta.shape().clone());
        assert!(qs.num_dims() == 4 && ks.num_dims() == 4 && vs.num_dims() == 4, "attention takes [B, T, H, d] tensors");
        assert!(qs[0] == ks[0] && ks[..3] == vs[..3], "q, k, v disagree on batch or heads");
        assert!(qs[3] == ks[3] && ks[2] > 0 && qs[2] % ks[2] == 0, "q and k head dims or head counts disagree");
        assert!(length > 0 && stride > 0, "compressed blocks need a length and a stride");
        let (d_k, g) = (qs[3], qs[2] / ks[2]);
        Problem {
            q: into_contiguous(q),
            k: into_contiguous(k),
            v: into_contiguous(v),
            length: u32::try_from(length).expect("block length fits in u32"),
            stride: u32::try_from(stride).expect("block stride fits in u32"),
            scale: 1.0 / (d_k as f32).sqrt(),
            g,
        }
    }

    fn client(&self) -> ComputeClient<R> {
        self.q.client.clone()
    }

    fn dims(&self) -> [usize; 3] {
        let [b, t, h_q, _] = self.q.meta.shape().dims::<4>();
        [b, t, h_q]
    }

    fn empty(&self, shape: Shape, dtype: DType) -> CubeTensor<R> {
        empty_device_contiguous_dtype::<R>(self.client(), self.q.device.clone(), shape, dtype)
    }

    /// Output `[B, T, H_q, d_v]` and log-sum-exp `[B, T, H_q]` (f32).
    pub fn forward(&self) -> (CubeTensor<R>, CubeTensor<R>) {
        let [b, t, h_q] = self.dims();
        let dtype = self.q.dtype;
        let (q, k, v) = (heads_first(self.q.clone()), self.expand(&self.k), self.expand(&self.v));
        let scores = batched_gemm(q, k, false, true, DType::F32);
        let probs = self.empty(scores.meta.shape().clone(), dtype);
        let lse = self.empty(Shape::new([b, t, h_q]), DType::F32);
        let (count, dim) = self.row_plan();
        compressed_rows::compressed_probs::launch::<R>(
            &self.client(),
            count,
            dim,
            scores.into_tensor_arg(),
            probs.clone().into_tensor_arg(),
            lse.clone().into_tensor_arg(),
            self.scale,
            self.length,
            self.stride,
            self.n(),
            ROWS_PER_CUBE,
            dtype.into(),
        );
        let out = batched_gemm(probs, v, false, false, dtype);
        (tokens_first(out, b), lse)
    }

    /// Gradients of `q`, `k`, `v` from the forward's log-sum-exp: the scores and `dp = dO v^T`
    /// again as products, then `dq = ds k`, `dk = ds^T q`, `dv = p^T dO` (the last two in f32
    /// until the group's heads are added).
    pub fn backward(&self, lse: CubeTensor<R>, grad_out: CubeTensor<R>) -> [CubeTensor<R>; 3] {
        let [b, _, _] = self.dims();
        let dtype = self.q.dtype;
        let (q, k, v) = (heads_first(self.q.clone()), self.expand(&self.k), self.expand(&self.v));
        let grad_out = heads_first(grad_out);
        let scores = batched_gemm(q.clone(), k.clone(), false, true, DType::F32);
        let grad_probs = batched_gemm(grad_out.clone(), v, false, true, DType::F32);
        let grad_scores = self.empty(scores.meta.shape().clone(), dtype);
        let probs = self.empty(scores.meta.shape().clone(), dtype);
        let (count, dim) = self.row_plan();
        compressed_rows::compressed_grad_scores::launch::<R>(
            &self.client(),
            count,
            dim,
            scores.into_tensor_arg(),
            grad_probs.into_tensor_arg(),
            into_contiguous(lse).into_tensor_arg(),
            grad_scores.clone().into_tensor_arg(),
            probs.clone().into_tensor_arg(),
            self.scale,
            self.length,
            self.stride,
            self.n(),
            ROWS_PER_CUBE,
            dtype.into(),
        );
        let grad_q = tokens_first(batched_gemm(grad_scores.clone(), k, false, false, dtype), b);
        let grad_k = self.sum_heads(batched_gemm(grad_scores, q, true, false, DType::F32), &self.k);
        let grad_v = self.sum_heads(batched_gemm(probs, grad_out, true, false, DType::F32), &self.v);
        [grad_q, grad_k, grad_v]
    }

    /// Compressed blocks `N`.
    fn n(&self) -> u32 {
        u32::try_from(self.k.meta.shape()[1]).expect("compressed blocks fit in u32")
    }

    /// The products' key width: `N` padded to [`WIDTH_MULTIPLE`] (at least one, so that a
    /// sequence shorter than a block still has a product to run; its rows see nothing).
    fn width(&self) -> usize {
        (self.n() as usize).max(1).next_multiple_of(WIDTH_MULTIPLE)
    }

    /// `x [B, N, H_kv, d]` -> `[B * H_q, width, d]`: each query head's own copy of its KV
    /// head's rows, so that every product is one strided batch.
    fn expand(&self, x: &CubeTensor<R>) -> CubeTensor<R> {
        let [b, _, h_q] = self.dims();
        let d = x.meta.shape()[3];
        let out = self.empty(Shape::new([b * h_q, self.width(), d]), x.dtype);
        let dim = CubeDim::new_1d(256);
        compressed_rows::expand_heads::launch::<R>(
            &self.client(),
            calculate_cube_count_elemwise(&self.client(), out.meta.shape().num_elements(), dim),
            dim,
            x.clone().into_tensor_arg(),
            out.clone().into_tensor_arg(),
            self.g,
            x.dtype.into(),
        );
        out
    }

    /// `[B * H_q, width, d]` (f32) -> `[B, N, H_kv, d]` like `like`: the group's heads added.
    fn sum_heads(&self, x: CubeTensor<R>, like: &CubeTensor<R>) -> CubeTensor<R> {
        let out = self.empty(like.meta.shape().clone(), like.dtype);
        let dim = CubeDim::new_1d(256);
        compressed_rows::sum_heads::launch::<R>(
            &self.client(),
            calculate_cube_count_elemwise(&self.client(), out.meta.shape().num_elements(), dim),
            dim,
            x.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            self.g,
            like.dtype.into(),
        );
        out
    }

    /// The row kernels' launch: [`ROWS_PER_CUBE`] rows of `[B * H_q, T]` per cube.
    fn row_plan(&self) -> (CubeCount, CubeDim) {
        let [b, t, h_q] = self.dims();
        let dim = CubeDim::new_1d((ROWS_PER_CUBE * ROW_UNITS) as u32);
        (calculate_cube_count_elemwise(&self.client(), b * h_q * t * ROW_UNITS, dim), dim)
    }

    /// Selection scores `[B, H_kv, T, ceil(T / block_size)]` (f32) from the forward's
    /// log-sum-exp: the raw scores again as one product, then one unit per output.
    pub fn block_scores(&self, lse: CubeTensor<R>, block_size: usize) -> CubeTensor<R> {
        let [b, t, _] = self.dims();
        let h_kv = self.k.meta.shape()[2];
        let scores = batched_gemm(heads_first(self.q.clone()), self.expand(&self.k), false, true, DType::F32);
        let out = self.empty(Shape::new([b, h_kv, t, t.div_ceil(block_size)]), DType::F32);
        let dim = CubeDim::new_1d(256);
        compressed::compressed_block_scores::launch::<R>(
            &self.client(),
            calculate_cube_count_elemwise(&self.client(), out.meta.shape().num_elements(), dim),
            dim,
            scores.into_tensor_arg(),
            into_contiguous(lse).into_tensor_arg(),
            out.clone().into_tensor_arg(),
            self.scale,
            self.length,
            self.stride,
            u32::try_from(block_size).expect("block size fits in u32"),
            self.n(),
            self.g,
        );
        out
    }
}

/// `[B, T, H, d]` -> `[B * H, T, d]` (contiguous): one matrix per head.
fn heads_first<R: CubeRuntime>(x: CubeTensor<R>) -> CubeTensor<R> {
    let [b, t, h, d] = x.meta.shape().dims::<4>();
    burn_cubecl::ops::reshape(swap_middle_axes(x), Shape::new([b * h, t, d]))
}

/// `[B * H, T, d]` -> `[B, T, H, d]` (contiguous).
fn tokens_first<R: CubeRuntime>(x: CubeTensor<R>, b: usize) -> CubeTensor<R> {
    let [bh, t, d] = x.meta.shape().dims::<3>();
    swap_middle_axes(burn_cubecl::ops::reshape(x, Shape::new([b, bh / b, t, d])))
}

/// `[A, X, Y, d]` -> `[A, Y, X, d]` (contiguous), whole rows of `d` per kernel unit: Burn's
/// permuted copy indexes every element through all four strides.
fn swap_middle_axes<R: CubeRuntime>(x: CubeTensor<R>) -> CubeTensor<R> {
    let x = into_contiguous(x);
    let [a, x_len, y_len, d] = x.meta.shape().dims::<4>();
    let client = x.client.clone();
    let vector = client.io_optimized_vector_sizes(x.dtype.size()).find(|v| d % v == 0).unwrap_or(1);
    let out =
        empty_device_contiguous_dtype::<R>(client.clone(), x.device.clone(), Shape::new([a, y_len, x_len, d]), x.dtype);
    let dim = CubeDim::new_1d(256);
    compressed_rows::swap_middle_axes::launch::<R>(
        &client,
        calculate_cube_count_elemwise(&client, out.meta.shape().num_elements() / vector, dim),
        dim,
        vector,
        x.clone().into_tensor_arg(),
        out.clone().into_tensor_arg(),
        vector,
        x.dtype.into(),
    );
    out
}
