//! What a pipelined walk ([`super::walk`]) copies per chunk, one [`ChunkCopies`] per kind of
//! walk: a window's key tiles ([`KeyTiles`]), a backward's walked q and dO rows with their
//! statistics ([`GradientRows`]), and a selection forward's listed q rows ([`ListedQueryRows`]).
//! Each holds handles to the inputs and to the shared memory it stages into (the kernel's
//! compute reads the same memory through its own handles).
// Handles are taken by `clone()`: the plain types are `Copy`, but what the kernels compile is
// the expansion, whose handles are not.
#![allow(clippy::clone_on_copy)]

use cubecl::prelude::barrier::copy_async;
use cubecl::prelude::*;

use super::key_cube::KeyCube;
use super::layout::VECTOR;
use super::query_cube::QueryCube;
use super::rows::offset3;
use super::staging::copy_rows_async;
use super::walk::ChunkCopies;
use crate::tile_sizes::storage_stride;

/// A window's key tiles: per slot, `key_tile` K rows then `key_tile` V rows, slot 1's buffer
/// after slot 0's (from element 0 of `staged`).
#[derive(CubeType)]
pub struct KeyTiles<F: Float, N: Size> {
    k: Tensor<Vector<F, N>>,
    v: Tensor<Vector<F, N>>,
    staged: SharedMemory<Vector<F, N>>,
    cube: QueryCube,
    #[cube(comptime)]
    d_k: usize,
    #[cube(comptime)]
    d_v: usize,
    #[cube(comptime)]
    key_tile: usize,
    #[cube(comptime)]
    planes: usize,
}

#[cube]
impl<F: Float, N: Size> KeyTiles<F, N> {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        k: &Tensor<Vector<F, N>>,
        v: &Tensor<Vector<F, N>>,
        staged: &SharedMemory<Vector<F, N>>,
        cube: &QueryCube,
        #[comptime] d_k: usize,
        #[comptime] d_v: usize,
        #[comptime] key_tile: usize,
        #[comptime] planes: usize,
    ) -> KeyTiles<F, N> {
        KeyTiles::<F, N> {
            k: k.clone(),
            v: v.clone(),
            staged: staged.clone(),
            cube: cube.clone(),
            d_k,
            d_v,
            key_tile,
            planes,
        }
    }
}

#[cube]
impl<F: Float, N: Size> ChunkCopies for KeyTiles<F, N> {
    fn issue(this: &mut Self, first: usize, count: usize, slot: usize) {
        let (d_k, d_v, key_tile) = comptime!((this.d_k, this.d_v, this.key_tile));
        let ks = comptime!(storage_stride(d_k));
        let vs = comptime!(storage_stride(d_v));
        let units = comptime!(this.planes * 32);
        let at = slot * comptime!(key_tile * (ks + vs));
        let (b, hk) = (this.cube.b, this.cube.hk);
        copy_rows_async::<F, N>(&this.k, &mut this.staged, at, b, first, count, hk, key_tile, d_k, ks, VECTOR, units);
        let v_at = at + comptime!(key_tile * ks);
        copy_rows_async::<F, N>(&this.v, &mut this.staged, v_at, b, first, count, hk, key_tile, d_v, vs, VECTOR, units);
    }
}

/// A backward's walked rows: per slot, `rows` q rows then `rows` dO rows (slot 1's after slot
/// 0's, from element `base` of `staged`); their positions in `positions[slot * rows..]`, and
/// their `lse` then `delta` in `stats[slot * 2 rows..]`.
#[derive(CubeType)]
pub struct GradientRows<F: Float, N: Size> {
    q: Tensor<Vector<F, N>>,
    grad_out: Tensor<Vector<F, N>>,
    lse: Tensor<f32>,
    delta: Tensor<f32>,
    entries: Tensor<u32>,
    cube: KeyCube,
    staged: SharedMemory<Vector<F, N>>,
    positions: SharedMemory<u32>,
    stats: SharedMemory<f32>,
    #[cube(comptime)]
    base: usize,
    #[cube(comptime)]
    window: bool,
    #[cube(comptime)]
    rows: usize,
    #[cube(comptime)]
    d_k: usize,
    #[cube(comptime)]
    d_v: usize,
    #[cube(comptime)]
    planes: usize,
}

#[cube]
impl<F: Float, N: Size> GradientRows<F, N> {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        q: &Tensor<Vector<F, N>>,
        grad_out: &Tensor<Vector<F, N>>,
        lse: &Tensor<f32>,
        delta: &Tensor<f32>,
        entries: &Tensor<u32>,
        cube: &KeyCube,
        staged: &SharedMemory<Vector<F, N>>,
        positions: &SharedMemory<u32>,
        stats: &SharedMemory<f32>,
        #[comptime] base: usize,
        #[comptime] window: bool,
        #[comptime] rows: usize,
        #[comptime] d_k: usize,
        #[comptime] d_v: usize,
        #[comptime] planes: usize,
    ) -> GradientRows<F, N> {
        GradientRows::<F, N> {
            q: q.clone(),
            grad_out: grad_out.clone(),
            lse: lse.clone(),
            delta: delta.clone(),
            entries: entries.clone(),
            cube: cube.clone(),
            staged: staged.clone(),
            positions: positions.clone(),
            stats: stats.clone(),
            base,
            window,
            rows,
            d_k,
            d_v,
            planes,
        }
    }
}

#[cube]
impl<F: Float, N: Size> ChunkCopies for GradientRows<F, N> {
    fn issue(this: &mut Self, first: usize, count: usize, slot: usize) {
        let (window, rows, d_k, d_v, planes) = comptime!((this.window, this.rows, this.d_k, this.d_v, this.planes));
        let at = comptime!(this.base) + slot * comptime!(rows * (storage_stride(d_k) + storage_stride(d_v)));
        let (cube, entries) = (&this.cube, &this.entries);
        copy_walked_rows::<F, N>(&this.q, &mut this.staged, entries, cube, first, count, at, window, rows, d_k, planes);
        let do_at = at + comptime!(rows * storage_stride(d_k));
        copy_walked_rows::<F, N>(
            &this.grad_out,
            &mut this.staged,
            entries,
            cube,
            first,
            count,
            do_at,
            window,
            rows,
            d_v,
            planes,
        );
        store_walked_positions(entries, cube, &mut this.positions, first, count, slot, window, rows, planes);
        copy_walked_stats(
            &this.lse,
            &this.delta,
            cube,
            &this.positions,
            &mut this.stats,
            first,
            count,
            slot,
            rows,
            planes,
        );
    }
}

/// A selection forward's listed rows: per slot, `rows` q rows (slot 1's after slot 0's, from
/// element `base` of `staged`), their positions in `positions[slot * rows..]`, and with
/// `with_slots` where the cube's block stands in each row's query list in
/// `block_slots[slot * rows..]`.
#[derive(CubeType)]
pub struct ListedQueryRows<F: Float, N: Size> {
    q: Tensor<Vector<F, N>>,
    entries: Tensor<u32>,
    slots: Tensor<u32>,
    cube: KeyCube,
    staged: SharedMemory<Vector<F, N>>,
    positions: SharedMemory<u32>,
    block_slots: SharedMemory<u32>,
    #[cube(comptime)]
    base: usize,
    #[cube(comptime)]
    with_slots: bool,
    #[cube(comptime)]
    rows: usize,
    #[cube(comptime)]
    d_k: usize,
    #[cube(comptime)]
    planes: usize,
}

#[cube]
impl<F: Float, N: Size> ListedQueryRows<F, N> {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        q: &Tensor<Vector<F, N>>,
        entries: &Tensor<u32>,
        slots: &Tensor<u32>,
        cube: &KeyCube,
        staged: &SharedMemory<Vector<F, N>>,
        positions: &SharedMemory<u32>,
        block_slots: &SharedMemory<u32>,
        #[comptime] base: usize,
        #[comptime] with_slots: bool,
        #[comptime] rows: usize,
        #[comptime] d_k: usize,
        #[comptime] planes: usize,
    ) -> ListedQueryRows<F, N> {
        ListedQueryRows::<F, N> {
            q: q.clone(),
            entries: entries.clone(),
            slots: slots.clone(),
            cube: cube.clone(),
            staged: staged.clone(),
            positions: positions.clone(),
            block_slots: block_slots.clone(),
            base,
            with_slots,
            rows,
            d_k,
            planes,
        }
    }
}

#[cube]
impl<F: Float, N: Size> ChunkCopies for ListedQueryRows<F, N> {
    fn issue(this: &mut Self, first: usize, count: usize, slot: usize) {
        let (rows, d_k, planes) = comptime!((this.rows, this.d_k, this.planes));
        let at = comptime!(this.base) + slot * comptime!(rows * storage_stride(d_k));
        let (cube, entries) = (&this.cube, &this.entries);
        copy_walked_rows::<F, N>(&this.q, &mut this.staged, entries, cube, first, count, at, false, rows, d_k, planes);
        store_walked_positions(entries, cube, &mut this.positions, first, count, slot, false, rows, planes);
        if comptime!(this.with_slots) {
            copy_walked_slots(&this.slots, cube, &mut this.block_slots, first, count, slot, rows, planes);
        }
    }
}

/// Starts the copies of the chunk's rows of `src` (q or dO, `[B, T, H_q, d]`) to element `at`
/// of `staged`, row stride [`storage_stride`]`(d)`.
#[cube]
#[allow(clippy::too_many_arguments)]
fn copy_walked_rows<F: Float, N: Size>(
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
fn store_walked_positions(
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
fn copy_walked_stats(
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

/// Starts the copies of the chunk's block slots (where the cube's block stands in each walked
/// row's query list: `slots` of the inverted index, laid out as `entries`) to
/// `block_slots[slot * rows..]` (4-byte `cp.async`, as [`copy_walked_stats`]).
#[cube]
#[allow(clippy::too_many_arguments)]
fn copy_walked_slots(
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
