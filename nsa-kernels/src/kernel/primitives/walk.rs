//! The query rows a key-side cube walks ([`KeyCube`]: a window's rows after its keys, or a
//! selected block's listed rows), staged a chunk at a time by asynchronous copies (`cp.async`)
//! into one of two buffers, so that the next chunk's copies fly while the current one is
//! computed. A chunk is `rows` walked rows `first..first + count`; rows past `count` copy the
//! last real row (finite values, which the kernels mask). The caller commits a chunk's copies
//! to its buffer's barrier ([`TileBarriers`]) and waits on it before
//! reading.

use cubecl::prelude::barrier::copy_async;
use cubecl::prelude::barrier::Barrier;
use cubecl::prelude::*;

use super::key_cube::KeyCube;
use super::layout::VECTOR;
use super::query_cube::QueryCube;
use super::rows::offset3;
use super::staging::copy_rows_async;
use crate::tiling::storage_stride;

/// Starts the copies of the chunk's rows of `src` (q or dO, `[B, T, H_q, d]`) to element `at`
/// of `staged`, row stride [`storage_stride`]`(d)`.
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn copy_walked_rows<F: Float, N: Size>(
    src: &Tensor<Vector<F, N>>,
    staged: &mut SharedMemory<Vector<F, N>>,
    entries: &Tensor<u32>,
    cube: &KeyCube,
    first: usize,
    count: usize,
    at: usize,
    #[comptime] window: bool,
    #[comptime] rows: usize,
    #[comptime] d: usize,
    #[comptime] planes: usize,
) {
    let stride = comptime!(storage_stride(d));
    let units = comptime!(planes * 32);
    let per_row = comptime!(d / VECTOR);
    let total = comptime!(rows * per_row);
    let g = comptime!(cube.g);
    // The strides are read once, in vectors (a row is whole vectors): each copy is an asm
    // statement that clobbers memory, so a stride read at the copy is a fresh metadata load
    // per copy.
    let (row_stride, head_stride) = (src.stride(1) / VECTOR, src.stride(2) / VECTOR);
    let heads = (cube.b * src.stride(0)) / VECTOR + cube.hk * g * head_stride;
    #[unroll]
    for step in 0..total.div_ceil(units) {
        let idx = UNIT_POS as usize + step * units;
        if idx < total {
            let (i, c) = (idx / per_row, idx % per_row);
            let row = first + min(i, count - 1);
            let t = cube.query_of(entries, row, window);
            let from = heads + t * row_stride + (row % g) * head_stride + c;
            let to = (at + i * stride) / VECTOR + c;
            copy_async(&src.slice(from, from + 1), &mut staged.slice_mut(to, to + 1), VECTOR as u32);
        }
    }
}

/// Stores the chunk's query positions to `positions[slot * rows..]` (plain stores: a
/// selection's come from the list, read once per row).
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn store_walked_positions(
    entries: &Tensor<u32>,
    cube: &KeyCube,
    positions: &mut SharedMemory<u32>,
    first: usize,
    count: usize,
    slot: usize,
    #[comptime] window: bool,
    #[comptime] rows: usize,
    #[comptime] planes: usize,
) {
    let units = comptime!(planes * 32);
    #[unroll]
    for step in 0..comptime!(rows.div_ceil(units)) {
        let i = UNIT_POS as usize + step * units;
        if i < rows {
            let t = cube.query_of(entries, first + min(i, count - 1), window);
            positions[slot * rows + i] = t as u32;
        }
    }
}

/// Starts the copies of the chunk's `lse` and `delta` to `stats[slot * 2 rows..]` (`[lse;
/// rows]`, then `[delta; rows]`), at the positions this unit stored by
/// [`store_walked_positions`] (the same units take the same rows, so no barrier is needed).
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn copy_walked_stats(
    lse: &Tensor<f32>,
    delta: &Tensor<f32>,
    cube: &KeyCube,
    positions: &SharedMemory<u32>,
    stats: &mut SharedMemory<f32>,
    first: usize,
    count: usize,
    slot: usize,
    #[comptime] rows: usize,
    #[comptime] planes: usize,
) {
    let units = comptime!(planes * 32);
    #[unroll]
    for step in 0..comptime!(rows.div_ceil(units)) {
        let i = UNIT_POS as usize + step * units;
        if i < rows {
            let row = first + min(i, count - 1);
            let t = positions[slot * rows + i] as usize;
            let stat = offset3::<f32>(lse, cube.b, t, cube.head_of(row));
            let to = slot * comptime!(2 * rows) + i;
            copy_async(&lse.slice(stat, stat + 1), &mut stats.slice_mut(to, to + 1), 1u32);
            copy_async(&delta.slice(stat, stat + 1), &mut stats.slice_mut(to + rows, to + rows + 1), 1u32);
        }
    }
}

/// What a backward pass walks per chunk: starts the copies of walked rows `first..first +
/// count` into the buffer of `slot` (0 or 1; buffers of `rows` q rows, then `rows` dO rows,
/// from element `base` of `staged`), stores their positions, starts the copies of their `lse`
/// and `delta`, and commits it all to the slot's barrier.
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn issue_gradient_rows<F: Float, N: Size>(
    q: &Tensor<Vector<F, N>>,
    grad_out: &Tensor<Vector<F, N>>,
    lse: &Tensor<f32>,
    delta: &Tensor<f32>,
    entries: &Tensor<u32>,
    cube: &KeyCube,
    staged: &mut SharedMemory<Vector<F, N>>,
    positions: &mut SharedMemory<u32>,
    stats: &mut SharedMemory<f32>,
    barriers: &TileBarriers,
    first: usize,
    count: usize,
    slot: usize,
    base: usize,
    #[comptime] window: bool,
    #[comptime] rows: usize,
    #[comptime] d_k: usize,
    #[comptime] d_v: usize,
    #[comptime] planes: usize,
) {
    let at = base + slot * comptime!(rows * (storage_stride(d_k) + storage_stride(d_v)));
    copy_walked_rows::<F, N>(q, staged, entries, cube, first, count, at, window, rows, d_k, planes);
    let do_at = at + comptime!(rows * storage_stride(d_k));
    copy_walked_rows::<F, N>(grad_out, staged, entries, cube, first, count, do_at, window, rows, d_v, planes);
    store_walked_positions(entries, cube, positions, first, count, slot, window, rows, planes);
    copy_walked_stats(lse, delta, cube, positions, stats, first, count, slot, rows, planes);
    barriers.commit(slot);
}

/// Starts the copies of the chunk's block slots (where the cube's block stands in each walked
/// row's query list: `slots` of the inverted index, laid out as `entries`) to
/// `block_slots[slot * rows..]` (4-byte `cp.async`, as [`copy_walked_stats`]).
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn copy_walked_slots(
    slots: &Tensor<u32>,
    cube: &KeyCube,
    block_slots: &mut SharedMemory<u32>,
    first: usize,
    count: usize,
    slot: usize,
    #[comptime] rows: usize,
    #[comptime] planes: usize,
) {
    let units = comptime!(planes * 32);
    #[unroll]
    for step in 0..comptime!(rows.div_ceil(units)) {
        let i = UNIT_POS as usize + step * units;
        if i < rows {
            let entry = cube.list_at + (first + min(i, count - 1)) / comptime!(cube.g);
            let to = slot * rows + i;
            copy_async(&slots.slice(entry, entry + 1), &mut block_slots.slice_mut(to, to + 1), 1u32);
        }
    }
}

/// What a selection's forward walks per chunk: starts the copies of listed rows `first..first
/// + count`'s q rows into the buffer of `slot` (buffers of `rows` q rows from element `base` of
/// `staged`), stores their positions, starts the copies of their block slots (`with_slots`),
/// and commits it all to the slot's barrier.
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn issue_query_rows<F: Float, N: Size>(
    q: &Tensor<Vector<F, N>>,
    entries: &Tensor<u32>,
    slots: &Tensor<u32>,
    cube: &KeyCube,
    staged: &mut SharedMemory<Vector<F, N>>,
    positions: &mut SharedMemory<u32>,
    block_slots: &mut SharedMemory<u32>,
    barriers: &TileBarriers,
    first: usize,
    count: usize,
    slot: usize,
    base: usize,
    #[comptime] with_slots: bool,
    #[comptime] rows: usize,
    #[comptime] d_k: usize,
    #[comptime] planes: usize,
) {
    let at = base + slot * comptime!(rows * storage_stride(d_k));
    copy_walked_rows::<F, N>(q, staged, entries, cube, first, count, at, false, rows, d_k, planes);
    store_walked_positions(entries, cube, positions, first, count, slot, false, rows, planes);
    if comptime!(with_slots) {
        copy_walked_slots(slots, cube, block_slots, first, count, slot, rows, planes);
    }
    barriers.commit(slot);
}

/// One barrier per staging buffer: a unit commits its copies into a buffer to that buffer's
/// barrier, and every unit waits on it before reading the buffer.
#[derive(CubeType)]
pub struct TileBarriers {
    pub first: Shared<Barrier>,
    pub second: Shared<Barrier>,
}

#[cube]
impl TileBarriers {
    pub fn new() -> TileBarriers {
        TileBarriers {
            first: Barrier::shared(CUBE_DIM, UNIT_POS == 0),
            second: Barrier::shared(CUBE_DIM, UNIT_POS == 0),
        }
    }

    /// Commits this unit's copies into the buffer at element `at` (0: the first; a buffer's
    /// slot, 0 or 1, names it as well).
    pub fn commit(&self, at: usize) {
        if at == 0 {
            self.first.commit_copy_async();
        } else {
            self.second.commit_copy_async();
        }
    }

    /// Waits until every unit's copies into the buffer at element `at` (or of slot `at`, as
    /// [`Self::commit`]) have landed.
    pub fn wait(&self, at: usize) {
        if at == 0 {
            self.first.arrive_and_wait();
        } else {
            self.second.arrive_and_wait();
        }
    }
}

/// Starts the copies of the key tile `first..first + count` (K rows at element `at`, V rows
/// after `key_tile` K rows) and commits them to the barrier of the buffer at `at` (0: the
/// first).
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn issue_tile<F: Float, N: Size>(
    k: &Tensor<Vector<F, N>>,
    v: &Tensor<Vector<F, N>>,
    staged: &mut SharedMemory<Vector<F, N>>,
    cube: &QueryCube,
    first: usize,
    count: usize,
    at: usize,
    barriers: &TileBarriers,
    #[comptime] d_k: usize,
    #[comptime] d_v: usize,
    #[comptime] key_tile: usize,
    #[comptime] planes: usize,
) {
    let ks = comptime!(storage_stride(d_k));
    let vs = comptime!(storage_stride(d_v));
    let units = comptime!(planes * 32);
    copy_rows_async::<F, N>(k, staged, at, cube.b, first, count, cube.hk, key_tile, d_k, ks, VECTOR, units);
    copy_rows_async::<F, N>(
        v,
        staged,
        at + key_tile * ks,
        cube.b,
        first,
        count,
        cube.hk,
        key_tile,
        d_v,
        vs,
        VECTOR,
        units,
    );
    barriers.commit(at);
}

/// The chunk after `first..first + count` in a walk that ends at `end`, `rows` at a time:
/// `(first, count)`, with count 0 past the end. Every pipelined walk steps by it: the kernel
/// copies the next chunk into the other buffer (computed into fresh variables, so nothing the
/// current chunk's compute reads changes under it), waits for the current one's copies, computes
/// it, and syncs the cube before the buffer is reused.
#[cube]
pub fn next_chunk(first: usize, count: usize, end: usize, #[comptime] rows: usize) -> (usize, usize) {
    let next = first + count;
    (next, select(next < end, min(end - min(next, end), rows), 0usize))
}
