//! `CubeBackend`: the step as [`crate::kernel::decode::step`], one cube of up to [`PLANES`]
//! planes per `(sequence, KV head)`.

use burn::tensor::{DType, Shape};
use burn_cubecl::element::BoolElement;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::ops::permute;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{CubeBackend, CubeRuntime, FloatElement, IntElement};
use cubecl::{calculate_cube_count_elemwise, CubeDim};

use super::{write, DecodeAttentionBackend, DecodeBranches, DecodeStep, DecodeWrite, DecodeWritten};
use crate::kernel::decode::step::decode_step;
use crate::sparse::launch::capabilities;
use crate::sparse::tiling::{SelectionTiling, SELECTION_LANES, SELECTION_SHARED};
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

    fn decode_write(step: DecodeWrite<Self>) -> Option<DecodeWritten<Self>> {
        Some(write::launch(step))
    }
}

/// `[B, H_kv, S, d]` as the `[B, S, H_kv, d]` view the kernel indexes (no copy).
fn tokens_first<R: CubeRuntime>(x: CubeTensor<R>) -> CubeTensor<R> {
    permute(x, &[0, 2, 1, 3])
}

/// Planes of a decode cube at most: more keys in flight per chunk round at long context, and
/// still few enough that a cube's merge buffers stay small.
const PLANES: usize = 8;

/// Shared memory one decode cube of `planes` declares (bytes): the staged queries, the block
/// scores, each plane's chunk scores, the planes' states to merge, the key masses, the
/// argmax's exchange rows and the chosen blocks.
fn shared_bytes(planes: usize, blocks: usize, g: usize, d_k: usize, d_v: usize, n: usize) -> usize {
    let lanes = SELECTION_LANES;
    4 * (g * d_k + blocks + planes * (g * lanes + 2 * g + g * d_v + lanes + 2 * lanes) + n + 1)
}

/// Launches the step over `q [B, 1, H_q, d_k]` and the caches `[B, S, H_kv, d]` (compressed,
/// selected, window; keys then values). Panics with one line when the cache has more
/// selection blocks than a cube's shared memory holds scores for (as the training selection
/// does, past a million positions at the production shape).
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
    let (g, n) = (h_q / h_kv, selection.n);
    let client = q.client.clone();
    // Rounded up to a plane, so that nearby cache lengths share one compiled kernel.
    let blocks = max_len.div_ceil(selection.block_size).max(1).next_multiple_of(SELECTION_LANES);
    let shared = capabilities(&client).shared_bytes.min(SELECTION_SHARED);
    let planes = (1..=PLANES).rev().find(|&p| shared_bytes(p, blocks, g, d_k, d_v, n) <= shared).unwrap_or_else(|| {
        panic!(
            "cache too long for the decode step on this device: {} selection blocks need {} KiB of shared \
                 memory, the device gives a cube {} KiB",
            max_len.div_ceil(selection.block_size),
            shared_bytes(1, blocks, g, d_k, d_v, n) / 1024,
            shared / 1024
        )
    });
    let output =
        || empty_device_contiguous_dtype::<R>(client.clone(), q.device.clone(), Shape::new([b, 1, h_q, d_v]), q.dtype);
    let outputs = [output(), output(), output()];
    let list = empty_device_contiguous_dtype::<R>(client.clone(), q.device.clone(), Shape::new([b, 1, h_kv, n]), int);
    let dim = CubeDim::new_2d(SELECTION_LANES as u32, planes as u32);
    let count = calculate_cube_count_elemwise(&client, b * h_kv * dim.num_elems() as usize, dim);
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
        blocks,
        n,
        vector,
        planes,
        [q.dtype.into(), int.into()],
    );
    (outputs, list)
}
