//! The forward plans' launchers: `(out, lse)` of a window or selection call.

use burn::tensor::{DType, Shape};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;

use super::index::SEGMENT_QUERIES;
use super::Operands;
use crate::kernel::portable::forward::attention_forward;
use crate::kernel::primitives::layout::VECTOR;
use crate::kernel::selection::{merge::merge_selection_partials, partials::selection_partials_flash};
use crate::kernel::window::forward::window_forward_flash;
use crate::sparse::plan::ForwardPlan;
use crate::sparse::tiling::{FlashSelectTiling, FlashTiling, QueryTiling};

/// What a forward writes: `out [B, T, H_q, d_v]` in the storage type, `lse [B, T, H_q]` in f32.
pub(crate) struct Outputs<R: CubeRuntime> {
    pub out: CubeTensor<R>,
    pub lse: CubeTensor<R>,
}

/// Runs `plan`: `(out, lse)`.
pub(crate) fn run<R: CubeRuntime>(ops: &Operands<R>, plan: &ForwardPlan) -> (CubeTensor<R>, CubeTensor<R>) {
    let [b, t, h_q, _] = ops.dims();
    let outputs = Outputs {
        out: ops.empty(Shape::new([b, t, h_q, ops.d_v]), ops.q.dtype),
        lse: ops.empty(Shape::new([b, t, h_q]), DType::F32),
    };
    match plan {
        ForwardPlan::Portable(tiling) => portable(ops, tiling, &outputs),
        ForwardPlan::Window(tiling) => window(ops, tiling, &outputs),
        ForwardPlan::Selection(tiling) => selection(ops, tiling, &outputs),
    }
    (outputs.out, outputs.lse)
}

fn portable<R: CubeRuntime>(ops: &Operands<R>, tiling: &QueryTiling, outputs: &Outputs<R>) {
    let (count, dim) = ops.grid(ops.query_cubes(tiling.rows / ops.group()), tiling.units());
    attention_forward::launch::<R>(
        &ops.client(),
        count,
        dim,
        ops.q.clone().into_tensor_arg(),
        ops.k.clone().into_tensor_arg(),
        ops.v.clone().into_tensor_arg(),
        ops.blocks.clone().into_tensor_arg(),
        ops.starts.clone().into_tensor_arg(),
        outputs.out.clone().into_tensor_arg(),
        outputs.lse.clone().into_tensor_arg(),
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

fn window<R: CubeRuntime>(ops: &Operands<R>, tiling: &FlashTiling, outputs: &Outputs<R>) {
    let (count, dim) = ops.plane_grid(ops.query_cubes(tiling.queries(ops.group())), tiling.planes());
    // SAFETY: see "Unchecked launches" in the module documentation.
    unsafe {
        window_forward_flash::launch_unchecked::<R>(
            &ops.client(),
            count,
            dim,
            VECTOR,
            ops.q.clone().into_tensor_arg(),
            ops.k.clone().into_tensor_arg(),
            ops.v.clone().into_tensor_arg(),
            ops.starts.clone().into_tensor_arg(),
            outputs.out.clone().into_tensor_arg(),
            outputs.lse.clone().into_tensor_arg(),
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

/// The key-major selection forward: each block's listed rows attend it alone (partials at the
/// block's slot of each row), then every row merges its slots into `out` and `lse`.
fn selection<R: CubeRuntime>(ops: &Operands<R>, tiling: &FlashSelectTiling, outputs: &Outputs<R>) {
    let [b, t, h_q, _] = ops.dims();
    let n = ops.blocks.meta.shape()[3];
    let index = ops.inverted_index();
    let part_out = ops.empty(Shape::new([b, t, h_q, n * ops.d_v]), ops.q.dtype);
    let part_lse = ops.empty(Shape::new([b, t, h_q, n]), DType::F32);
    let (count, dim) = ops.plane_grid(ops.key_cubes(tiling.keys, &index), tiling.planes);
    let narrow = FlashSelectTiling::narrow_partials(ops.d_v);
    // Unchecked at narrow heads only: wide heads keep CubeCL's bounds checks, since dropping them
    // gains nothing there (docs/kernels.md).
    macro_rules! partials {
        ($launch:ident) => {
            selection_partials_flash::$launch::<R>(
                &ops.client(),
                count,
                dim,
                VECTOR,
                if narrow { VECTOR } else { 1 },
                ops.q.clone().into_tensor_arg(),
                ops.k.clone().into_tensor_arg(),
                ops.v.clone().into_tensor_arg(),
                index.lists(),
                index.slots.clone().into_tensor_arg(),
                part_out.clone().into_tensor_arg(),
                part_lse.clone().into_tensor_arg(),
                ops.scale,
                SEGMENT_QUERIES as u32,
                ops.d_k,
                ops.d_v,
                tiling.keys,
                tiling.planes,
                narrow,
                ops.group(),
                ops.q.dtype.into(),
            )
        };
    }
    if narrow {
        // SAFETY: see "Unchecked launches" in the module documentation.
        unsafe { partials!(launch_unchecked) };
    } else {
        partials!(launch);
    }
    let (count, dim) = ops.elementwise(b * t * h_q * ops.d_v / VECTOR);
    merge_selection_partials::launch::<R>(
        &ops.client(),
        count,
        dim,
        VECTOR,
        part_out.into_tensor_arg(),
        part_lse.into_tensor_arg(),
        ops.blocks.clone().into_tensor_arg(),
        outputs.out.clone().into_tensor_arg(),
        outputs.lse.clone().into_tensor_arg(),
        ops.d_v,
        VECTOR,
        [ops.q.dtype.into(), ops.blocks.dtype.into()],
    );
}
