//! Staging rows into shared memory: synchronous loads and `cp.async` copies.

use cubecl::prelude::barrier::copy_async;
use cubecl::prelude::*;

use super::layout::VECTOR;
use super::rows::offset3;
use crate::tile_sizes::MMA_TILE;

/// Stages rows `first..first + count` (at most `chunk`) of head `hk` of `src [B, T, H, d]` at
/// `at` of `tile` (`[chunk, stride]`, converted to `E`), all units of the cube cooperating with
/// coalesced reads. Rows past `count` are zero; padding columns are left as they are.
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn stage_rows<F: Float, E: Float>(
    src: &Tensor<F>,
    tile: &mut SharedMemory<E>,
    at: usize,
    b: usize,
    first: usize,
    count: usize,
    hk: usize,
    #[comptime] chunk: usize,
    #[comptime] d: usize,
    #[comptime] stride: usize,
) {
    let mut idx = UNIT_POS as usize;
    while idx < chunk * d {
        let row = idx / d;
        let mut value = E::new(0.0);
        if row < count {
            value = E::cast_from(src[offset3::<F>(src, b, first + row, hk) + idx % d]);
        }
        tile[at + row * stride + idx % d] = value;
        idx += CUBE_DIM as usize;
    }
}

/// [`stage_rows`] with 16-byte loads: rows `first..first + count` of head `hk` of `src`
/// (vectors of `vector` elements) at element `at` of `tile` (row stride `stride` elements, a
/// whole number of vectors), `chunk` rows in all; units `unit` of `units` cooperate (a cube's,
/// or a plane's).
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn stage_vector_rows<F: Float, N: Size>(
    src: &Tensor<Vector<F, N>>,
    tile: &mut SharedMemory<Vector<F, N>>,
    at: usize,
    b: usize,
    first: usize,
    count: usize,
    hk: usize,
    #[comptime] chunk: usize,
    #[comptime] d: usize,
    #[comptime] stride: usize,
    #[comptime] vector: usize,
    unit: usize,
    units: usize,
) {
    let per_row = comptime!(d / vector);
    let mut idx = unit;
    while idx < chunk * per_row {
        let (row, c) = (idx / per_row, idx % per_row);
        let mut value = Vector::<F, N>::new(F::new(0.0));
        if row < count {
            value = src[offset3::<Vector<F, N>>(src, b, first + row, hk) / vector + c];
        }
        tile[(at + row * stride) / vector + c] = value;
        idx += units;
    }
}

/// Stages the query rows `(positions[i], hk * g + (row_first + i) % g)`, `i < count`, of
/// `src [B, T, H_q, d]` at `at` of `tile` (`[chunk, stride]`, converted to `E`); rows past
/// `count` are zero.
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn stage_listed_rows<F: Float, E: Float>(
    src: &Tensor<F>,
    tile: &mut SharedMemory<E>,
    at: usize,
    positions: &SharedMemory<u32>,
    b: usize,
    hk: usize,
    g: usize,
    row_first: usize,
    count: usize,
    #[comptime] chunk: usize,
    #[comptime] d: usize,
    #[comptime] stride: usize,
) {
    let mut idx = UNIT_POS as usize;
    while idx < chunk * d {
        let i = idx / d;
        let mut value = E::new(0.0);
        if i < count {
            let h = hk * g + (row_first + i) % g;
            value = E::cast_from(src[offset3::<F>(src, b, positions[i] as usize, h) + idx % d]);
        }
        tile[at + i * stride + idx % d] = value;
        idx += CUBE_DIM as usize;
    }
}

/// [`stage_listed_rows`] with 16-byte loads (`src` as vectors of `vector` elements; `at` and
/// `stride` in elements, whole vectors).
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn stage_listed_vector_rows<F: Float, N: Size>(
    src: &Tensor<Vector<F, N>>,
    tile: &mut SharedMemory<Vector<F, N>>,
    at: usize,
    positions: &SharedMemory<u32>,
    b: usize,
    hk: usize,
    g: usize,
    row_first: usize,
    count: usize,
    #[comptime] chunk: usize,
    #[comptime] d: usize,
    #[comptime] stride: usize,
    #[comptime] vector: usize,
) {
    let per_row = comptime!(d / vector);
    let mut idx = UNIT_POS as usize;
    while idx < chunk * per_row {
        let (i, c) = (idx / per_row, idx % per_row);
        let mut value = Vector::<F, N>::new(F::new(0.0));
        if i < count {
            let h = hk * g + (row_first + i) % g;
            value = src[offset3::<Vector<F, N>>(src, b, positions[i] as usize, h) / vector + c];
        }
        tile[(at + i * stride) / vector + c] = value;
        idx += CUBE_DIM as usize;
    }
}

/// Issues asynchronous 16-byte copies (`cp.async`, CUDA) of rows `first..first + count` of `src`
/// at `(b, ·, hk)`, `d` columns, to `tile` at element `at` (row stride `stride`; `rows` rows,
/// those past `count` copies of a real row: callers mask them), by the cube's `units` units.
/// Nothing waits here: the caller
/// commits the copies to a barrier and waits on it only when it needs the rows, so the copies
/// of the next tile fly while the current one is computed, and no registers hold them.
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn copy_rows_async<F: Float, N: Size>(
    src: &Tensor<Vector<F, N>>,
    tile: &mut SharedMemory<Vector<F, N>>,
    at: usize,
    b: usize,
    first: usize,
    count: usize,
    hk: usize,
    #[comptime] rows: usize,
    #[comptime] d: usize,
    #[comptime] stride: usize,
    #[comptime] vector: usize,
    #[comptime] units: usize,
) {
    let per_row = comptime!(d / vector);
    let total = comptime!(rows * per_row);
    let t_last = src.shape(1) - 1;
    // Shape and strides read once, in vectors: each copy is an asm statement that clobbers
    // memory, so a read at the copy is a fresh metadata load per copy.
    let row_stride = src.stride(1) / vector;
    let head = offset3::<Vector<F, N>>(src, b, 0usize, hk) / vector;
    #[unroll]
    for i in 0..total.div_ceil(units) {
        let idx = UNIT_POS as usize + i * units;
        if idx < total {
            let (row, c) = (idx / per_row, idx % per_row);
            // Rows past `count` copy a real row (the last one), finite, which the kernels mask.
            let from = head + min(first + min(row, count - 1), t_last) * row_stride + c;
            let to = (at + row * stride) / vector + c;
            copy_async(&src.slice(from, from + 1), &mut tile.slice_mut(to, to + 1), vector as u32);
        }
    }
}

/// Stages the cube's query rows `[16 * planes, stride]` at element 0 of `staged` (row `r` is
/// query `t0 + r / g`, head `hk * g + r % g`; rows past `rows` or the sequence are zero), all
/// units cooperating with 16-byte loads.
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn stage_query_rows<F: Float, N: Size>(
    q: &Tensor<Vector<F, N>>,
    staged: &mut SharedMemory<Vector<F, N>>,
    b: usize,
    t0: usize,
    hk: usize,
    g: usize,
    #[comptime] rows: usize,
    #[comptime] planes: usize,
    #[comptime] d: usize,
    #[comptime] stride: usize,
) {
    let t_len = q.shape(1);
    let per_row = comptime!(d / VECTOR);
    let mut idx = UNIT_POS as usize;
    while idx < planes * MMA_TILE * per_row {
        let (r, c) = (idx / per_row, idx % per_row);
        let t = t0 + r / g;
        let mut value = Vector::<F, N>::new(F::new(0.0));
        if r < rows && t < t_len {
            value = q[offset3::<Vector<F, N>>(q, b, t, hk * g + r % g) / VECTOR + c];
        }
        staged[(r * stride) / VECTOR + c] = value;
        idx += CUBE_DIM as usize;
    }
}
