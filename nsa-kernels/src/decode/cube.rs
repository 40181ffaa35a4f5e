//! `CubeBackend`: the step as the kernels of [`crate::kernel::decode`]: the branches' keys split
//! in tiles over many cubes, then merged.

use burn::tensor::DType;
use burn_cubecl::element::BoolElement;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{CubeBackend, CubeRuntime, FloatElement, IntElement};
use cubecl::prelude::*;

use super::{
    linear_launch, write, DecodeAttentionBackend, DecodeBranches, DecodeStep, DecodeWrite, DecodeWritten, StepLinear,
};
use crate::buffers::empty_together;
use crate::kernel::decode::merge::{decode_merge, MERGE_UNITS};
use crate::kernel::decode::select::decode_select;
use crate::kernel::decode::tiles::{decode_selected_tiles, decode_tiles};
use crate::kernel::decode::StepExtentLaunch;
use crate::sparse::launch::{capabilities, planes_of_32};
use crate::sparse::tiling::{SELECTION_LANES, SELECTION_SHARED};
use crate::sparse::Selection;
use crate::tile_sizes::{DECODE_TILE, DECODE_UNITS};

impl<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement> DecodeAttentionBackend
    for CubeBackend<R, F, I, BT>
{
    fn has_decode_kernel() -> bool {
        true
    }

    fn decode_attention(step: DecodeStep<Self>) -> Option<DecodeBranches<Self>> {
        let DecodeStep { q, compressed, selected, window, positions, selection } = step;
        let caches = [compressed, selected, window].map(|pair| pair.map(into_contiguous));
        let (outputs, blocks) = launch(into_contiguous(q), caches, into_contiguous(positions), selection, I::dtype());
        Some(DecodeBranches { outputs, blocks })
    }

    fn decode_write(step: DecodeWrite<Self>) -> Option<DecodeWritten<Self>> {
        Some(write::launch(step))
    }

    fn decode_linear(step: StepLinear<Self>) -> CubeTensor<R> {
        let StepLinear { x, input, weight, residual } = step;
        linear_launch::launch(x, input, weight, residual)
    }
}

/// Planes of the selection's cube: its log-sum-exps, masses, block scores and top-n spread over
/// them.
const SELECT_PLANES: usize = 8;

/// Shared memory the selection's cube declares (bytes): the heads' log-sum-exps and their
/// exchange, the key masses, the block scores, the top-n's exchange rows and the chosen blocks.
fn select_bytes(keys: usize, blocks: usize, g: usize, n: usize) -> usize {
    let units = SELECT_PLANES * SELECTION_LANES;
    4 * (g + 2 * units + keys + blocks + 4 * units + n + 1)
}

/// The widest vector of `dtype` (at most 16 bytes) in which the tile kernels read the
/// (contiguous) caches: it divides `d_k` and `d_v`.
fn cache_vector<R: CubeRuntime>(client: &ComputeClient<R>, dtype: DType, dims: [usize; 2]) -> usize {
    let divides = |v: usize| dims.iter().all(|d| d.is_multiple_of(v));
    client.io_optimized_vector_sizes(dtype.size()).find(|v| divides(*v)).unwrap_or(1)
}

/// Launches the step over `q [B, 1, H_q, d_k]` and the caches `[B, H_kv, S, d]` (compressed,
/// selected, window; keys then values): the window's and compressed branch's tiles, the
/// selection, the selected blocks' tiles and the three branches' merge
/// ([`crate::kernel::decode`]). Panics with one line when the cache has more compressed keys
/// and selection blocks than a cube's shared memory holds (past a million positions at the
/// production shape).
fn launch<R: CubeRuntime>(
    q: CubeTensor<R>,
    caches: [[CubeTensor<R>; 2]; 3],
    positions: CubeTensor<R>,
    selection: Selection,
    int: DType,
) -> ([CubeTensor<R>; 3], CubeTensor<R>) {
    let [b, _, h_q, d_k] = q.meta.shape().dims::<4>();
    let [[compressed_k, compressed_v], [selected_k, selected_v], [window_k, window_v]] = caches;
    let [_, h_kv, max_len, d_v] = selected_v.meta.shape().dims::<4>();
    let (n_compressed, ring) = (compressed_k.meta.shape()[2], window_k.meta.shape()[2]);
    let (g, n) = (h_q / h_kv, selection.n);
    let (client, device) = (q.client.clone(), q.device.clone());
    let scale = 1.0 / (d_k as f32).sqrt();
    let (keys, blocks) = selection_extent(&client, n_compressed, max_len, selection, g);
    let vector = cache_vector(&client, q.dtype, [d_k, d_v]);
    let (tiles_c, tiles_w) = (n_compressed.div_ceil(DECODE_TILE), ring.div_ceil(DECODE_TILE));
    let tiles_s = n * selection.block_size.div_ceil(DECODE_TILE);
    let output = (vec![b, 1, h_q, d_v], q.dtype);
    // One allocation for the step's outputs and scratch. The scratch's memory then lives as long
    // as the block lists, which a decode loop drops with the step.
    let [o_compressed, o_selected, o_window, list, partials, scores] = empty_together(
        &client,
        &device,
        [
            output.clone(),
            output.clone(),
            output,
            (vec![b, 1, h_kv, n], int),
            (vec![b * h_kv, tiles_c + tiles_w + tiles_s, g, d_v + 2], DType::F32),
            (vec![b * h_kv, n_compressed.max(1), g], DType::F32),
        ],
    );
    let outputs = [o_compressed, o_selected, o_window];
    let dtypes = [q.dtype.into(), int.into()];
    let tile_dim = CubeDim::new_1d(DECODE_UNITS as u32);
    let tiles = tiles_c + tiles_w + tiles_s;
    let extent = Extent { groups: b * h_kv, h_kv, n_compressed, ring, max_len, tiles, n };

    decode_tiles::launch::<R>(
        &client,
        CubeCount::new_2d(extent.first_selected() as u32, extent.groups as u32),
        tile_dim,
        vector,
        q.clone().into_array_arg(),
        compressed_k.into_array_arg(),
        compressed_v.into_array_arg(),
        window_k.into_array_arg(),
        window_v.into_array_arg(),
        positions.clone().into_array_arg(),
        partials.clone().into_array_arg(),
        scores.clone().into_array_arg(),
        extent.arg(),
        scale,
        selection.length,
        selection.stride,
        g,
        d_k,
        d_v,
        vector,
        dtypes,
    );
    let step = StepLaunch { vector, scale, g, d_k, d_v, dtypes, extent };
    launch_select(&client, [&partials, &scores], &positions, &list, selection, SelectExtent { keys, blocks }, step);
    launch_selected(&client, q, [selected_k, selected_v], &positions, &list, &partials, selection, step);
    launch_merge(&client, partials, positions, outputs.clone(), selection, step);
    (outputs, list)
}

/// Shared-memory extent of the selection's cube for a cache of `n_compressed` compressed keys
/// and `max_len` positions: the keys and blocks it holds, rounded up to a plane (so that nearby
/// cache lengths share one compiled kernel). Panics with one line when they do not fit.
fn selection_extent<R: CubeRuntime>(
    client: &ComputeClient<R>,
    n_compressed: usize,
    max_len: usize,
    selection: Selection,
    g: usize,
) -> (usize, usize) {
    let n = selection.n;
    let keys = n_compressed.max(1).next_multiple_of(SELECTION_LANES);
    let blocks = max_len.div_ceil(selection.block_size).max(1).next_multiple_of(SELECTION_LANES);
    let shared = capabilities(client).shared_bytes.min(SELECTION_SHARED);
    if select_bytes(keys, blocks, g, n) > shared {
        panic!(
            "cache too long for the decode step on this device: {n_compressed} compressed keys and {} selection \
             blocks need {} KiB of shared memory, the device gives a cube {} KiB",
            max_len.div_ceil(selection.block_size),
            select_bytes(keys, blocks, g, n) / 1024,
            shared / 1024
        )
    }
    (keys, blocks)
}

/// What a step's launches share.
#[derive(Clone, Copy)]
struct StepLaunch {
    vector: usize,
    scale: f32,
    g: usize,
    d_k: usize,
    d_v: usize,
    dtypes: [StorageType; 2],
    extent: Extent,
}

/// The step's extents ([`crate::kernel::decode::StepExtent`]), as the host holds them.
#[derive(Clone, Copy)]
struct Extent {
    groups: usize,
    h_kv: usize,
    n_compressed: usize,
    ring: usize,
    max_len: usize,
    tiles: usize,
    n: usize,
}

impl Extent {
    /// The first selected tile of a group's partials: the compressed branch's tiles and the
    /// window's come before it.
    fn first_selected(self) -> usize {
        self.n_compressed.div_ceil(DECODE_TILE) + self.ring.div_ceil(DECODE_TILE)
    }

    fn arg<R: CubeRuntime>(self) -> StepExtentLaunch<R> {
        let Extent { groups, h_kv, n_compressed, ring, max_len, tiles, n } = self;
        StepExtentLaunch::new(groups, h_kv, n_compressed, ring, max_len, tiles, n)
    }
}

/// The selected branch after the selection: the chosen blocks' tiles into `partials` after the
/// other branches' ([`Extent::first_selected`]).
#[allow(clippy::too_many_arguments)]
fn launch_selected<R: CubeRuntime>(
    client: &ComputeClient<R>,
    q: CubeTensor<R>,
    [selected_k, selected_v]: [CubeTensor<R>; 2],
    positions: &CubeTensor<R>,
    list: &CubeTensor<R>,
    partials: &CubeTensor<R>,
    selection: Selection,
    launch: StepLaunch,
) {
    let StepLaunch { vector, scale, g, d_k, d_v, dtypes, extent } = launch;
    let first = extent.first_selected();
    decode_selected_tiles::launch::<R>(
        client,
        CubeCount::new_2d((extent.tiles - first) as u32, extent.groups as u32),
        CubeDim::new_1d(DECODE_UNITS as u32),
        vector,
        q.into_array_arg(),
        selected_k.into_array_arg(),
        selected_v.into_array_arg(),
        positions.clone().into_array_arg(),
        list.clone().into_array_arg(),
        partials.clone().into_array_arg(),
        extent.arg(),
        scale,
        first,
        selection.block_size,
        g,
        d_k,
        d_v,
        vector,
        dtypes,
    );
}

/// The three branches' merges, one cube per `(b, hk, h, branch)`, into `outputs`.
fn launch_merge<R: CubeRuntime>(
    client: &ComputeClient<R>,
    partials: CubeTensor<R>,
    positions: CubeTensor<R>,
    [o_compressed, o_selected, o_window]: [CubeTensor<R>; 3],
    selection: Selection,
    launch: StepLaunch,
) {
    let StepLaunch { g, d_v, dtypes, extent, .. } = launch;
    decode_merge::launch::<R>(
        client,
        CubeCount::new_2d((extent.groups * g) as u32, 3),
        CubeDim::new_1d(MERGE_UNITS as u32),
        partials.into_array_arg(),
        positions.into_array_arg(),
        o_compressed.into_array_arg(),
        o_selected.into_array_arg(),
        o_window.into_array_arg(),
        extent.arg(),
        extent.n_compressed,
        extent.ring,
        selection.length,
        selection.stride,
        g,
        d_v,
        dtypes,
    );
}

/// The selection's extent ([`selection_extent`]).
struct SelectExtent {
    keys: usize,
    blocks: usize,
}

/// The selection after the tiles: the compressed branch's log-sum-exps, the block scores and
/// the top-n into `list`.
fn launch_select<R: CubeRuntime>(
    client: &ComputeClient<R>,
    [partials, scores]: [&CubeTensor<R>; 2],
    positions: &CubeTensor<R>,
    list: &CubeTensor<R>,
    selection: Selection,
    extent: SelectExtent,
    launch: StepLaunch,
) {
    let StepLaunch { g, d_v, dtypes, extent: sizes, .. } = launch;
    let SelectExtent { keys, blocks } = extent;
    decode_select::launch::<R>(
        client,
        CubeCount::new_1d(sizes.groups as u32),
        CubeDim::new_2d(SELECTION_LANES as u32, SELECT_PLANES as u32),
        partials.clone().into_array_arg(),
        scores.clone().into_array_arg(),
        positions.clone().into_array_arg(),
        list.clone().into_array_arg(),
        sizes.arg(),
        selection.length,
        selection.stride,
        selection.block_size,
        g,
        d_v,
        keys,
        blocks,
        selection.n,
        SELECT_PLANES,
        planes_of_32(client),
        dtypes[1],
    );
}
