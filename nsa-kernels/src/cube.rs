//! [`SparseAttentionBackend`] for `CubeBackend` (CUDA, WGPU): launches the CubeCL kernels.
//!
//! # Unchecked launches
//!
//! The register-resident kernels (`flash_*`, CUDA only) launch without CubeCL's bounds checks
//! on global reads and writes: each bounds every global access itself (rows past the tensor are
//! clamped to the last row or masked, stores test their row), and compute-sanitizer's memcheck
//! runs clean over them unchecked (`bench/gpu/memcheck.sh`, docs/benchmarks.md). The selection
//! partials stay checked at wide heads (see [`Call::selection_forward_key_major`]).

use burn::tensor::{DType, Shape};
use burn_cubecl::kernel::{cast, into_contiguous};
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{element::BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use cubecl::features::{AtomicUsage, MmaConfig};
use cubecl::ir::{FloatKind, StorageType, Type};
use cubecl::prelude::*;
use cubecl::{calculate_cube_count_elemwise, CubeDim};

use crate::api::{BlockIndex, Keys, SparseAttentionBackend, SparseAttentionGrads};
use crate::compressed;
use crate::inverted::{InvertedIndex, SEGMENT_QUERIES, UNITS_PER_CUBE};
use crate::kernel::{
    backward, flash_dq, flash_forward, flash_key, flash_select, forward, mma_backward, mma_dq, mma_forward, mma_select,
};
use crate::tiling::{
    delta_rows, FlashKeyTiling, FlashSelectTiling, FlashTiling, KeyMmaTiling, KeyTiling, MmaTiling, QueryPass,
    QueryTiling, SelectMmaTiling, MMA_SHARED,
};

/// Shared memory per cube at most, so that several cubes share a streaming multiprocessor.
const SHARED_BYTES_CAP: usize = 48 * 1024;

impl<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement> SparseAttentionBackend
    for CubeBackend<R, F, I, BT>
{
    fn has_fused_sparse_attention() -> bool {
        true
    }

    fn block_index(blocks: &CubeTensor<R>, block_size: usize) -> Option<BlockIndex<Self>> {
        let index = InvertedIndex::build(&into_contiguous(blocks.clone()), block_size);
        Some(BlockIndex { tensors: index.into_tensors() })
    }

    fn block_index_shapes(blocks: &Shape, block_size: usize) -> Option<Vec<Shape>> {
        Some(InvertedIndex::<R>::shapes(blocks, block_size))
    }

    fn select_blocks(scores: CubeTensor<R>, block_size: usize, n: usize) -> Option<(CubeTensor<R>, CubeTensor<R>)> {
        Some(crate::top_n::select_blocks(scores, block_size, n, I::dtype()))
    }

    fn block_scores(
        q: CubeTensor<R>,
        k: CubeTensor<R>,
        lse: CubeTensor<R>,
        length: usize,
        stride: usize,
        block_size: usize,
    ) -> CubeTensor<R> {
        // The values are not read: the problem only carries the shapes and geometry.
        let v = k.clone();
        compressed::Problem::new(q, k, v, length, stride).block_scores(lse, block_size)
    }

    fn sparse_attention(
        q: CubeTensor<R>,
        k: CubeTensor<R>,
        v: CubeTensor<R>,
        keys: &Keys<Self>,
    ) -> (CubeTensor<R>, CubeTensor<R>) {
        if let Keys::Compressed { length, stride } = keys {
            return compressed::Problem::new(q, k, v, *length, *stride).forward();
        }
        let call = Call::new(q, k, v, keys, I::dtype());
        let [b, t, h_q, _] = call.q.meta.shape().dims::<4>();
        let h_kv = call.k.meta.shape()[2];
        let out = call.empty(Shape::new([b, t, h_q, call.d_v]), call.q.dtype);
        let lse = call.empty(Shape::new([b, t, h_q]), DType::F32);
        if let Some(tiling) = call.flash_select_tiling() {
            call.selection_forward_key_major(&tiling, &out, &lse);
            return (out, lse);
        }
        if let Some(tiling) = call.select_mma_tiling() {
            let (count, dim) = call.select_grid(&tiling);
            mma_select::selection_forward_mma::launch::<R>(
                &call.client(),
                count,
                dim,
                mma_forward::VECTOR,
                call.q.clone().into_tensor_arg(),
                call.k.clone().into_tensor_arg(),
                call.v.clone().into_tensor_arg(),
                call.blocks.clone().into_tensor_arg(),
                out.clone().into_tensor_arg(),
                lse.clone().into_tensor_arg(),
                call.scale,
                call.span,
                call.d_k,
                call.d_v,
                tiling.planes,
                tiling.key_tile,
                tiling.pv_cols,
                [call.q.dtype.into(), call.blocks.dtype.into()],
            );
            return (out, lse);
        }
        if let Some(tiling) = call.flash_tiling(QueryPass::Forward) {
            let cubes = b * h_kv * t.div_ceil(tiling.queries(call.group()));
            let (count, dim) = call.plane_grid(cubes, tiling.planes());
            // SAFETY: see "Unchecked launches" in this module's documentation.
            unsafe {
                flash_forward::window_forward_flash::launch_unchecked::<R>(
                    &call.client(),
                    count,
                    dim,
                    mma_forward::VECTOR,
                    call.q.clone().into_tensor_arg(),
                    call.k.clone().into_tensor_arg(),
                    call.v.clone().into_tensor_arg(),
                    out.clone().into_tensor_arg(),
                    lse.clone().into_tensor_arg(),
                    call.scale,
                    call.span,
                    call.d_k,
                    call.d_v,
                    tiling.rows,
                    tiling.planes(),
                    tiling.key_tile,
                    call.q.dtype.into(),
                );
            }
            return (out, lse);
        }
        if let Some(tiling) = call.mma_tiling(QueryPass::Forward) {
            let (count, dim) = call.mma_grid(&tiling);
            mma_forward::attention_forward_mma::launch::<R>(
                &call.client(),
                count,
                dim,
                mma_forward::VECTOR,
                call.q.clone().into_tensor_arg(),
                call.k.clone().into_tensor_arg(),
                call.v.clone().into_tensor_arg(),
                call.blocks.clone().into_tensor_arg(),
                out.clone().into_tensor_arg(),
                lse.clone().into_tensor_arg(),
                call.scale,
                call.span,
                call.window,
                call.d_k,
                call.d_v,
                tiling.rows,
                tiling.planes(),
                tiling.key_tile,
                tiling.pv_cols,
                [call.q.dtype.into(), call.blocks.dtype.into()],
            );
            return (out, lse);
        }
        let tiling = call.query_tiling(QueryPass::Forward);
        let (count, dim) = call.query_grid(&tiling);
        forward::attention_forward::launch::<R>(
            &call.client(),
            count,
            dim,
            call.q.clone().into_tensor_arg(),
            call.k.clone().into_tensor_arg(),
            call.v.clone().into_tensor_arg(),
            call.blocks.clone().into_tensor_arg(),
            out.clone().into_tensor_arg(),
            lse.clone().into_tensor_arg(),
            call.scale,
            call.span,
            call.window,
            call.d_k,
            call.d_v,
            tiling.parts,
            tiling.rows,
            tiling.chunk,
            [call.q.dtype.into(), call.blocks.dtype.into()],
        );
        (out, lse)
    }

    fn sparse_attention_backward(
        q: CubeTensor<R>,
        k: CubeTensor<R>,
        v: CubeTensor<R>,
        out: CubeTensor<R>,
        lse: CubeTensor<R>,
        grad_out: CubeTensor<R>,
        keys: &Keys<Self>,
    ) -> SparseAttentionGrads<Self> {
        if let Keys::Compressed { length, stride } = keys {
            let [q, k, v] = compressed::Problem::new(q, k, v, *length, *stride).backward(lse, grad_out);
            return SparseAttentionGrads { q, k, v };
        }
        let call = Call::new(q, k, v, keys, I::dtype());
        let (out, grad_out, lse) = (into_contiguous(out), into_contiguous(grad_out), into_contiguous(lse));
        let dtype = call.q.dtype;
        let [b, t, h_q, _] = call.q.meta.shape().dims::<4>();
        let h_kv = call.k.meta.shape()[2];
        let delta = call.empty(Shape::new([b, t, h_q]), DType::F32);
        let index = call.inverted_index();
        let flash_keys = call.flash_key_tiling();
        // The register-resident key kernel folds dQ in at narrow heads (window or selection);
        // otherwise a selection's dQ is key-major, added by atomics.
        let folds_flash_dq = flash_keys.is_some_and(|tiling| tiling.fold_dq);
        let select_dq =
            if call.window || flash_keys.is_none() || folds_flash_dq { None } else { call.flash_select_tiling() };
        let key_tiling = if flash_keys.is_some() { None } else { call.key_mma_tiling() };
        // Key cubes that fold dQ, and the key-major dQ, add it to an f32 buffer by atomics
        // (zeroed by `row_delta`, which runs first in each of those branches); otherwise a
        // query-side kernel writes dQ (and `delta`) first.
        let fold_dq = key_tiling.is_some_and(|tiling| tiling.fold_dq);
        let sums_dq = fold_dq || folds_flash_dq || select_dq.is_some();
        let (grad_q, grad_q_sum) = if sums_dq {
            (None, call.empty(call.q.meta.shape().clone(), DType::F32))
        } else {
            (Some(call.empty(call.q.meta.shape().clone(), dtype)), call.empty(Shape::new([1, 1, 1, 1]), DType::F32))
        };
        if fold_dq || folds_flash_dq {
            call.row_delta(&out, &grad_out, &delta, &grad_q_sum, sums_dq);
        } else if let Some(tiling) = select_dq {
            call.row_delta(&out, &grad_out, &delta, &grad_q_sum, sums_dq);
            let (count, dim) = call.plane_grid(call.key_cubes(tiling.keys, &index), tiling.dq_planes);
            let atomic_width = call.f32_atomic_width();
            // SAFETY: see "Unchecked launches" in this module's documentation.
            unsafe {
                flash_select::selection_dq_flash::launch_unchecked::<R>(
                    &call.client(),
                    count,
                    dim,
                    mma_forward::VECTOR,
                    atomic_width,
                    call.q.clone().into_tensor_arg(),
                    call.k.clone().into_tensor_arg(),
                    call.v.clone().into_tensor_arg(),
                    grad_out.clone().into_tensor_arg(),
                    lse.clone().into_tensor_arg(),
                    delta.clone().into_tensor_arg(),
                    index.offsets.clone().into_tensor_arg(),
                    index.counts.clone().into_tensor_arg(),
                    index.entries.clone().into_tensor_arg(),
                    index.segment_base.clone().into_tensor_arg(),
                    index.segment_block.clone().into_tensor_arg(),
                    index.segment_total.clone().into_tensor_arg(),
                    grad_q_sum.clone().into_tensor_arg(),
                    call.scale,
                    SEGMENT_QUERIES as u32,
                    call.d_k,
                    call.d_v,
                    tiling.keys,
                    tiling.dq_planes,
                    atomic_width,
                    call.group(),
                    dtype.into(),
                );
            }
        } else if let Some(tiling) = call.flash_tiling(QueryPass::Gradient) {
            call.row_delta(&out, &grad_out, &delta, &grad_q_sum, sums_dq);
            let cubes = b * h_kv * t.div_ceil(tiling.queries(call.group()));
            let (count, dim) = call.plane_grid(cubes, tiling.planes());
            // SAFETY: see "Unchecked launches" in this module's documentation.
            unsafe {
                flash_dq::window_dq_flash::launch_unchecked::<R>(
                    &call.client(),
                    count,
                    dim,
                    mma_forward::VECTOR,
                    call.q.clone().into_tensor_arg(),
                    call.k.clone().into_tensor_arg(),
                    call.v.clone().into_tensor_arg(),
                    grad_out.clone().into_tensor_arg(),
                    lse.clone().into_tensor_arg(),
                    delta.clone().into_tensor_arg(),
                    grad_q.clone().expect("a query-side dQ").into_tensor_arg(),
                    call.scale,
                    call.span,
                    call.d_k,
                    call.d_v,
                    tiling.rows,
                    tiling.planes(),
                    tiling.key_tile,
                    dtype.into(),
                );
            }
        } else if let Some(tiling) = call.mma_tiling(QueryPass::Gradient) {
            let (count, dim) = call.mma_grid(&tiling);
            mma_dq::attention_backward_query_mma::launch::<R>(
                &call.client(),
                count,
                dim,
                mma_forward::VECTOR,
                call.q.clone().into_tensor_arg(),
                call.k.clone().into_tensor_arg(),
                call.v.clone().into_tensor_arg(),
                call.blocks.clone().into_tensor_arg(),
                out.into_tensor_arg(),
                grad_out.clone().into_tensor_arg(),
                lse.clone().into_tensor_arg(),
                delta.clone().into_tensor_arg(),
                grad_q.clone().expect("a query-side dQ").into_tensor_arg(),
                call.scale,
                call.span,
                call.window,
                call.d_k,
                call.d_v,
                tiling.rows,
                tiling.planes(),
                tiling.key_tile,
                [dtype.into(), call.blocks.dtype.into()],
            );
        } else {
            let tiling = call.query_tiling(QueryPass::Gradient);
            let (count, dim) = call.query_grid(&tiling);
            backward::attention_backward_query::launch::<R>(
                &call.client(),
                count,
                dim,
                call.q.clone().into_tensor_arg(),
                call.k.clone().into_tensor_arg(),
                call.v.clone().into_tensor_arg(),
                call.blocks.clone().into_tensor_arg(),
                out.into_tensor_arg(),
                grad_out.clone().into_tensor_arg(),
                lse.clone().into_tensor_arg(),
                delta.clone().into_tensor_arg(),
                grad_q.clone().expect("a query-side dQ").into_tensor_arg(),
                call.scale,
                call.span,
                call.window,
                call.d_k,
                call.d_v,
                tiling.parts,
                tiling.rows,
                tiling.chunk,
                [dtype.into(), call.blocks.dtype.into()],
            );
        }

        let grad_k = call.empty(call.k.meta.shape().clone(), dtype);
        let grad_v = call.empty(call.v.meta.shape().clone(), dtype);
        // A selection's key cubes leave per-segment shares here; a window writes dk/dv itself.
        let partial = if call.window {
            call.empty(Shape::new([1, 1, 1, 1, 1]), DType::F32)
        } else {
            let segments = index.segment_block.meta.shape()[2];
            // `[B * H_kv, segments, span * (d_k + d_v)]`: each segment's dK and dV shares.
            call.empty(Shape::new([b * h_kv, segments, call.span as usize * (call.d_k + call.d_v)]), DType::F32)
        };
        if let Some(tiling) = flash_keys {
            let (count, dim) = call.plane_grid(call.key_cubes(tiling.keys(), &index), tiling.planes);
            let atomic_width = if tiling.fold_dq { call.f32_atomic_width() } else { 1 };
            // SAFETY: see "Unchecked launches" in this module's documentation.
            unsafe {
                flash_key::attention_key_flash::launch_unchecked::<R>(
                    &call.client(),
                    count,
                    dim,
                    mma_forward::VECTOR,
                    atomic_width,
                    call.q.clone().into_tensor_arg(),
                    call.k.clone().into_tensor_arg(),
                    call.v.clone().into_tensor_arg(),
                    grad_out.clone().into_tensor_arg(),
                    lse.clone().into_tensor_arg(),
                    delta.clone().into_tensor_arg(),
                    index.offsets.into_tensor_arg(),
                    index.counts.clone().into_tensor_arg(),
                    index.entries.into_tensor_arg(),
                    index.segment_base.clone().into_tensor_arg(),
                    index.segment_block.clone().into_tensor_arg(),
                    index.segment_total.into_tensor_arg(),
                    grad_k.clone().into_tensor_arg(),
                    grad_v.clone().into_tensor_arg(),
                    partial.clone().into_tensor_arg(),
                    grad_q_sum.clone().into_tensor_arg(),
                    call.scale,
                    call.span,
                    SEGMENT_QUERIES as u32,
                    call.window,
                    call.d_k,
                    call.d_v,
                    tiling.planes,
                    tiling.q_rows,
                    tiling.fold_dq,
                    atomic_width,
                    call.group(),
                    dtype.into(),
                );
            }
        } else if let Some(tiling) = key_tiling {
            let (count, dim) = call.plane_grid(call.key_cubes(tiling.keys(), &index), tiling.planes);
            mma_backward::attention_backward_key_mma::launch::<R>(
                &call.client(),
                count,
                dim,
                mma_forward::VECTOR,
                call.q.clone().into_tensor_arg(),
                call.k.clone().into_tensor_arg(),
                call.v.clone().into_tensor_arg(),
                grad_out.into_tensor_arg(),
                lse.into_tensor_arg(),
                delta.into_tensor_arg(),
                index.offsets.into_tensor_arg(),
                index.counts.clone().into_tensor_arg(),
                index.entries.into_tensor_arg(),
                index.segment_base.clone().into_tensor_arg(),
                index.segment_block.clone().into_tensor_arg(),
                index.segment_total.into_tensor_arg(),
                grad_k.clone().into_tensor_arg(),
                grad_v.clone().into_tensor_arg(),
                partial.clone().into_tensor_arg(),
                grad_q_sum.clone().into_tensor_arg(),
                call.scale,
                call.span,
                SEGMENT_QUERIES as u32,
                call.window,
                call.d_k,
                call.d_v,
                tiling.planes,
                tiling.q_rows,
                tiling.fold_dq,
                call.group(),
                dtype.into(),
            );
        } else {
            let tiling = KeyTiling::plan(call.d_k, call.d_v, call.shared_bytes());
            let (count, dim) = call.key_grid(&tiling, &index);
            backward::attention_backward_key::launch::<R>(
                &call.client(),
                count,
                dim,
                call.q.clone().into_tensor_arg(),
                call.k.clone().into_tensor_arg(),
                call.v.clone().into_tensor_arg(),
                grad_out.into_tensor_arg(),
                lse.into_tensor_arg(),
                delta.into_tensor_arg(),
                index.offsets.into_tensor_arg(),
                index.counts.clone().into_tensor_arg(),
                index.entries.into_tensor_arg(),
                index.segment_base.clone().into_tensor_arg(),
                index.segment_block.clone().into_tensor_arg(),
                index.segment_total.into_tensor_arg(),
                grad_k.clone().into_tensor_arg(),
                grad_v.clone().into_tensor_arg(),
                partial.clone().into_tensor_arg(),
                call.scale,
                call.span,
                SEGMENT_QUERIES as u32,
                call.window,
                call.d_k,
                call.d_v,
                tiling.parts,
                tiling.keys,
                tiling.chunk,
                call.group(),
                dtype.into(),
            );
        }
        if !call.window {
            let vector = backward::sum_segments_vector(call.d_k, call.d_v);
            let units = b * t * h_kv * (call.d_k + call.d_v) / vector;
            backward::sum_segments::launch::<R>(
                &call.client(),
                call.cube_count(units),
                call.cube_dim(),
                vector,
                partial.into_tensor_arg(),
                index.counts.into_tensor_arg(),
                index.segment_base.into_tensor_arg(),
                grad_k.clone().into_tensor_arg(),
                grad_v.clone().into_tensor_arg(),
                call.span,
                SEGMENT_QUERIES as u32,
                call.d_k,
                call.d_v,
                vector,
                dtype.into(),
            );
        }
        let grad_q = grad_q.unwrap_or_else(|| cast(grad_q_sum, dtype));
        SparseAttentionGrads { q: grad_q, k: grad_k, v: grad_v }
    }
}

/// One call's inputs made contiguous, with the launch parameters they imply.
struct Call<R: CubeRuntime> {
    q: CubeTensor<R>,
    k: CubeTensor<R>,
    v: CubeTensor<R>,
    /// `[B, T, H_kv, n]`, or a 1-element placeholder for a window.
    blocks: CubeTensor<R>,
    /// The inverted index the key set carries, if any.
    index: Option<InvertedIndex<R>>,
    window: bool,
    span: u32,
    scale: f32,
    d_k: usize,
    d_v: usize,
}

impl<R: CubeRuntime> Call<R> {
    fn new<B: burn::tensor::backend::Backend<IntTensorPrimitive = CubeTensor<R>>>(
        q: CubeTensor<R>,
        k: CubeTensor<R>,
        v: CubeTensor<R>,
        keys: &Keys<B>,
        int_dtype: DType,
    ) -> Self {
        check_shapes(&q, &k, &v);
        let (q, k, v) = (into_contiguous(q), into_contiguous(k), into_contiguous(v));
        let d_k = q.meta.shape()[3];
        let d_v = v.meta.shape()[3];
        let (blocks, index, window, span) = match keys {
            Keys::Window { w } => {
                // Never read (the kernels' window branch is compile-time), so not filled: a fill
                // is a launch of its own.
                let placeholder = empty_device_contiguous_dtype::<R>(
                    q.client.clone(),
                    q.device.clone(),
                    Shape::new([1, 1, 1, 1]),
                    int_dtype,
                );
                (placeholder, None, true, *w)
            }
            Keys::Compressed { .. } => unreachable!("the compressed branch has its own kernels"),
            Keys::Selected { blocks, block_size, index } => {
                let index = index.as_ref().map(|index| InvertedIndex::from_tensors(index.tensors.clone()));
                (into_contiguous(blocks.clone()), index, false, *block_size)
            }
        };
        let span = u32::try_from(span).expect("window or block size fits in u32");
        Call { q, k, v, blocks, index, window, span, scale: 1.0 / (d_k as f32).sqrt(), d_k, d_v }
    }

    fn client(&self) -> ComputeClient<R> {
        self.q.client.clone()
    }

    /// Every tensor the op allocates is contiguous. CubeCL's default allocation on CUDA is
    /// pitched (rows padded to a power of two), and the index kernels address their rows with
    /// plain `row * width + i`, so a padded row length put every KV head after the first at the
    /// wrong place (WGPU allocates contiguously, which is why only CUDA showed it).
    fn empty(&self, shape: Shape, dtype: DType) -> CubeTensor<R> {
        empty_device_contiguous_dtype::<R>(self.client(), self.q.device.clone(), shape, dtype)
    }

    fn cube_dim(&self) -> CubeDim {
        CubeDim::new_1d(UNITS_PER_CUBE)
    }

    /// Shared memory a cube may use: the device's limit, capped so several cubes fit an SM.
    fn shared_bytes(&self) -> usize {
        self.client().properties().hardware.max_shared_memory_size.min(SHARED_BYTES_CAP)
    }

    fn query_tiling(&self, pass: QueryPass) -> QueryTiling {
        QueryTiling::plan(pass, self.window, self.group(), self.d_k, self.d_v, self.shared_bytes())
    }

    /// The tensor-core window tiling (forward, dQ) when the device has 16x16x16 MMA for the
    /// storage type with f32 accumulation and 32-unit planes (CUDA on tensor-core GPUs,
    /// f16/bf16); `None` runs the plain kernel (f32 storage, WGPU, head dims off the MMA tile)
    /// or, for a selection, [`Call::select_mma_tiling`]'s.
    fn mma_tiling(&self, pass: QueryPass) -> Option<MmaTiling> {
        if !self.window {
            return None;
        }
        let shared = self.mma_shared_bytes()?;
        MmaTiling::plan(pass, self.group(), self.d_k, self.d_v, self.q.dtype.size(), shared)
    }

    /// `delta = dO . O` per row (f32), for the backward kernels that do not compute it
    /// themselves; with `zero_sum`, the zeroed dQ sum `grad_q_sum` (contiguous f32, the shape of
    /// `q`) on the way.
    fn row_delta(
        &self,
        out: &CubeTensor<R>,
        grad_out: &CubeTensor<R>,
        delta: &CubeTensor<R>,
        grad_q_sum: &CubeTensor<R>,
        zero_sum: bool,
    ) {
        let rows = delta_rows(self.d_v, mma_forward::VECTOR);
        let dim = CubeDim::new_2d((self.d_v / mma_forward::VECTOR) as u32, rows as u32);
        let cubes = delta.meta.shape().num_elements().div_ceil(rows);
        mma_backward::row_delta::launch::<R>(
            &self.client(),
            calculate_cube_count_elemwise(&self.client(), cubes * dim.num_elems() as usize, dim),
            dim,
            mma_forward::VECTOR,
            out.clone().into_tensor_arg(),
            grad_out.clone().into_tensor_arg(),
            delta.clone().into_tensor_arg(),
            grad_q_sum.clone().into_tensor_arg(),
            self.d_v,
            rows,
            if zero_sum { self.d_k } else { 0 },
            self.q.dtype.into(),
        );
    }

    /// Whether the register-resident kernels run here: the tensor-core conditions
    /// ([`Call::mma_shared_bytes`]) and the manual MMA (m16n8k16 with f32 accumulation) with
    /// `ldmatrix` for the storage type (CUDA on sm80+).
    fn has_manual_mma(&self) -> bool {
        if self.mma_shared_bytes().is_none() {
            return false;
        }
        let dtype = self.q.dtype;
        let config =
            MmaConfig { a_type: dtype.into(), b_type: dtype.into(), cd_type: DType::F32.into(), m: 16, n: 8, k: 16 };
        let client = self.client();
        let matmul = &client.properties().features.matmul;
        let storage: StorageType = dtype.into();
        matmul.mma.contains(&config) && matmul.ldmatrix.contains(&storage)
    }

    /// The register-resident window forward's tiling, where [`Call::has_manual_mma`]: see
    /// [`flash_forward`].
    fn flash_tiling(&self, pass: QueryPass) -> Option<FlashTiling> {
        if !self.window || !self.has_manual_mma() {
            return None;
        }
        FlashTiling::plan(pass, self.group(), self.d_k, self.d_v)
    }

    /// The key-major selection forward's tiling, where [`Call::has_manual_mma`] and the block
    /// fits: see [`flash_select`].
    fn flash_select_tiling(&self) -> Option<FlashSelectTiling> {
        if self.window || !self.has_manual_mma() {
            return None;
        }
        FlashSelectTiling::plan(self.span as usize, self.d_k, self.d_v, self.mma_shared_bytes()?)
    }

    /// The key-major selection forward: each block's listed rows attend it alone (partials at
    /// the block's slot of each row), then every row merges its slots into `out` and `lse`.
    fn selection_forward_key_major(&self, tiling: &FlashSelectTiling, out: &CubeTensor<R>, lse: &CubeTensor<R>) {
        let [b, t, h_q, _] = self.q.meta.shape().dims::<4>();
        let n = self.blocks.meta.shape()[3];
        let index = self.inverted_index();
        let part_out = self.empty(Shape::new([b, t, h_q, n * self.d_v]), self.q.dtype);
        let part_lse = self.empty(Shape::new([b, t, h_q, n]), DType::F32);
        let (count, dim) = self.plane_grid(self.key_cubes(tiling.keys, &index), tiling.planes);
        let narrow = FlashSelectTiling::narrow_partials(self.d_v);
        // Unchecked at narrow heads only. In one H100 call (docs/benchmarks.md, twelfth
        // session) the build with every register-resident kernel unchecked took the paper
        // shape's selected forward at 64k to 43.6 ms, against 21.4-24.4 ms for the previous
        // build; the scaled-score softmax at wide heads changed nothing, which leaves the
        // unchecked launch, the only other change to this kernel's code there. At narrow heads
        // unchecked measured 1.88 -> 1.85 ms. SAFETY: see "Unchecked launches" in this module's
        // documentation.
        macro_rules! partials {
            ($launch:ident) => {
                flash_select::selection_partials_flash::$launch::<R>(
                    &self.client(),
                    count,
                    dim,
                    mma_forward::VECTOR,
                    if narrow { mma_forward::VECTOR } else { 1 },
                    self.q.clone().into_tensor_arg(),
                    self.k.clone().into_tensor_arg(),
                    self.v.clone().into_tensor_arg(),
                    index.offsets.into_tensor_arg(),
                    index.counts.into_tensor_arg(),
                    index.entries.into_tensor_arg(),
                    index.slots.into_tensor_arg(),
                    index.segment_base.into_tensor_arg(),
                    index.segment_block.into_tensor_arg(),
                    index.segment_total.into_tensor_arg(),
                    part_out.clone().into_tensor_arg(),
                    part_lse.clone().into_tensor_arg(),
                    self.scale,
                    SEGMENT_QUERIES as u32,
                    self.d_k,
                    self.d_v,
                    tiling.keys,
                    tiling.planes,
                    narrow,
                    self.group(),
                    self.q.dtype.into(),
                )
            };
        }
        if narrow {
            unsafe { partials!(launch_unchecked) };
        } else {
            partials!(launch);
        }
        let vectors = b * t * h_q * self.d_v / mma_forward::VECTOR;
        flash_select::merge_selection_partials::launch::<R>(
            &self.client(),
            self.cube_count(vectors),
            self.cube_dim(),
            mma_forward::VECTOR,
            part_out.into_tensor_arg(),
            part_lse.into_tensor_arg(),
            self.blocks.clone().into_tensor_arg(),
            out.clone().into_tensor_arg(),
            lse.clone().into_tensor_arg(),
            self.d_v,
            mma_forward::VECTOR,
            [self.q.dtype.into(), self.blocks.dtype.into()],
        );
    }

    /// The register-resident dK/dV tiling: a window's under the conditions of
    /// [`Call::flash_tiling`], a selection's under [`Call::flash_select_tiling`]'s where the
    /// device adds f32 atomically (its dQ is added up by atomics); either folds dQ in at narrow
    /// heads where the device adds f32 atomically: see [`flash_key`].
    fn flash_key_tiling(&self) -> Option<FlashKeyTiling> {
        let atomics = self.adds_f32_atomically();
        if self.window {
            self.flash_tiling(QueryPass::Gradient)?;
        } else if self.flash_select_tiling().is_none() || !atomics {
            return None;
        }
        let shared = self.client().properties().hardware.max_shared_memory_size;
        FlashKeyTiling::plan(self.window, self.d_k, self.d_v, atomics, shared)
    }

    /// f32 elements the device adds atomically in one operation: 4 (sm90's 16-byte vector
    /// atomics), 2, else 1.
    fn f32_atomic_width(&self) -> usize {
        let client = self.client();
        let props = client.properties();
        [4, 2, 1]
            .into_iter()
            .find(|&width| {
                let atomic = Type::new(StorageType::Atomic(FloatKind::F32.into())).with_vector_size(width);
                props.atomic_type_usage(atomic).contains(AtomicUsage::Add)
            })
            .unwrap_or(1)
    }

    /// Whether the device adds f32 to global memory atomically (every CUDA device with tensor
    /// cores).
    fn adds_f32_atomically(&self) -> bool {
        let atomic_f32 = Type::new(StorageType::Atomic(FloatKind::F32.into()));
        self.client().properties().atomic_type_usage(atomic_f32).contains(AtomicUsage::Add)
    }

    /// The tensor-core selection forward's tiling, under the same conditions (a selection's
    /// dQ is folded into its key cubes, [`Call::key_mma_tiling`]).
    fn select_mma_tiling(&self) -> Option<SelectMmaTiling> {
        if self.window {
            return None;
        }
        let shared = self.mma_shared_bytes()?;
        SelectMmaTiling::plan(self.d_k, self.d_v, self.q.dtype.size(), shared)
    }

    /// One plane per `(b, hk, 16-head tile, t)`, `planes` per cube.
    fn select_grid(&self, tiling: &SelectMmaTiling) -> (CubeCount, CubeDim) {
        let [b, t, _, _] = self.q.meta.shape().dims::<4>();
        let h_kv = self.k.meta.shape()[2];
        let items = b * h_kv * SelectMmaTiling::head_tiles(self.group()) * t;
        self.plane_grid(items.div_ceil(tiling.planes), tiling.planes)
    }

    /// The tensor-core dK/dV tiling (window or selection), under the same conditions. A
    /// selection's folds dQ in where the device adds f32 atomically (every CUDA device with
    /// tensor cores); see [`KeyMmaTiling::folds_dq`].
    fn key_mma_tiling(&self) -> Option<KeyMmaTiling> {
        let shared = self.mma_shared_bytes()?;
        let fold_dq = self.adds_f32_atomically() && KeyMmaTiling::folds_dq(self.window);
        KeyMmaTiling::plan(self.window, fold_dq, self.d_k, self.d_v, self.q.dtype.size(), shared)
    }

    /// Shared memory for a tensor-core kernel, or `None` when the device has no 16x16x16 MMA
    /// for the storage type with f32 accumulation on 32-unit planes, or the inputs do not fit
    /// the kernels' loads: they read q, k, v (and `out`, `dO`, made contiguous) as 16-byte
    /// vectors, and the selection forward loads fragments from global memory, which wmma wants
    /// 32-byte aligned with a leading dimension of whole 16-byte words. Strides of whole 16-element
    /// tiles in 32-byte aligned buffers satisfy both (head dims are multiples of 16 anyway).
    fn mma_shared_bytes(&self) -> Option<usize> {
        let dtype = self.q.dtype;
        if !matches!(dtype, DType::F16 | DType::BF16) {
            return None;
        }
        let tile = mma_forward::TILE;
        let strides_fit =
            [&self.q, &self.k, &self.v].iter().all(|x| x.meta.strides()[..3].iter().all(|s| s % tile == 0));
        let rows_fit = self.d_k.is_multiple_of(tile) && self.d_v.is_multiple_of(tile);
        if !strides_fit
            || !rows_fit
            || !self.client().properties().memory.alignment.is_multiple_of(mma_forward::ALIGN as u64)
        {
            return None;
        }
        let client = self.client();
        let props = client.properties();
        let config =
            MmaConfig { a_type: dtype.into(), b_type: dtype.into(), cd_type: DType::F32.into(), m: 16, n: 16, k: 16 };
        let planes_of_32 = props.hardware.plane_size_min == 32 && props.hardware.plane_size_max == 32;
        (planes_of_32 && props.features.matmul.cmma.contains(&config))
            .then(|| props.hardware.max_shared_memory_size.min(MMA_SHARED))
    }

    /// One cube of `(32, planes)` units per `(b, hk, query tile)`.
    fn mma_grid(&self, tiling: &MmaTiling) -> (CubeCount, CubeDim) {
        let [b, t, _, _] = self.q.meta.shape().dims::<4>();
        let h_kv = self.k.meta.shape()[2];
        self.plane_grid(b * h_kv * t.div_ceil(tiling.queries(self.group())), tiling.planes())
    }

    /// Query heads per KV head (`g`): the tilings' and grids' input, and a compile-time
    /// argument of the key-side kernels.
    fn group(&self) -> usize {
        self.q.meta.shape()[2] / self.k.meta.shape()[2]
    }

    /// `cubes` cubes of `planes` planes of 32 units (the tensor-core kernels).
    fn plane_grid(&self, cubes: usize, planes: usize) -> (CubeCount, CubeDim) {
        let dim = CubeDim::new_2d(32, planes as u32);
        (calculate_cube_count_elemwise(&self.client(), cubes * dim.num_elems() as usize, dim), dim)
    }

    /// One cube per `(b, hk, query tile)`.
    fn query_grid(&self, tiling: &QueryTiling) -> (CubeCount, CubeDim) {
        let [b, t, _, _] = self.q.meta.shape().dims::<4>();
        let h_kv = self.k.meta.shape()[2];
        let queries = tiling.rows / self.group();
        self.grid(b * h_kv * t.div_ceil(queries), tiling.units())
    }

    /// One cube per `(b, hk, key tile)`; a selection's tiles are the segments of the blocks'
    /// query lists (as many as there can be), split in sub-tiles when a block has more keys
    /// than a cube.
    fn key_grid(&self, tiling: &KeyTiling, index: &InvertedIndex<R>) -> (CubeCount, CubeDim) {
        self.grid(self.key_cubes(tiling.keys, index), tiling.units())
    }

    /// Key cubes of `keys` keys: window tiles, or sub-tiles of the selection's segments.
    fn key_cubes(&self, keys: usize, index: &InvertedIndex<R>) -> usize {
        let [b, t, h_kv, _] = self.k.meta.shape().dims::<4>();
        let span = self.span as usize;
        let tiles =
            if self.window { t.div_ceil(keys) } else { index.segment_block.meta.shape()[2] * span.div_ceil(keys) };
        b * h_kv * tiles
    }

    /// `cubes` cubes of `units` units, spread over the grid's dimensions (a 1-d grid is capped
    /// at 65535 cubes on some devices); kernels number them by `CUBE_POS` and skip the surplus.
    fn grid(&self, cubes: usize, units: usize) -> (CubeCount, CubeDim) {
        let dim = CubeDim::new_1d(units as u32);
        (calculate_cube_count_elemwise(&self.client(), cubes * units, dim), dim)
    }

    fn cube_count(&self, units: usize) -> CubeCount {
        calculate_cube_count_elemwise(&self.client(), units, self.cube_dim())
    }

    /// The selection's inverted block index: the one its key set carries, else built here.
    fn inverted_index(&self) -> InvertedIndex<R> {
        match (&self.index, self.window) {
            (Some(index), _) => index.clone(),
            (None, true) => InvertedIndex::placeholder(&self.client(), &self.q.device),
            (None, false) => InvertedIndex::build(&self.blocks, self.span as usize),
        }
    }
}

/// Shapes the kernels rely on; a mismatch is a caller bug, reported before any launch.
fn check_shapes<R: CubeRuntime>(q: &CubeTensor<R>, k: &CubeTensor<R>, v: &CubeTensor<R>) {
    let (qs, ks, vs) = (q.meta.shape(), k.meta.shape(), v.meta.shape());
    assert!(
        qs.num_dims() == 4 && ks.num_dims() == 4 && vs.num_dims() == 4,
        "sparse attention takes [B, T, H, d] tensors"
    );
    assert!(qs[0] == ks[0] && qs[1] == ks[1] && ks[..3] == vs[..3], "q, k, v disagree on batch, length or heads");
    assert!(qs[3] == ks[3], "q and k head dims differ");
    assert!(ks[2] > 0 && qs[2] % ks[2] == 0, "query heads must be a multiple of KV heads");
}
