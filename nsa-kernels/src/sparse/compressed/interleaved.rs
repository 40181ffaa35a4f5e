//! The compressed branch as a causal attention over the compressed keys.
//!
//! Query `t >= l - 1` sees blocks `0..=c`, `c = (t + 1 - l) / stride`: the `stride` queries of
//! a group share one key range, and group `c` sees one block more than group `c - 1`. Laying
//! offset `r` of every group out as its own batch row (`[B * stride, N, H_q, d]`, position `c`;
//! [`crate::kernel::compression::interleave`]), with each batch row's keys repeated, gives
//! position `c` the keys `0..=c` of its row: a causal attention with `N` positions, which the
//! window kernels run with a window of `N` under the plan table's choice (tensor cores on CUDA
//! at 16-bit storage, the portable kernels elsewhere). Nothing of size `T x N` exists, forward
//! or backward; the moves cost a few copies of `q`-sized tensors, and the keys' gradients are
//! the sums of their `stride` copies'.

use burn::tensor::backend::Backend;
use burn::tensor::{Int, Shape, Tensor};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::ops::reshape;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{element::BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use cubecl::{calculate_cube_count_elemwise, CubeDim};

use crate::kernel::compression::interleave as moves;
use crate::kernel::primitives::rows::NEG_LARGE;
use crate::sparse::keys::TokenKeys;
use crate::sparse::launch::{backward_with, capabilities, forward_with, problem};
use crate::sparse::plan::{BackwardPlan, ForwardPlan};

/// The geometry of one call: batch `b`, length `t`, `n` compressed blocks of `length` tokens
/// every `stride`.
#[derive(Clone, Copy, Debug)]
pub struct Interleaved {
    b: usize,
    t: usize,
    n: usize,
    length: usize,
    stride: usize,
}

impl Interleaved {
    /// The layout of `q [B, T, H_q, d_k]` against `k [B, N, H_kv, d_k]`, or `None` when the
    /// branch is not a causal attention over `k`: `T < length` (no row sees a block) or `N`
    /// is not the `(T - length) / stride + 1` blocks the sequence gives.
    pub fn new<R: CubeRuntime>(q: &CubeTensor<R>, k: &CubeTensor<R>, length: usize, stride: usize) -> Option<Self> {
        let [b, t, _, _] = q.meta.shape().dims::<4>();
        let n = k.meta.shape()[1];
        let fits = length > 0 && stride > 0 && t >= length && n == (t - length) / stride + 1;
        fits.then_some(Interleaved { b, t, n, length, stride })
    }

    /// Output `[B, T, H_q, d_v]` and log-sum-exp `[B, T, H_q]`: zero rows and `NEG_LARGE`
    /// before the first block (of each row's document, with document `starts` `[B, T]`).
    pub fn forward<F: FloatElement, I: IntElement, BT: BoolElement, R: CubeRuntime>(
        &self,
        q: CubeTensor<R>,
        k: CubeTensor<R>,
        v: CubeTensor<R>,
        starts: Option<&CubeTensor<R>>,
    ) -> (CubeTensor<R>, CubeTensor<R>) {
        let first = starts.map(|starts| self.first_blocks::<CubeBackend<R, F, I, BT>, R>(starts));
        let keys: TokenKeys<'_, CubeBackend<R, F, I, BT>> = TokenKeys::Window { w: self.n, documents: first.as_ref() };
        let (q, k, v) = (self.interleave(&q, 0.0), self.repeat(&k), self.repeat(&v));
        let plan = ForwardPlan::choose(&problem(&q, &k, &v, keys), &capabilities(&q.client));
        let (out, lse) = forward_with(q, k, v, keys, &plan);
        (self.deinterleave(&out, 0.0), self.deinterleave_rows(&lse, NEG_LARGE))
    }

    /// Gradients of `q`, `k`, `v` from the forward's output and log-sum-exp. The last group's
    /// tail (positions past `T`) is zero queries with a zero output gradient, so it adds
    /// nothing to the keys' gradients.
    #[allow(clippy::too_many_arguments)]
    pub fn backward<F: FloatElement, I: IntElement, BT: BoolElement, R: CubeRuntime>(
        &self,
        q: CubeTensor<R>,
        k: CubeTensor<R>,
        v: CubeTensor<R>,
        out: CubeTensor<R>,
        lse: CubeTensor<R>,
        grad_out: CubeTensor<R>,
        starts: Option<&CubeTensor<R>>,
    ) -> [CubeTensor<R>; 3] {
        let first = starts.map(|starts| self.first_blocks::<CubeBackend<R, F, I, BT>, R>(starts));
        let keys: TokenKeys<'_, CubeBackend<R, F, I, BT>> = TokenKeys::Window { w: self.n, documents: first.as_ref() };
        let (q, out, grad_out) =
            (self.interleave(&q, 0.0), self.interleave(&out, 0.0), self.interleave(&grad_out, 0.0));
        let lse = self.interleave_rows(&lse, 0.0);
        let (k, v) = (self.repeat(&k), self.repeat(&v));
        let plan = BackwardPlan::choose(&problem(&q, &k, &v, keys), &capabilities(&q.client));
        let grads = backward_with(q, k, v, out, lse, grad_out, keys, &plan);
        [self.deinterleave(&grads.q, 0.0), self.sum_copies(&grads.k), self.sum_copies(&grads.v)]
    }

    /// Each interleaved row's first key, `[B * stride, N]`: the first compressed block of its
    /// query's document, `ceil(start / stride)` of document `starts` `[B, T]` (what the window
    /// kernels take as a row's document start). The tail past `T` repeats the last query's.
    fn first_blocks<B: Backend<IntTensorPrimitive = CubeTensor<R>>, R: CubeRuntime>(
        &self,
        starts: &CubeTensor<R>,
    ) -> CubeTensor<R> {
        let Interleaved { b, t, n, length, stride } = *self;
        let queries = Tensor::<B, 2, Int>::from_primitive(starts.clone()).slice([0..b, length - 1..t]);
        let len = t - (length - 1);
        let padded = match n * stride - len {
            0 => queries,
            tail => {
                let last = queries.clone().slice([0..b, len - 1..len]).repeat_dim(1, tail);
                Tensor::cat(vec![queries, last], 1)
            }
        };
        let rows = padded.reshape([b, n, stride]).swap_dims(1, 2).reshape([b * stride, n]);
        rows.add_scalar(stride as i64 - 1).div_scalar(stride as i64).into_primitive()
    }

    /// `x [B, T, H, d]` -> `[B * stride, N, H, d]`.
    fn interleave<R: CubeRuntime>(&self, x: &CubeTensor<R>, fill: f32) -> CubeTensor<R> {
        let [_, _, h, d] = x.meta.shape().dims::<4>();
        let out = empty_like(x, Shape::new([self.b * self.stride, self.n, h, d]));
        self.launch_move(RowMove::Interleave, x, &out, fill);
        out
    }

    /// `x [B * stride, N, H, d]` -> `[B, T, H, d]`.
    fn deinterleave<R: CubeRuntime>(&self, x: &CubeTensor<R>, fill: f32) -> CubeTensor<R> {
        let [_, _, h, d] = x.meta.shape().dims::<4>();
        let out = empty_like(x, Shape::new([self.b, self.t, h, d]));
        self.launch_move(RowMove::Deinterleave, x, &out, fill);
        out
    }

    /// [`Self::interleave`] of a row statistic `[B, T, H]`.
    fn interleave_rows<R: CubeRuntime>(&self, x: &CubeTensor<R>, fill: f32) -> CubeTensor<R> {
        let [b, t, h] = x.meta.shape().dims::<3>();
        let out = self.interleave(&reshape(into_contiguous(x.clone()), Shape::new([b, t, h, 1])), fill);
        reshape(out, Shape::new([self.b * self.stride, self.n, h]))
    }

    /// [`Self::deinterleave`] of a row statistic `[B * stride, N, H]`.
    fn deinterleave_rows<R: CubeRuntime>(&self, x: &CubeTensor<R>, fill: f32) -> CubeTensor<R> {
        let [bs, n, h] = x.meta.shape().dims::<3>();
        let out = self.deinterleave(&reshape(into_contiguous(x.clone()), Shape::new([bs, n, h, 1])), fill);
        reshape(out, Shape::new([self.b, self.t, h]))
    }

    /// Launches [`RowMove::Interleave`] or [`RowMove::Deinterleave`] from `src` into `dst` (contiguous).
    fn launch_move<R: CubeRuntime>(&self, kind: RowMove, src: &CubeTensor<R>, dst: &CubeTensor<R>, fill: f32) {
        let src = into_contiguous(src.clone());
        let (client, vector) = (src.client.clone(), vector_size(&src));
        let dim = CubeDim::new_1d(256);
        let count = calculate_cube_count_elemwise(&client, dst.meta.shape().num_elements() / vector, dim);
        let (first, stride) = (as_u32(self.length - 1), as_u32(self.stride));
        let (input, output, dtype) = (src.clone().into_tensor_arg(), dst.clone().into_tensor_arg(), src.dtype.into());
        match kind {
            RowMove::Interleave => moves::interleave_rows::launch::<R>(
                &client, count, dim, vector, input, output, first, stride, fill, vector, dtype,
            ),
            RowMove::Deinterleave => moves::deinterleave_rows::launch::<R>(
                &client, count, dim, vector, input, output, first, stride, fill, vector, dtype,
            ),
        }
    }

    /// `x [B, N, H_kv, d]` -> `[B * stride, N, H_kv, d]`: each batch row's keys for each of its
    /// offsets.
    fn repeat<R: CubeRuntime>(&self, x: &CubeTensor<R>) -> CubeTensor<R> {
        let x = into_contiguous(x.clone());
        if self.stride == 1 {
            return x;
        }
        let [_, n, h, d] = x.meta.shape().dims::<4>();
        let out = empty_like(&x, Shape::new([self.b * self.stride, n, h, d]));
        self.launch_batch_rows(BatchMove::Repeat, &x, &out);
        out
    }

    /// [`Self::repeat`]'s gradient: the copies of each key's gradient added.
    fn sum_copies<R: CubeRuntime>(&self, x: &CubeTensor<R>) -> CubeTensor<R> {
        let x = into_contiguous(x.clone());
        if self.stride == 1 {
            return x;
        }
        let [_, n, h, d] = x.meta.shape().dims::<4>();
        let out = empty_like(&x, Shape::new([self.b, n, h, d]));
        self.launch_batch_rows(BatchMove::Sum, &x, &out);
        out
    }

    /// Launches [`BatchMove::Repeat`] or [`BatchMove::Sum`] from `src` (contiguous) into `dst`.
    fn launch_batch_rows<R: CubeRuntime>(&self, kind: BatchMove, src: &CubeTensor<R>, dst: &CubeTensor<R>) {
        let (client, vector) = (src.client.clone(), vector_size(src));
        let dim = CubeDim::new_1d(256);
        let count = calculate_cube_count_elemwise(&client, dst.meta.shape().num_elements() / vector, dim);
        let copies = as_u32(self.stride);
        let (input, output, dtype) = (src.clone().into_tensor_arg(), dst.clone().into_tensor_arg(), src.dtype.into());
        match kind {
            BatchMove::Repeat => {
                moves::repeat_batch_rows::launch::<R>(&client, count, dim, vector, input, output, copies, vector, dtype)
            }
            BatchMove::Sum => {
                moves::sum_batch_rows::launch::<R>(&client, count, dim, vector, input, output, copies, vector, dtype)
            }
        }
    }
}

/// The moves between the layer's rows and the interleaved ones.
#[derive(Clone, Copy)]
enum RowMove {
    Interleave,
    Deinterleave,
}

/// The moves between the keys and their copies per offset.
#[derive(Clone, Copy)]
enum BatchMove {
    Repeat,
    Sum,
}

/// The widest vector the device moves in one access that divides the rows of `x`.
fn vector_size<R: CubeRuntime>(x: &CubeTensor<R>) -> usize {
    let d = x.meta.shape()[x.meta.shape().num_dims() - 1];
    x.client.io_optimized_vector_sizes(x.dtype.size()).find(|v| d.is_multiple_of(*v)).unwrap_or(1)
}

fn empty_like<R: CubeRuntime>(x: &CubeTensor<R>, shape: Shape) -> CubeTensor<R> {
    empty_device_contiguous_dtype::<R>(x.client.clone(), x.device.clone(), shape, x.dtype)
}

fn as_u32(x: usize) -> u32 {
    u32::try_from(x).expect("sequence geometry fits in u32")
}
