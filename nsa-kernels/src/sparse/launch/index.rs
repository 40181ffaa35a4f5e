//! The inverted block index of a selection on `CubeBackend`: for each `(b, h_kv, block)` the
//! query rows that listed it ([`crate::kernel::selection::index`] builds it). The key-major kernels walk
//! it, the forward's and the backward's alike, so it is built once per key set and carried in
//! [`crate::Keys::Selected`] as a [`crate::BlockIndex`] (its tensors in [`InvertedIndex`]'s
//! field order).

use burn::tensor::{DType, Shape};
use burn_cubecl::ops::numeric::{empty_device_contiguous_dtype, zeros_client};
use burn_cubecl::ops::reshape;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::prelude::*;
use cubecl::CubeDim;

use crate::kernel::primitives::key_cube::BlockListsLaunch;
use crate::kernel::selection::index as inverse;

/// Units per cube of the inverted-index kernels.
pub(crate) const UNITS_PER_CUBE: u32 = 128;
/// Queries per cube of the counting and filling kernels, and the shared tallies of their
/// first blocks (see [`inverse::count_selections`]; 8 KiB).
const INDEX_ROWS: usize = 64;
const HOT_BINS: usize = 2048;
/// Queries of a block's list one key cube takes: about what a window key cube walks (its 64
/// to 128 keys' `w + keys` queries), so the selection's key pass is as balanced as the window's.
pub(crate) const SEGMENT_QUERIES: usize = 512;

/// The queries that selected each block (see [`inverse`]); placeholders for a window.
#[derive(Clone, Debug)]
pub(crate) struct InvertedIndex<R: CubeRuntime> {
    pub offsets: CubeTensor<R>,
    pub counts: CubeTensor<R>,
    pub entries: CubeTensor<R>,
    /// Each entry's position in its query's block list (laid out as `entries`).
    pub slots: CubeTensor<R>,
    /// Segments of the block lists, one key cube each (see [`inverse`]).
    pub segment_base: CubeTensor<R>,
    pub segment_block: CubeTensor<R>,
    pub segment_total: CubeTensor<R>,
}

impl<R: CubeRuntime> InvertedIndex<R> {
    /// The block lists as the key kernels take them.
    pub fn lists(&self) -> BlockListsLaunch<R> {
        BlockListsLaunch::new(
            self.offsets.clone().into_tensor_arg(),
            self.counts.clone().into_tensor_arg(),
            self.entries.clone().into_tensor_arg(),
            self.segment_base.clone().into_tensor_arg(),
            self.segment_block.clone().into_tensor_arg(),
            self.segment_total.clone().into_tensor_arg(),
        )
    }

    /// The u32 tensors' shapes for `blocks` `[B, T, H_kv, n]` of `span`-key blocks, in field
    /// order.
    pub fn shapes(blocks: &Shape, span: usize) -> Vec<Shape> {
        let [b, t, h_kv, n] = blocks.dims::<4>();
        let n_blocks = t.div_ceil(span);
        let lists = Shape::new([b, h_kv, n_blocks]);
        let entries = Shape::new([b, h_kv, t * n]);
        vec![
            lists.clone(),
            lists.clone(),
            entries.clone(),
            entries,
            lists,
            Shape::new([b, h_kv, max_segments(t, n, n_blocks)]),
            Shape::new([b, h_kv]),
        ]
    }

    /// One 1-element buffer for all seven: a window's kernels never read them.
    pub fn placeholder(client: &ComputeClient<R>, device: &R::Device) -> Self {
        // Never read by a window's kernels, so not filled (a fill is a launch of its own).
        let placeholder =
            empty_device_contiguous_dtype::<R>(client.clone(), device.clone(), Shape::new([1, 1, 1]), DType::U32);
        Self::from_tensors(vec![placeholder; 7])
    }

    /// Counts, scans and fills the index of `blocks` (contiguous).
    pub fn build(blocks: &CubeTensor<R>, span: usize) -> Self {
        let (client, device) = (&blocks.client, &blocks.device);
        let [b, t, h_kv, _] = blocks.meta.shape().dims::<4>();
        let n_blocks = t.div_ceil(span);
        let [offsets_shape, counts_shape, entries_shape, slots_shape, base_shape, block_shape, total_shape] =
            <[Shape; 7]>::try_from(Self::shapes(&blocks.meta.shape().clone(), span)).expect("seven index tensors");
        let counts = zeros_contiguous::<R>(client, device, counts_shape.clone(), DType::U32);
        let cursor = zeros_contiguous::<R>(client, device, counts_shape, DType::U32);
        let empty = |shape| empty_device_contiguous_dtype::<R>(client.clone(), device.clone(), shape, DType::U32);
        let index = InvertedIndex {
            offsets: empty(offsets_shape),
            counts,
            entries: empty(entries_shape),
            slots: empty(slots_shape),
            segment_base: empty(base_shape),
            segment_block: empty(block_shape),
            segment_total: empty(total_shape),
        };
        let dim = CubeDim::new_1d(UNITS_PER_CUBE);
        let query_cubes = CubeCount::Static(t.div_ceil(INDEX_ROWS) as u32, b as u32, 1);
        let int_dtype = blocks.dtype;
        inverse::count_selections::launch::<R>(
            client,
            query_cubes.clone(),
            dim,
            blocks.clone().into_tensor_arg(),
            index.counts.clone().into_tensor_arg(),
            n_blocks as u32,
            INDEX_ROWS,
            HOT_BINS,
            int_dtype.into(),
        );
        inverse::scan_counts::launch::<R>(
            client,
            CubeCount::Static((b * h_kv) as u32, 1, 1),
            dim,
            index.counts.clone().into_tensor_arg(),
            index.offsets.clone().into_tensor_arg(),
            index.segment_base.clone().into_tensor_arg(),
            index.segment_block.clone().into_tensor_arg(),
            index.segment_total.clone().into_tensor_arg(),
            SEGMENT_QUERIES as u32,
            UNITS_PER_CUBE as usize,
        );
        inverse::fill_selections::launch::<R>(
            client,
            query_cubes,
            dim,
            blocks.clone().into_tensor_arg(),
            index.offsets.clone().into_tensor_arg(),
            cursor.into_tensor_arg(),
            index.entries.clone().into_tensor_arg(),
            index.slots.clone().into_tensor_arg(),
            INDEX_ROWS,
            HOT_BINS,
            int_dtype.into(),
        );
        index
    }

    pub fn into_tensors(self) -> Vec<CubeTensor<R>> {
        vec![
            self.offsets,
            self.counts,
            self.entries,
            self.slots,
            self.segment_base,
            self.segment_block,
            self.segment_total,
        ]
    }

    /// From [`Self::into_tensors`]' order.
    pub fn from_tensors(tensors: Vec<CubeTensor<R>>) -> Self {
        let [offsets, counts, entries, slots, segment_base, segment_block, segment_total] =
            <[CubeTensor<R>; 7]>::try_from(tensors).expect("an inverted index is seven tensors");
        InvertedIndex { offsets, counts, entries, slots, segment_base, segment_block, segment_total }
    }
}

/// Zeros, contiguous (see `Call::empty` in `cube.rs`): a rank-1 allocation has no rows to pad.
pub(crate) fn zeros_contiguous<R: CubeRuntime>(
    client: &ComputeClient<R>,
    device: &R::Device,
    shape: Shape,
    dtype: DType,
) -> CubeTensor<R> {
    let flat = zeros_client::<R>(client.clone(), device.clone(), Shape::new([shape.num_elements()]), dtype);
    reshape(flat, shape)
}

/// Most segments one `(b, hk)` can have: `sum_j ceil(count_j / SEGMENT_QUERIES)` over blocks
/// whose counts add up to at most `T * n`.
fn max_segments(t: usize, n: usize, n_blocks: usize) -> usize {
    (t * n).div_ceil(SEGMENT_QUERIES) + n_blocks
}
