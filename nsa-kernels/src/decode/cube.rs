//! `CubeBackend`: the step as [`crate::kernel::decode::step`], one cube of one plane per
//! `(sequence, KV head)`.

use burn::tensor::{DType, Shape};
use burn_cubecl::element::BoolElement;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::ops::permute;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{CubeBackend, CubeRuntime, FloatElement, IntElement};
use cubecl::{calculate_cube_count_elemwise, CubeDim};

use super::{DecodeAttentionBackend, DecodeBranches, DecodeStep};
use crate::kernel::decode::step::decode_step;
use crate::sparse::launch::capabilities;
use crate::sparse::tiling::{SelectionTiling, SELECTION_LANES};
use crate::sparse::Selection;

impl<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement> DecodeAttentionBackend
    for CubeBackend<R, F, I, BT>
{
    fn has_decode_kernel() -> bool {
        true
    }

    fn decode_attention(step: DecodeStep<Self>) -> Option<DecodeBranches<Self>> {
        let DecodeStep { q, compressed, selected, window, positions, selection } = step;
        let caches = [compressed, selected, window].map(|pair| pair.map(tokens_first));
        let (outputs, blocks) = launch(into_contiguous(q), caches, into_contiguous(positions), selection, I::dtype());
        Some(DecodeBranches { outputs, blocks })
    }
}

/// `[B, H_kv, S, d]` as the `[B, S, H_kv, d]` view the kernel indexes (no copy).
fn tokens_first<R: CubeRuntime>(x: CubeTensor<R>) -> CubeTensor<R> {
    permute(x, &[0, 2, 1, 3])
}

/// Launches the step over `q [B, 1, H_q, d_k]` and the caches `[B, S, H_kv, d]` (compressed,
/// selected, window; keys then values). Panics with one line when the cache has more
/// selection blocks than a cube's shared memory holds scores for, as the training selection
/// does (over a million positions at the production shape).
fn launch<R: CubeRuntime>(
    q: CubeTensor<R>,
    caches: [[CubeTensor<R>; 2]; 3],
    positions: CubeTensor<R>,
    selection: Selection,
    int: DType,
) -> ([CubeTensor<R>; 3], CubeTensor<R>) {
    let [b, _, h_q, d_k] = q.meta.shape().dims::<4>();
    let [[compressed_k, compressed_v], [selected_k, selected_v], [window_k, window_v]] = caches;
    let [_, max_len, h_kv, d_v] = selected_v.meta.shape().dims::<4>();
    let g = h_q / h_kv;
    let client = q.client.clone();
    let shared = capabilities(&client).shared_bytes;
    let tiling = SelectionTiling::plan(max_len, selection.block_size, selection.n, g, d_k, shared)
        .unwrap_or_else(|message| panic!("{message}"));
    let output =
        || empty_device_contiguous_dtype::<R>(client.clone(), q.device.clone(), Shape::new([b, 1, h_q, d_v]), q.dtype);
    let outputs = [output(), output(), output()];
    let list = empty_device_contiguous_dtype::<R>(
        client.clone(),
        q.device.clone(),
        Shape::new([b, 1, h_kv, selection.n]),
        int,
    );
    let dim = CubeDim::new_1d(SELECTION_LANES as u32);
    let count = calculate_cube_count_elemwise(&client, b * h_kv * SELECTION_LANES, dim);
    let vector = SelectionTiling::vector(d_k);
    let [o_compressed, o_selected, o_window] = outputs.clone().map(|o| o.into_tensor_arg());
    decode_step::launch::<R>(
        &client,
        count,
        dim,
        vector,
        q.clone().into_tensor_arg(),
        compressed_k.into_tensor_arg(),
        compressed_v.into_tensor_arg(),
        selected_k.into_tensor_arg(),
        selected_v.into_tensor_arg(),
        window_k.into_tensor_arg(),
        window_v.into_tensor_arg(),
        positions.into_tensor_arg(),
        o_compressed,
        o_selected,
        o_window,
        list.clone().into_tensor_arg(),
        1.0 / (d_k as f32).sqrt(),
        selection.length,
        selection.stride,
        selection.block_size,
        g,
        d_k,
        d_v,
        tiling.blocks,
        selection.n,
        vector,
        [q.dtype.into(), int.into()],
    );
    (outputs, list)
}
