//! The backward plans' launchers: `[dq, dk, dv]` of a window or selection call.

use burn::tensor::{DType, Shape};
use burn_cubecl::kernel::{cast, into_contiguous};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::{calculate_cube_count_elemwise, CubeDim};

use super::index::{InvertedIndex, SEGMENT_QUERIES};
use super::Operands;
use crate::kernel::key_gradients::attention_key_flash;
use crate::kernel::portable::backward::{attention_backward_key, attention_backward_query};
use crate::kernel::primitives::layout::VECTOR;
use crate::kernel::row_delta::row_delta;
use crate::kernel::selection::dq::selection_dq_flash;
use crate::kernel::selection::segments::{sum_segments, sum_segments_vector};
use crate::kernel::window::dq::window_dq_flash;
use crate::sparse::plan::{BackwardPlan, DqPlan};
use crate::sparse::tiling::{delta_rows, FlashKeyTiling, FlashSelectTiling, FlashTiling, KeyTiling, QueryTiling};

/// What the forward left and the output's gradient, made contiguous.
pub(crate) struct Saved<R: CubeRuntime> {
    pub out: CubeTensor<R>,
    pub lse: CubeTensor<R>,
    pub grad_out: CubeTensor<R>,
}

/// The buffers a backward writes.
pub(crate) struct Gradients<R: CubeRuntime> {
    /// `dO . O` per row (f32).
    pub delta: CubeTensor<R>,
    /// dQ in the storage type, where a query-side kernel writes it.
    pub grad_q: Option<CubeTensor<R>>,
    /// dQ in f32 (the shape of `q`), where kernels add it by atomics; else a placeholder.
    pub grad_q_sum: CubeTensor<R>,
    pub grad_k: CubeTensor<R>,
    pub grad_v: CubeTensor<R>,
    /// A selection's per-segment dK and dV shares, `[B * H_kv, segments, span * (d_k + d_v)]`
    /// (f32), which [`sum_segments`] adds; a placeholder for a window.
    pub partial: CubeTensor<R>,
}

/// Runs `plan`: `[dq, dk, dv]`.
pub(crate) fn run<R: CubeRuntime>(
    ops: &Operands<R>,
    out: CubeTensor<R>,
    lse: CubeTensor<R>,
    grad_out: CubeTensor<R>,
    plan: &BackwardPlan,
) -> [CubeTensor<R>; 3] {
    let saved = Saved { out: into_contiguous(out), lse: into_contiguous(lse), grad_out: into_contiguous(grad_out) };
    let index = ops.inverted_index();
    // dQ is summed in f32 by atomics where the key kernel folds it in or a selection's key-major
    // kernel adds it; otherwise a query-side kernel writes it.
    let sums_dq = matches!(plan, BackwardPlan::TensorCore { dq: DqPlan::Folded | DqPlan::Selection(_), .. });
    let grads = gradients(ops, &index, sums_dq);
    match plan {
        BackwardPlan::Portable { query, keys } => {
            portable_query(ops, query, &saved, &grads);
            portable_keys(ops, keys, &index, &saved, &grads);
        }
        BackwardPlan::TensorCore { dq, keys, atomic_width } => {
            row_deltas(ops, &saved, &grads, sums_dq);
            match dq {
                DqPlan::Folded => {}
                DqPlan::Window(tiling) => window_dq(ops, tiling, &saved, &grads),
                DqPlan::Selection(tiling) => selection_dq(ops, tiling, *atomic_width, &index, &saved, &grads),
            }
            let atomic_width = if keys.fold_dq { *atomic_width } else { 1 };
            tensor_core_keys(ops, keys, atomic_width, &index, &saved, &grads);
        }
    }
    if !ops.window {
        segment_sums(ops, &index, &grads);
    }
    let grad_q = grads.grad_q.unwrap_or_else(|| cast(grads.grad_q_sum, ops.q.dtype));
    [grad_q, grads.grad_k, grads.grad_v]
}

fn gradients<R: CubeRuntime>(ops: &Operands<R>, index: &InvertedIndex<R>, sums_dq: bool) -> Gradients<R> {
    let [b, t, h_q, h_kv] = ops.dims();
    let dtype = ops.q.dtype;
    let placeholder = |rank: usize| ops.empty(Shape::from(vec![1; rank]), DType::F32);
    let (grad_q, grad_q_sum) = if sums_dq {
        (None, ops.empty(ops.q.meta.shape().clone(), DType::F32))
    } else {
        (Some(ops.empty(ops.q.meta.shape().clone(), dtype)), placeholder(4))
    };
    let partial = if ops.window {
        placeholder(5)
    } else {
        let segments = index.segment_block.meta.shape()[2];
        ops.empty(Shape::new([b * h_kv, segments, ops.span as usize * (ops.d_k + ops.d_v)]), DType::F32)
    };
    Gradients {
        delta: ops.empty(Shape::new([b, t, h_q]), DType::F32),
        grad_q,
        grad_q_sum,
        grad_k: ops.empty(ops.k.meta.shape().clone(), dtype),
        grad_v: ops.empty(ops.v.meta.shape().clone(), dtype),
        partial,
    }
}

/// Query cubes: dQ and `delta`.
fn portable_query<R: CubeRuntime>(ops: &Operands<R>, tiling: &QueryTiling, saved: &Saved<R>, grads: &Gradients<R>) {
    let (count, dim) = ops.grid(ops.query_cubes(tiling.rows / ops.group()), tiling.units());
    attention_backward_query::launch::<R>(
        &ops.client(),
        count,
        dim,
        ops.q.clone().into_tensor_arg(),
        ops.k.clone().into_tensor_arg(),
        ops.v.clone().into_tensor_arg(),
        ops.blocks.clone().into_tensor_arg(),
        ops.starts.clone().into_tensor_arg(),
        saved.out.clone().into_tensor_arg(),
        saved.grad_out.clone().into_tensor_arg(),
        saved.lse.clone().into_tensor_arg(),
        grads.delta.clone().into_tensor_arg(),
        grads.grad_q.clone().expect("a query-side dQ").into_tensor_arg(),
        ops.scale,
        ops.span,
        ops.window,
        u32::from(ops.documents),
        ops.d_k,
        ops.d_v,
        tiling.parts,
        tiling.rows,
        tiling.chunk,
        tiling.unroll,
        [ops.q.dtype.into(), ops.blocks.dtype.into()],
    );
}

/// Key cubes: dK and dV (a selection's as segment shares).
fn portable_keys<R: CubeRuntime>(
    ops: &Operands<R>,
    tiling: &KeyTiling,
    index: &InvertedIndex<R>,
    saved: &Saved<R>,
    grads: &Gradients<R>,
) {
    let (count, dim) = ops.grid(ops.key_cubes(tiling.keys, index), tiling.units());
    attention_backward_key::launch::<R>(
        &ops.client(),
        count,
        dim,
        ops.q.clone().into_tensor_arg(),
        ops.k.clone().into_tensor_arg(),
        ops.v.clone().into_tensor_arg(),
        saved.grad_out.clone().into_tensor_arg(),
        saved.lse.clone().into_tensor_arg(),
        grads.delta.clone().into_tensor_arg(),
        index.lists(),
        ops.starts.clone().into_tensor_arg(),
        grads.grad_k.clone().into_tensor_arg(),
        grads.grad_v.clone().into_tensor_arg(),
        grads.partial.clone().into_tensor_arg(),
        ops.scale,
        ops.span,
        SEGMENT_QUERIES as u32,
        ops.window,
        u32::from(ops.documents),
        ops.d_k,
        ops.d_v,
        tiling.parts,
        tiling.keys,
        tiling.chunk,
        tiling.unroll,
        ops.group(),
        [ops.q.dtype.into(), ops.starts.dtype.into()],
    );
}

/// `delta = dO . O` per row; with `zero_sum`, the f32 dQ sum zeroed on the way.
fn row_deltas<R: CubeRuntime>(ops: &Operands<R>, saved: &Saved<R>, grads: &Gradients<R>, zero_sum: bool) {
    let rows = delta_rows(ops.d_v, VECTOR);
    let dim = CubeDim::new_2d((ops.d_v / VECTOR) as u32, rows as u32);
    let cubes = grads.delta.meta.shape().num_elements().div_ceil(rows);
    row_delta::launch::<R>(
        &ops.client(),
        calculate_cube_count_elemwise(&ops.client(), cubes * dim.num_elems() as usize, dim),
        dim,
        VECTOR,
        saved.out.clone().into_tensor_arg(),
        saved.grad_out.clone().into_tensor_arg(),
        grads.delta.clone().into_tensor_arg(),
        grads.grad_q_sum.clone().into_tensor_arg(),
        ops.d_v,
        rows,
        if zero_sum { ops.d_k } else { 0 },
        ops.q.dtype.into(),
    );
}

/// A window's dQ on the forward's query cubes.
fn window_dq<R: CubeRuntime>(ops: &Operands<R>, tiling: &FlashTiling, saved: &Saved<R>, grads: &Gradients<R>) {
    let (count, dim) = ops.plane_grid(ops.query_cubes(tiling.queries(ops.group())), tiling.planes());
    // SAFETY: see "Unchecked launches" in the module documentation.
    unsafe {
        window_dq_flash::launch_unchecked::<R>(
            &ops.client(),
            count,
            dim,
            VECTOR,
            ops.q.clone().into_tensor_arg(),
            ops.k.clone().into_tensor_arg(),
            ops.v.clone().into_tensor_arg(),
            ops.starts.clone().into_tensor_arg(),
            saved.grad_out.clone().into_tensor_arg(),
            saved.lse.clone().into_tensor_arg(),
            grads.delta.clone().into_tensor_arg(),
            grads.grad_q.clone().expect("a query-side dQ").into_tensor_arg(),
            ops.scale,
            ops.span,
            ops.d_k,
            ops.d_v,
            tiling.rows,
            tiling.planes(),
            tiling.key_tile,
            ops.documents,
            [ops.q.dtype.into(), ops.starts.dtype.into()],
        );
    }
}

/// A selection's dQ, key-major, added to the f32 sum by atomics.
fn selection_dq<R: CubeRuntime>(
    ops: &Operands<R>,
    tiling: &FlashSelectTiling,
    atomic_width: usize,
    index: &InvertedIndex<R>,
    saved: &Saved<R>,
    grads: &Gradients<R>,
) {
    let (count, dim) = ops.plane_grid(ops.key_cubes(tiling.keys, index), tiling.dq_planes);
    // SAFETY: see "Unchecked launches" in the module documentation.
    unsafe {
        selection_dq_flash::launch_unchecked::<R>(
            &ops.client(),
            count,
            dim,
            VECTOR,
            atomic_width,
            ops.q.clone().into_tensor_arg(),
            ops.k.clone().into_tensor_arg(),
            ops.v.clone().into_tensor_arg(),
            saved.grad_out.clone().into_tensor_arg(),
            saved.lse.clone().into_tensor_arg(),
            grads.delta.clone().into_tensor_arg(),
            index.lists(),
            grads.grad_q_sum.clone().into_tensor_arg(),
            ops.scale,
            SEGMENT_QUERIES as u32,
            ops.d_k,
            ops.d_v,
            tiling.keys,
            tiling.dq_planes,
            atomic_width,
            ops.group(),
            ops.q.dtype.into(),
        );
    }
}

/// The register-resident key kernel: dK and dV (a selection's as segment shares), and dQ where
/// the tiling folds it in.
fn tensor_core_keys<R: CubeRuntime>(
    ops: &Operands<R>,
    tiling: &FlashKeyTiling,
    atomic_width: usize,
    index: &InvertedIndex<R>,
    saved: &Saved<R>,
    grads: &Gradients<R>,
) {
    let (count, dim) = ops.plane_grid(ops.key_cubes(tiling.keys(), index), tiling.planes);
    // SAFETY: see "Unchecked launches" in the module documentation.
    unsafe {
        attention_key_flash::launch_unchecked::<R>(
            &ops.client(),
            count,
            dim,
            VECTOR,
            atomic_width,
            ops.q.clone().into_tensor_arg(),
            ops.k.clone().into_tensor_arg(),
            ops.v.clone().into_tensor_arg(),
            saved.grad_out.clone().into_tensor_arg(),
            saved.lse.clone().into_tensor_arg(),
            grads.delta.clone().into_tensor_arg(),
            index.lists(),
            ops.starts.clone().into_tensor_arg(),
            grads.grad_k.clone().into_tensor_arg(),
            grads.grad_v.clone().into_tensor_arg(),
            grads.partial.clone().into_tensor_arg(),
            grads.grad_q_sum.clone().into_tensor_arg(),
            ops.scale,
            ops.span,
            SEGMENT_QUERIES as u32,
            ops.window,
            ops.documents,
            ops.d_k,
            ops.d_v,
            tiling.planes,
            tiling.q_rows,
            tiling.fold_dq,
            atomic_width,
            ops.group(),
            [ops.q.dtype.into(), ops.starts.dtype.into()],
        );
    }
}

/// A selection's dK and dV: each block's segment shares added in segment order.
fn segment_sums<R: CubeRuntime>(ops: &Operands<R>, index: &InvertedIndex<R>, grads: &Gradients<R>) {
    let [b, t, _, h_kv] = ops.dims();
    let vector = sum_segments_vector(ops.d_k, ops.d_v);
    let (count, dim) = ops.elementwise(b * t * h_kv * (ops.d_k + ops.d_v) / vector);
    sum_segments::launch::<R>(
        &ops.client(),
        count,
        dim,
        vector,
        grads.partial.clone().into_tensor_arg(),
        index.counts.clone().into_tensor_arg(),
        index.segment_base.clone().into_tensor_arg(),
        grads.grad_k.clone().into_tensor_arg(),
        grads.grad_v.clone().into_tensor_arg(),
        ops.span,
        SEGMENT_QUERIES as u32,
        ops.d_k,
        ops.d_v,
        vector,
        ops.q.dtype.into(),
    );
}
