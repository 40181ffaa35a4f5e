//! Launches the compressed branch's kernels ([`crate::kernel::compressed`]) on `CubeBackend`:
//! the problem (shapes, block geometry), the plan (cube sizes, chunks, splits) and the launch.

use burn::tensor::{DType, Shape};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::prelude::*;
use cubecl::{calculate_cube_count_elemwise, CubeDim};

use crate::kernel::{compressed, compressed_key};

/// Query rows per query-side cube, at most (a whole number of positions' `g` heads).
const ROWS_PER_CUBE: usize = 128;
/// Keys per key-side cube (one plane per query head of the group), and its units at most.
const KEYS_PER_CUBE: usize = 32;
const MAX_UNITS: usize = 1024;
/// Query positions per split of the key side: enough work per cube, and at most
/// [`MAX_SPLITS`] partial sums per key.
const SPLIT_POSITIONS: usize = 256;
const MAX_SPLITS: usize = 8;
/// f32 words of K and V staged per chunk: 16 KiB, within every device's shared memory.
const STAGED_WORDS: usize = 4096;
/// f32 words of staged query rows (q and dO) on the key side: 12 KiB beside its 16 KiB of keys.
const STAGED_ROW_WORDS: usize = 3072;

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
    d_k: usize,
    d_v: usize,
}

impl<R: CubeRuntime> Problem<R> {
    pub fn new(q: CubeTensor<R>, k: CubeTensor<R>, v: CubeTensor<R>, length: usize, stride: usize) -> Self {
        let (qs, ks, vs) = (q.meta.shape().clone(), k.meta.shape().clone(), v.meta.shape().clone());
        assert!(qs.num_dims() == 4 && ks.num_dims() == 4 && vs.num_dims() == 4, "attention takes [B, T, H, d] tensors");
        assert!(qs[0] == ks[0] && ks[..3] == vs[..3], "q, k, v disagree on batch or heads");
        assert!(qs[3] == ks[3] && ks[2] > 0 && qs[2] % ks[2] == 0, "q and k head dims or head counts disagree");
        assert!(length > 0 && stride > 0, "compressed blocks need a length and a stride");
        let (d_k, d_v, g) = (qs[3], vs[3], qs[2] / ks[2]);
        Problem {
            q: into_contiguous(q),
            k: into_contiguous(k),
            v: into_contiguous(v),
            length: u32::try_from(length).expect("block length fits in u32"),
            stride: u32::try_from(stride).expect("block stride fits in u32"),
            scale: 1.0 / (d_k as f32).sqrt(),
            g,
            d_k,
            d_v,
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

    /// Query-side plan: positions per cube and keys per staged chunk.
    fn query_plan(&self) -> (usize, usize, CubeCount, CubeDim) {
        let [b, t, _] = self.dims();
        let h_kv = self.k.meta.shape()[2];
        let queries = (ROWS_PER_CUBE / self.g).max(1);
        let chunk = (STAGED_WORDS / (self.d_k + self.d_v)).max(1);
        let cubes = b * h_kv * t.div_ceil(queries);
        let dim = CubeDim::new_1d((queries * self.g) as u32);
        (queries, chunk, CubeCount::new_1d(cubes as u32), dim)
    }

    /// Output `[B, T, H_q, d_v]` and log-sum-exp `[B, T, H_q]` (f32).
    pub fn forward(&self) -> (CubeTensor<R>, CubeTensor<R>) {
        let [b, t, h_q] = self.dims();
        let out = self.empty(Shape::new([b, t, h_q, self.d_v]), self.q.dtype);
        let lse = self.empty(Shape::new([b, t, h_q]), DType::F32);
        let (queries, chunk, count, dim) = self.query_plan();
        compressed::compressed_forward::launch::<R>(
            &self.client(),
            count,
            dim,
            self.q.clone().into_tensor_arg(),
            self.k.clone().into_tensor_arg(),
            self.v.clone().into_tensor_arg(),
            out.clone().into_tensor_arg(),
            lse.clone().into_tensor_arg(),
            self.scale,
            self.length,
            self.stride,
            self.g,
            queries,
            self.d_k,
            self.d_v,
            chunk,
            self.q.dtype.into(),
        );
        (out, lse)
    }

    /// Gradients of `q`, `k`, `v` from the forward's output and log-sum-exp.
    pub fn backward(&self, out: CubeTensor<R>, lse: CubeTensor<R>, grad_out: CubeTensor<R>) -> [CubeTensor<R>; 3] {
        let [b, t, h_q] = self.dims();
        let (out, lse, grad_out) = (into_contiguous(out), into_contiguous(lse), into_contiguous(grad_out));
        let dtype = self.q.dtype;
        let grad_q = self.empty(self.q.meta.shape().clone(), dtype);
        let delta = self.empty(Shape::new([b, t, h_q]), DType::F32);
        let (queries, chunk, count, dim) = self.query_plan();
        compressed::compressed_backward_query::launch::<R>(
            &self.client(),
            count,
            dim,
            self.q.clone().into_tensor_arg(),
            self.k.clone().into_tensor_arg(),
            self.v.clone().into_tensor_arg(),
            out.into_tensor_arg(),
            lse.clone().into_tensor_arg(),
            grad_out.clone().into_tensor_arg(),
            grad_q.clone().into_tensor_arg(),
            delta.clone().into_tensor_arg(),
            self.scale,
            self.length,
            self.stride,
            self.g,
            queries,
            self.d_k,
            self.d_v,
            chunk,
            dtype.into(),
        );

        let [_, n, h_kv, _] = self.k.meta.shape().dims::<4>();
        let splits = t.div_ceil(SPLIT_POSITIONS).clamp(1, MAX_SPLITS);
        let span = u32::try_from(t.div_ceil(splits)).expect("sequence fits in u32");
        let width = self.d_k + self.d_v;
        let partial = self.empty(Shape::new([splits, b, n, h_kv, width]), DType::F32);
        // Staged query rows: as many positions' `g` heads as fit the f32 budget.
        let positions = (STAGED_ROW_WORDS / (self.g * width)).max(1);
        let keys = (MAX_UNITS / self.g).clamp(1, KEYS_PER_CUBE);
        let cubes = splits * b * h_kv * n.div_ceil(keys);
        let vector = compressed_key::key_vector(self.d_k, self.d_v);
        compressed_key::compressed_backward_key::launch::<R>(
            &self.client(),
            CubeCount::new_1d(cubes as u32),
            CubeDim::new_1d((keys * self.g) as u32),
            vector,
            self.q.clone().into_tensor_arg(),
            self.k.clone().into_tensor_arg(),
            self.v.clone().into_tensor_arg(),
            grad_out.into_tensor_arg(),
            lse.into_tensor_arg(),
            delta.into_tensor_arg(),
            partial.clone().into_tensor_arg(),
            self.scale,
            self.length,
            self.stride,
            span,
            self.g,
            keys,
            positions,
            self.d_k,
            self.d_v,
            vector,
            dtype.into(),
        );

        let grad_k = self.empty(self.k.meta.shape().clone(), dtype);
        let grad_v = self.empty(self.v.meta.shape().clone(), dtype);
        let elements = b * n * h_kv * width;
        let dim = CubeDim::new_1d(256);
        compressed_key::sum_splits::launch::<R>(
            &self.client(),
            calculate_cube_count_elemwise(&self.client(), elements, dim),
            dim,
            partial.into_tensor_arg(),
            grad_k.clone().into_tensor_arg(),
            grad_v.clone().into_tensor_arg(),
            self.d_k,
            self.d_v,
            dtype.into(),
        );
        [grad_q, grad_k, grad_v]
    }

    /// Selection scores `[B, H_kv, T, ceil(T / block_size)]` (f32) from the forward's
    /// log-sum-exp: per head on the query side's walk, then summed over each group.
    pub fn block_scores(&self, lse: CubeTensor<R>, block_size: usize) -> CubeTensor<R> {
        let [b, t, h_q] = self.dims();
        let h_kv = self.k.meta.shape()[2];
        let n_sel = t.div_ceil(block_size);
        let head_scores = self.empty(Shape::new([b, t, h_q, n_sel]), DType::F32);
        let (queries, chunk, count, dim) = self.query_plan();
        compressed::compressed_head_scores::launch::<R>(
            &self.client(),
            count,
            dim,
            self.q.clone().into_tensor_arg(),
            self.k.clone().into_tensor_arg(),
            into_contiguous(lse).into_tensor_arg(),
            head_scores.clone().into_tensor_arg(),
            self.scale,
            self.length,
            self.stride,
            u32::try_from(block_size).expect("block size fits in u32"),
            self.g,
            queries,
            self.d_k,
            chunk,
            self.q.dtype.into(),
        );
        let scores = self.empty(Shape::new([b, h_kv, t, n_sel]), DType::F32);
        let dim = CubeDim::new_1d(256);
        compressed::sum_group::launch::<R>(
            &self.client(),
            calculate_cube_count_elemwise(&self.client(), scores.meta.shape().num_elements(), dim),
            dim,
            head_scores.into_tensor_arg(),
            scores.clone().into_tensor_arg(),
            self.g,
        );
        scores
    }
}
