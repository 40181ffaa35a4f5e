//! The compressed branch as batched dense products ([`batched_gemm`]: cuBLASLt on CUDA) around
//! the row kernels of [`crate::kernel::compression::rows`], a chunk of queries at a time: the
//! path for what [`super::interleaved`] does not take.

use burn::tensor::{DType, Shape};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::prelude::*;
use cubecl::{calculate_cube_count_elemwise, CubeDim};

use crate::gemm::batched_gemm;
use crate::kernel::compression::rows::{self as compressed_rows, ROW_UNITS};

/// Rows of the score matrix per cube of the row kernels.
const ROWS_PER_CUBE: usize = 32;
/// Device memory a chunk of queries' score matrices may take (see [`Products::chunks`]).
const CHUNK_BYTES: usize = 1 << 30;
/// The products' key width is a multiple of this: 16-byte aligned bf16 and f32 rows.
const WIDTH_MULTIPLE: usize = 16;

/// `q [B, T, H_q, d_k]` against compressed `k [B, N, H_kv, d_k]`, `v [B, N, H_kv, d_v]`, block
/// `i` covering raw tokens `[i * stride, i * stride + length)`.
pub struct Products<R: CubeRuntime> {
    q: CubeTensor<R>,
    k: CubeTensor<R>,
    v: CubeTensor<R>,
    length: u32,
    stride: u32,
    scale: f32,
    g: usize,
    /// Queries per chunk, when set (see [`Self::chunks`]).
    chunk_queries: Option<usize>,
}

impl<R: CubeRuntime> Products<R> {
    pub fn new(q: CubeTensor<R>, k: CubeTensor<R>, v: CubeTensor<R>, length: usize, stride: usize) -> Self {
        let (qs, ks, vs) = (q.meta.shape().clone(), k.meta.shape().clone(), v.meta.shape().clone());
        assert!(qs.num_dims() == 4 && ks.num_dims() == 4 && vs.num_dims() == 4, "attention takes [B, T, H, d] tensors");
        assert!(qs[0] == ks[0] && ks[..3] == vs[..3], "q, k, v disagree on batch or heads");
        assert!(qs[3] == ks[3] && ks[2] > 0 && qs[2] % ks[2] == 0, "q and k head dims or head counts disagree");
        assert!(length > 0 && stride > 0, "compressed blocks need a length and a stride");
        let (d_k, g) = (qs[3], qs[2] / ks[2]);
        Products {
            q: into_contiguous(q),
            k: into_contiguous(k),
            v: into_contiguous(v),
            length: u32::try_from(length).expect("block length fits in u32"),
            stride: u32::try_from(stride).expect("block stride fits in u32"),
            scale: 1.0 / (d_k as f32).sqrt(),
            g,
            chunk_queries: None,
        }
    }

    /// The same problem run `queries` queries per chunk instead of by the memory budget (for
    /// tests: chunks show only at lengths CI cannot run).
    pub fn with_chunk_queries(self, queries: usize) -> Self {
        Self { chunk_queries: Some(queries.max(1)), ..self }
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

    /// Output `[B, T, H_q, d_v]` and log-sum-exp `[B, T, H_q]` (f32), a chunk of queries at a
    /// time ([`Self::chunks`]).
    pub fn forward(&self) -> (CubeTensor<R>, CubeTensor<R>) {
        let [b, t, h_q] = self.dims();
        let dtype = self.q.dtype;
        let (k, v) = (self.expand(&self.k), self.expand(&self.v));
        let out = self.empty(Shape::new([b, t, h_q, self.v.meta.shape()[3]]), dtype);
        let lse = self.empty(Shape::new([b, t, h_q]), DType::F32);
        for (t0, len) in self.chunks() {
            let (k, v) = self.chunk_keys(&k, &v, t0 + len);
            let scores = batched_gemm(take_chunk(&self.q, t0, len), k, false, true, DType::F32);
            let probs = self.empty(scores.meta.shape().clone(), dtype);
            let (count, dim) = self.row_plan(len);
            compressed_rows::compressed_probs::launch::<R>(
                &self.client(),
                count,
                dim,
                scores.into_tensor_arg(),
                probs.clone().into_tensor_arg(),
                lse.clone().into_tensor_arg(),
                self.scale,
                chunk_start(t0),
                self.length,
                self.stride,
                self.n(),
                ROWS_PER_CUBE,
                dtype.into(),
            );
            put_chunk(batched_gemm(probs, v, false, false, dtype), &out, b, t0);
        }
        (out, lse)
    }

    /// Gradients of `q`, `k`, `v` from the forward's log-sum-exp, a chunk of queries at a time:
    /// the scores and `dp = dO v^T` again as products, then `dq = ds k`, and the chunk's shares
    /// of `dk = ds^T q`, `dv = p^T dO` (f32, added over chunks, then over the group's heads).
    pub fn backward(&self, lse: CubeTensor<R>, grad_out: CubeTensor<R>) -> [CubeTensor<R>; 3] {
        let [b, t, h_q] = self.dims();
        let dtype = self.q.dtype;
        let (k, v) = (self.expand(&self.k), self.expand(&self.v));
        let (lse, grad_out) = (into_contiguous(lse), into_contiguous(grad_out));
        let grad_q = self.empty(Shape::new([b, t, h_q, self.q.meta.shape()[3]]), dtype);
        let mut sums: Option<(CubeTensor<R>, CubeTensor<R>)> = None;
        // The last chunk first: it sees every key, so its shares start the sums at full width.
        for (t0, len) in self.chunks().into_iter().rev() {
            let (q, grad_out) = (take_chunk(&self.q, t0, len), take_chunk(&grad_out, t0, len));
            let (k, v) = self.chunk_keys(&k, &v, t0 + len);
            let scores = batched_gemm(q.clone(), k.clone(), false, true, DType::F32);
            let grad_probs = batched_gemm(grad_out.clone(), v, false, true, DType::F32);
            let grad_scores = self.empty(scores.meta.shape().clone(), dtype);
            let probs = self.empty(scores.meta.shape().clone(), dtype);
            let (count, dim) = self.row_plan(len);
            compressed_rows::compressed_grad_scores::launch::<R>(
                &self.client(),
                count,
                dim,
                scores.into_tensor_arg(),
                grad_probs.into_tensor_arg(),
                lse.clone().into_tensor_arg(),
                grad_scores.clone().into_tensor_arg(),
                probs.clone().into_tensor_arg(),
                self.scale,
                chunk_start(t0),
                self.length,
                self.stride,
                self.n(),
                ROWS_PER_CUBE,
                dtype.into(),
            );
            put_chunk(batched_gemm(grad_scores.clone(), k, false, false, dtype), &grad_q, b, t0);
            let grad_k = batched_gemm(grad_scores, q, true, false, DType::F32);
            let grad_v = batched_gemm(probs, grad_out, true, false, DType::F32);
            sums = Some(match sums {
                None => (grad_k, grad_v),
                Some((dk, dv)) => (add_leading_rows(dk, grad_k), add_leading_rows(dv, grad_v)),
            });
        }
        let (grad_k, grad_v) = sums.expect("a sequence has at least one chunk");
        [grad_q, self.sum_heads(grad_k, &self.k), self.sum_heads(grad_v, &self.v)]
    }

    /// The query chunks `(t0, len)`: as many queries per chunk as keep a chunk's score
    /// matrices (`B * H_q * T_c * width`, f32 scores and `dp`, 16-bit probabilities and score
    /// gradients: 12 bytes an element) within [`CHUNK_BYTES`], so that the branch's memory
    /// grows linearly in `T` rather than as `T x N`.
    fn chunks(&self) -> Vec<(usize, usize)> {
        let [b, t, h_q] = self.dims();
        let per_query = b * h_q * self.width() * 12;
        let len = self.chunk_queries.unwrap_or((CHUNK_BYTES / per_query).max(ROWS_PER_CUBE)).min(t.max(1));
        (0..t).step_by(len).map(|t0| (t0, len.min(t - t0))).collect()
    }

    /// The products' key width for the queries before `t_end`: the blocks the last of them
    /// sees, padded as [`Self::width`] pads `N` (the keys past them are masked for every query
    /// of the chunk, so the products skip them).
    fn chunk_width(&self, t_end: usize) -> usize {
        let (length, stride) = (self.length as usize, self.stride as usize);
        let seen = if t_end >= length { ((t_end - length) / stride + 1).min(self.n() as usize) } else { 0 };
        seen.max(1).next_multiple_of(WIDTH_MULTIPLE)
    }

    /// The expanded keys and values (`[B * H_q, width, d]`) the queries before `t_end` see.
    fn chunk_keys(&self, k: &CubeTensor<R>, v: &CubeTensor<R>, t_end: usize) -> (CubeTensor<R>, CubeTensor<R>) {
        let width = self.chunk_width(t_end);
        (leading_rows(k, width), leading_rows(v, width))
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

    /// The row kernels' launch over a chunk of `t` queries: [`ROWS_PER_CUBE`] rows of
    /// `[B * H_q, t]` per cube.
    fn row_plan(&self, t: usize) -> (CubeCount, CubeDim) {
        let [b, _, h_q] = self.dims();
        let dim = CubeDim::new_1d((ROWS_PER_CUBE * ROW_UNITS) as u32);
        (calculate_cube_count_elemwise(&self.client(), b * h_q * t * ROW_UNITS, dim), dim)
    }
}

/// Queries `t0..t0 + len` of `x [B, T, H, d]` as `[B * H, len, d]` (contiguous): one matrix per
/// head.
fn take_chunk<R: CubeRuntime>(x: &CubeTensor<R>, t0: usize, len: usize) -> CubeTensor<R> {
    let [b, _, h, d] = x.meta.shape().dims::<4>();
    let out = swap_middle_axes(x, Shape::new([b, h, len, d]), [t0, 0], [len, h]);
    burn_cubecl::ops::reshape(out, Shape::new([b * h, len, d]))
}

/// A chunk's `[B * H, len, d]` rows into queries `t0..t0 + len` of `dst [B, T, H, d]`.
fn put_chunk<R: CubeRuntime>(x: CubeTensor<R>, dst: &CubeTensor<R>, b: usize, t0: usize) {
    let [bh, len, d] = x.meta.shape().dims::<3>();
    let x = burn_cubecl::ops::reshape(x, Shape::new([b, bh / b, len, d]));
    write_swapped(&x, dst, [0, t0], [bh / b, len]);
}

/// A new `[A, Y, X, d]` of `shape` holding `src[a, x0 + x, y]` at `[a, y, x]` for the window
/// `x < x_len`, `y < y_len` (`[x0, y0]`, `[x_len, y_len]`).
fn swap_middle_axes<R: CubeRuntime>(
    src: &CubeTensor<R>,
    shape: Shape,
    origin: [usize; 2],
    lens: [usize; 2],
) -> CubeTensor<R> {
    let out = empty_device_contiguous_dtype::<R>(src.client.clone(), src.device.clone(), shape, src.dtype);
    write_swapped(src, &out, origin, lens);
    out
}

/// `dst[a, y0 + y, x] = src[a, x0 + x, y]` for `x < x_len`, `y < y_len` (rows of `d`, `dst`
/// contiguous), whole rows of `d` per kernel unit: Burn's permuted copy indexes every element
/// through all four strides.
fn write_swapped<R: CubeRuntime>(
    src: &CubeTensor<R>,
    dst: &CubeTensor<R>,
    [x0, y0]: [usize; 2],
    [x_len, y_len]: [usize; 2],
) {
    let src = into_contiguous(src.clone());
    let [a, _, _, d] = src.meta.shape().dims::<4>();
    let client = src.client.clone();
    let vector = client.io_optimized_vector_sizes(src.dtype.size()).find(|v| d % v == 0).unwrap_or(1);
    let dim = CubeDim::new_1d(256);
    let as_u32 = |x: usize| u32::try_from(x).expect("tensor extents fit in u32");
    compressed_rows::swap_middle_axes::launch::<R>(
        &client,
        calculate_cube_count_elemwise(&client, a * x_len * y_len * d / vector, dim),
        dim,
        vector,
        src.clone().into_tensor_arg(),
        dst.clone().into_tensor_arg(),
        as_u32(x0),
        as_u32(y0),
        as_u32(x_len),
        as_u32(y_len),
        vector,
        src.dtype.into(),
    );
}

/// The first `width` rows of each matrix of `x [A, W, d]`.
fn leading_rows<R: CubeRuntime>(x: &CubeTensor<R>, width: usize) -> CubeTensor<R> {
    let [a, w, d] = x.meta.shape().dims::<3>();
    match width == w {
        true => x.clone(),
        false => into_contiguous(burn_cubecl::kernel::slice(x.clone(), &[0..a, 0..width, 0..d])),
    }
}

/// `acc [A, W, d] += part [A, w, d]` on the first `w` rows of each matrix (f32).
fn add_leading_rows<R: CubeRuntime>(acc: CubeTensor<R>, part: CubeTensor<R>) -> CubeTensor<R> {
    let client = acc.client.clone();
    let dim = CubeDim::new_1d(256);
    compressed_rows::add_leading_rows::launch::<R>(
        &client,
        calculate_cube_count_elemwise(&client, part.meta.shape().num_elements(), dim),
        dim,
        acc.clone().into_tensor_arg(),
        part.into_tensor_arg(),
    );
    acc
}

/// A chunk's first query as the row kernels take it.
fn chunk_start(t0: usize) -> u32 {
    u32::try_from(t0).expect("sequence length fits in u32")
}
