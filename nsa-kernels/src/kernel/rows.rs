//! Building blocks shared by the kernels: cube decoding, key ranges, and row slices.
//!
//! A row vector of length `d` split over `parts` units gives unit `part` the elements
//! `part, part + parts, part + 2 parts, ...` ("its slice"). Interleaving rather than contiguous
//! halves makes the `parts` units of a row read consecutive shared-memory words, which sit in
//! different banks.

use cubecl::prelude::barrier::copy_async;
use cubecl::prelude::*;

/// Stands in for `-inf` as the running maximum's start (WGSL has no infinity literal).
pub const NEG_LARGE: f32 = -1.0e30;

/// How many key ranges a query has: one window, or one per selection slot.
#[cube]
pub fn range_count<I: Int>(blocks: &Tensor<I>, #[comptime] window: bool) -> usize {
    let mut count = 1usize;
    if !window {
        count = blocks.shape(3);
    }
    count
}

/// Keys `[start, end)` of selection slot `r` of query `t`: block `blocks[slots + r]` of `span`
/// keys clamped causally to `t`. An unused slot (negative block) or a block wholly in the
/// future is the empty range.
#[cube]
pub fn block_range<I: Int>(blocks: &Tensor<I>, slots: usize, r: usize, t: usize, span: usize) -> (usize, usize) {
    let mut start = 0usize;
    let mut end = 0usize;
    let j = i32::cast_from(blocks[slots + r * blocks.stride(3)]);
    if j >= 0 {
        let first = u32::cast_from(j) as usize * span;
        if first <= t {
            start = first;
            end = first + span;
            if end > t + 1 {
                end = t + 1;
            }
        }
    }
    (start, end)
}

/// Whether query `t` attends key `s` (given that `s` is in one of the ranges walked for `t`):
/// causal, and inside the window when there is one.
#[cube]
pub fn attends(t: usize, s: usize, span: usize, #[comptime] window: bool) -> bool {
    let mut ok = s <= t;
    if window {
        ok = ok && s + span > t;
    }
    ok
}

/// The slice of row `base..base + len` of `src` owned by `part`, widened to f32 and scaled.
#[cube]
pub fn load_slice<F: Float>(
    src: &Tensor<F>,
    base: usize,
    part: usize,
    scale: f32,
    #[comptime] len: usize,
    #[comptime] parts: usize,
) -> Array<f32> {
    let mut row = Array::<f32>::new(len / parts);
    #[unroll]
    for i in 0..len / parts {
        row[i] = f32::cast_from(src[base + i * parts + part]) * scale;
    }
    row
}

/// Writes `scale * slice` to its places in row `base..base + len` of `dst`.
#[cube]
pub fn store_slice<F: Float>(
    dst: &mut Tensor<F>,
    base: usize,
    part: usize,
    slice: &Array<f32>,
    scale: f32,
    #[comptime] len: usize,
    #[comptime] parts: usize,
) {
    #[unroll]
    for i in 0..len / parts {
        dst[base + i * parts + part] = F::cast_from(slice[i] * scale);
    }
}

/// Ends a row's online softmax: writes `acc / sum` (this unit's slice) to the row `(b, t, h)` of
/// `out` and, from part 0, the row's log-sum-exp (`NEG_LARGE` and a zero row when it attended
/// nothing).
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn store_row_result<F: Float>(
    out: &mut Tensor<F>,
    lse: &mut Tensor<f32>,
    b: usize,
    t: usize,
    h: usize,
    part: usize,
    acc: &Array<f32>,
    row_max: f32,
    sum: f32,
    #[comptime] d_v: usize,
    #[comptime] parts: usize,
) {
    let mut inv = 0.0f32;
    let mut row_lse = f32::new(NEG_LARGE);
    if sum > 0.0f32 {
        inv = 1.0f32 / sum;
        row_lse = row_max + sum.ln();
    }
    store_slice::<F>(out, offset3::<F>(out, b, t, h), part, acc, inv, d_v, parts);
    if part == 0usize {
        lse[offset3::<f32>(lse, b, t, h)] = row_lse;
    }
}

/// An f32 slice of zeros.
#[cube]
pub fn zero_slice(#[comptime] len: usize, #[comptime] parts: usize) -> Array<f32> {
    let mut row = Array::<f32>::new(len / parts);
    #[unroll]
    for i in 0..len / parts {
        row[i] = 0.0f32;
    }
    row
}

/// `slice . row[part::parts]` for the row at `base` of a shared-memory tile.
#[cube]
pub fn dot_shared(
    slice: &Array<f32>,
    tile: &SharedMemory<f32>,
    base: usize,
    part: usize,
    #[comptime] len: usize,
    #[comptime] parts: usize,
) -> f32 {
    let mut sum = 0.0f32;
    #[unroll]
    for i in 0..len / parts {
        sum += slice[i] * tile[base + i * parts + part];
    }
    sum
}

/// `acc += weight * row[part::parts]` for the row at `base` of a shared-memory tile.
#[cube]
pub fn add_shared(
    acc: &mut Array<f32>,
    weight: f32,
    tile: &SharedMemory<f32>,
    base: usize,
    part: usize,
    #[comptime] len: usize,
    #[comptime] parts: usize,
) {
    #[unroll]
    for i in 0..len / parts {
        acc[i] += weight * tile[base + i * parts + part];
    }
}

/// `slice . other` of two register slices.
#[cube]
pub fn dot_slices(a: &Array<f32>, b: &Array<f32>, #[comptime] len: usize, #[comptime] parts: usize) -> f32 {
    let mut sum = 0.0f32;
    #[unroll]
    for i in 0..len / parts {
        sum += a[i] * b[i];
    }
    sum
}

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

/// Offset of element `[a, b, c, 0]` of a 4-d tensor, or `[a, b, c]` of a 3-d one.
#[cube]
pub fn offset3<E: CubePrimitive>(x: &Tensor<E>, a: usize, b: usize, c: usize) -> usize {
    a * x.stride(0) + b * x.stride(1) + c * x.stride(2)
}

/// Sums the `parts` partial values each unit of a row left in `partials` for the chunk's keys,
/// into `totals [rows * chunk]`: unit `part` of row `row` reduces keys `part, part + parts, ..`.
/// Called by every unit of the cube (it synchronises).
#[cube]
pub fn reduce_partials(
    partials: &SharedMemory<f32>,
    totals: &mut SharedMemory<f32>,
    row: usize,
    part: usize,
    #[comptime] chunk: usize,
    #[comptime] parts: usize,
) {
    sync_cube();
    let mut key = part;
    while key < chunk {
        let at = row * chunk + key;
        let mut sum = 0.0f32;
        #[unroll]
        for p in 0..parts {
            sum += partials[at * parts + p];
        }
        totals[at] = sum;
        key += parts;
    }
    sync_cube();
}

/// This unit's row dotted with each of the `chunk` staged rows of `tile` (row `i` at `i * len`):
/// whole dot products, the `parts` units of a split row exchanging partial sums through
/// `partials`/`totals`. Called by every unit of the cube when `parts > 1` (it synchronises).
#[cube]
pub fn chunk_dots(
    slice: &Array<f32>,
    tile: &SharedMemory<f32>,
    partials: &mut SharedMemory<f32>,
    totals: &mut SharedMemory<f32>,
    row: usize,
    part: usize,
    #[comptime] len: usize,
    #[comptime] chunk: usize,
    #[comptime] parts: usize,
) -> Array<f32> {
    let mut dots = Array::<f32>::new(chunk);
    if comptime!(parts == 1) {
        #[unroll]
        for i in 0..chunk {
            dots[i] = dot_shared(slice, tile, i * len, 0usize, len, 1usize);
        }
    } else {
        #[unroll]
        for i in 0..chunk {
            partials[(row * chunk + i) * parts + part] = dot_shared(slice, tile, i * len, part, len, parts);
        }
        reduce_partials(partials, totals, row, part, chunk, parts);
        #[unroll]
        for i in 0..chunk {
            dots[i] = totals[row * chunk + i];
        }
    }
    dots
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
