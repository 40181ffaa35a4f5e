//! Launches the block selection on `CubeBackend`: [`SelectionPlan`] chooses the tensor-core
//! kernel ([`crate::kernel::selection::top_n_mma`]) or the portable one
//! ([`crate::kernel::selection::top_n`]).

use burn::tensor::{DType, Shape};
use burn_cubecl::kernel::{cast, into_contiguous};
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::client::ComputeClient;
use cubecl::ir::StorageType;
use cubecl::{calculate_cube_count_elemwise, CubeCount, CubeDim};

use crate::kernel::primitives::layout::VECTOR;
use crate::kernel::selection::top_n::select_top_n;
use crate::kernel::selection::top_n_mma::select_top_n_mma;
use crate::sparse::api::Selection;
use crate::sparse::launch::capabilities;
use crate::sparse::plan::{KeyKind, Problem, SelectionPlan};
use crate::sparse::tiling::{SelectionTiling, SELECTION_LANES};

/// The plan the selection of `q` against `h_kv` KV heads runs; a shape no plan can run panics
/// with the plan table's one line (the layer's config rules such shapes out first).
fn plan_of<R: CubeRuntime>(q: &CubeTensor<R>, h_kv: usize, selection: &Selection) -> SelectionPlan {
    let [_, t, heads_q, d_k] = q.meta.shape().dims::<4>();
    let keys = KeyKind::Selected { block_size: selection.block_size };
    let problem = Problem { heads_q, heads_kv: h_kv, d_k, d_v: d_k, dtype: q.dtype, keys };
    SelectionPlan::choose(&problem, &capabilities(&q.client), t, selection.block_size, selection.n)
        .unwrap_or_else(|message| panic!("{message}"))
}

/// `q [B, T, H_q, d_k]`, compressed keys `k [B, N, H_kv, d_k]` and the compressed branch's
/// `lse [B, T, H_q]` -> the block lists `[B, T, H_kv, n]` of the backend's int dtype `int`;
/// with document `starts` `[B, T]`, each query's blocks come from its document.
///
/// Panics with one line when the sequence has more selection blocks than a cube's shared
/// memory holds scores for (over a million tokens at the production shape on an H100).
pub fn select_blocks<R: CubeRuntime>(
    q: CubeTensor<R>,
    k: CubeTensor<R>,
    lse: CubeTensor<R>,
    selection: Selection,
    starts: Option<&CubeTensor<R>>,
    int: DType,
) -> CubeTensor<R> {
    let (q, k) = (into_contiguous(q), into_contiguous(k));
    let lse = into_contiguous(match lse.dtype {
        DType::F32 => lse,
        _ => cast::<R>(lse, DType::F32),
    });
    let [b, t, h_q, d_k] = q.meta.shape().dims::<4>();
    let h_kv = k.meta.shape()[2];
    let g = h_q / h_kv;
    let client = q.client.clone();
    let plan = plan_of(&q, h_kv, &selection);
    let documents = starts.is_some();
    // Never read without documents (a compile-time choice in the tensor-core kernel, a run-time
    // one in the portable kernel), so not filled.
    let starts = starts.map_or_else(
        || empty_device_contiguous_dtype::<R>(client.clone(), q.device.clone(), Shape::new([1, 1]), int),
        |starts| into_contiguous(starts.clone()),
    );
    let list = empty_device_contiguous_dtype::<R>(
        client.clone(),
        q.device.clone(),
        Shape::new([b, t, h_kv, selection.n]),
        int,
    );
    let tiling = match plan {
        SelectionPlan::Portable(tiling) | SelectionPlan::TensorCore(tiling) => tiling,
    };
    let dim = CubeDim::new_2d(SELECTION_LANES as u32, tiling.rows as u32);
    let cubes = b * h_kv * t.div_ceil(tiling.rows);
    let count = calculate_cube_count_elemwise(&client, cubes * dim.num_elems() as usize, dim);
    let dtypes = [q.dtype.into(), int.into()];
    let launch = TopNLaunch { count, dim, documents, g, d_k, tiling, dtypes };
    launch_top_n(&client, plan, [q, k, lse, starts, list.clone()], selection, launch);
    list
}

/// What [`launch_top_n`] needs of [`select_blocks`]' set-up.
struct TopNLaunch {
    count: CubeCount,
    dim: CubeDim,
    documents: bool,
    g: usize,
    d_k: usize,
    tiling: SelectionTiling,
    dtypes: [StorageType; 2],
}

/// The selection kernel of `plan` over `q, k, lse, starts` into `list`.
fn launch_top_n<R: CubeRuntime>(
    client: &ComputeClient<R>,
    plan: SelectionPlan,
    [q, k, lse, starts, list]: [CubeTensor<R>; 5],
    selection: Selection,
    launch: TopNLaunch,
) {
    let TopNLaunch { count, dim, documents, g, d_k, tiling, dtypes } = launch;
    let scale = 1.0 / (d_k as f32).sqrt();
    let (length, stride, block_size) = (selection.length, selection.stride, selection.block_size);
    match plan {
        SelectionPlan::TensorCore(_) => select_top_n_mma::launch::<R>(
            client,
            count,
            dim,
            VECTOR,
            q.into_tensor_arg(),
            k.into_tensor_arg(),
            lse.into_tensor_arg(),
            starts.into_tensor_arg(),
            list.into_tensor_arg(),
            scale,
            documents,
            length,
            stride,
            block_size,
            g,
            d_k,
            tiling.rows,
            tiling.blocks,
            selection.n,
            dtypes,
        ),
        SelectionPlan::Portable(_) => {
            let vector = SelectionTiling::vector(d_k);
            select_top_n::launch::<R>(
                client,
                count,
                dim,
                vector,
                q.into_tensor_arg(),
                k.into_tensor_arg(),
                lse.into_tensor_arg(),
                starts.into_tensor_arg(),
                list.into_tensor_arg(),
                scale,
                u32::from(documents),
                length,
                stride,
                block_size,
                g,
                d_k,
                tiling.rows,
                tiling.blocks,
                selection.n,
                vector,
                dtypes,
            )
        }
    }
}
