//! Building blocks shared by the kernels: cube decoding, key ranges, and row slices.
//!
//! A row vector of length `d` split over `parts` units gives unit `part` the elements
//! `part, part + parts, part + 2 parts, ...` ("its slice"). Interleaving rather than contiguous
//! halves makes the `parts` units of a row read consecutive shared-memory words, which sit in
//! different banks. The slice helpers take the tiling's `unroll` (see
//! [`crate::sparse::tiling::Unroll`]).

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

/// The first key query `t` of batch row `b` may attend: its document's start in `starts`
/// (`[B, T]`, [`crate::Documents`]), or 0 without documents (`starts` is then never read).
#[cube]
pub fn document_start<I: Int>(starts: &Tensor<I>, b: usize, t: usize, #[comptime] documents: bool) -> usize {
    let mut first = 0usize;
    if documents {
        first = start_at::<I>(starts, b, t);
    }
    first
}

/// [`document_start`] behind a run-time flag (`documents` nonzero): one compile serves a kernel
/// with and without documents, at the cost of a uniform branch. The portable kernels take this
/// one, so a packed run on WGPU (lavapipe in CI compiles each kernel variant for seconds to
/// minutes) reuses the kernels a stream run compiled; the tensor-core kernels keep the
/// compile-time flag, since their unmasked path must stay free of document work.
#[cube]
pub fn document_start_if<I: Int>(starts: &Tensor<I>, b: usize, t: usize, documents: u32) -> usize {
    let mut first = 0usize;
    if documents != 0 {
        first = start_at::<I>(starts, b, t);
    }
    first
}

/// Where the queries that may attend key `s` of batch row `b` end: the first position after `s`
/// whose document starts after `s`, or `t_len` without documents (`starts` is then never read).
/// A key cube walks its rows only up to there: the rows after are later documents', which a
/// dense layer (a window as long as the row) would otherwise walk to `T`.
#[cube]
pub fn document_end<I: Int>(
    starts: &Tensor<I>,
    b: usize,
    s: usize,
    t_len: usize,
    #[comptime] documents: bool,
) -> usize {
    let mut end = t_len;
    if documents {
        end = search_document_end::<I>(starts, b, s, t_len);
    }
    end
}

/// [`document_end`] behind a run-time flag, for the portable kernels (see [`document_start_if`]).
#[cube]
pub fn document_end_if<I: Int>(starts: &Tensor<I>, b: usize, s: usize, t_len: usize, documents: u32) -> usize {
    let mut end = t_len;
    if documents != 0 {
        end = search_document_end::<I>(starts, b, s, t_len);
    }
    end
}

/// The first position in `(s, t_len)` whose document starts after `s`, else `t_len`: a binary
/// search, since the starts of a row never decrease.
#[cube]
fn search_document_end<I: Int>(starts: &Tensor<I>, b: usize, s: usize, t_len: usize) -> usize {
    let mut lo = s + 1;
    let mut hi = t_len;
    while lo < hi {
        let mid = (lo + hi) / 2;
        if start_at::<I>(starts, b, mid) > s {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    lo
}

/// `starts[b, t]`: the start of the document holding position `t` of row `b`.
#[cube]
fn start_at<I: Int>(starts: &Tensor<I>, b: usize, t: usize) -> usize {
    u32::cast_from(starts[b * starts.stride(0) + t * starts.stride(1)]) as usize
}

/// The document starts of one batch row, for kernels that look up the start of many queries
/// (a key cube's walked rows): [`document_start`] with the tensor, row and flag held.
#[derive(CubeType, Clone)]
pub struct RowStarts<I: Int> {
    starts: Tensor<I>,
    b: usize,
    #[cube(comptime)]
    documents: bool,
}

#[cube]
impl<I: Int> RowStarts<I> {
    // `clone()` of a handle: see `chunk_copies`.
    #[allow(clippy::clone_on_copy)]
    pub fn new(starts: &Tensor<I>, b: usize, #[comptime] documents: bool) -> RowStarts<I> {
        RowStarts::<I> { starts: starts.clone(), b, documents }
    }

    /// The first key query `t` may attend (0 without documents).
    pub fn of(&self, t: usize) -> usize {
        let documents = comptime!(self.documents);
        document_start::<I>(&self.starts, self.b, t, documents)
    }
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
    #[comptime] unroll: bool,
) -> Array<f32> {
    let mut row = Array::<f32>::new(len / parts);
    #[unroll(unroll)]
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
    #[comptime] unroll: bool,
) {
    #[unroll(unroll)]
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
    #[comptime] unroll: bool,
) {
    let mut inv = 0.0f32;
    let mut row_lse = f32::new(NEG_LARGE);
    if sum > 0.0f32 {
        inv = 1.0f32 / sum;
        row_lse = row_max + sum.ln();
    }
    store_slice::<F>(out, offset3::<F>(out, b, t, h), part, acc, inv, d_v, parts, unroll);
    if part == 0usize {
        lse[offset3::<f32>(lse, b, t, h)] = row_lse;
    }
}

/// An f32 slice of zeros.
#[cube]
pub fn zero_slice(#[comptime] len: usize, #[comptime] parts: usize, #[comptime] unroll: bool) -> Array<f32> {
    let mut row = Array::<f32>::new(len / parts);
    #[unroll(unroll)]
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
    #[comptime] unroll: bool,
) -> f32 {
    let mut sum = 0.0f32;
    #[unroll(unroll)]
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
    #[comptime] unroll: bool,
) {
    #[unroll(unroll)]
    for i in 0..len / parts {
        acc[i] += weight * tile[base + i * parts + part];
    }
}

/// `slice . other` of two register slices.
#[cube]
pub fn dot_slices(
    a: &Array<f32>,
    b: &Array<f32>,
    #[comptime] len: usize,
    #[comptime] parts: usize,
    #[comptime] unroll: bool,
) -> f32 {
    let mut sum = 0.0f32;
    #[unroll(unroll)]
    for i in 0..len / parts {
        sum += a[i] * b[i];
    }
    sum
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
    #[comptime] unroll: bool,
) {
    sync_cube();
    let mut key = part;
    while key < chunk {
        let at = row * chunk + key;
        let mut sum = 0.0f32;
        #[unroll(unroll)]
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
    #[comptime] unroll: bool,
) -> Array<f32> {
    let mut dots = Array::<f32>::new(chunk);
    if comptime!(parts == 1) {
        #[unroll(unroll)]
        for i in 0..chunk {
            dots[i] = dot_shared(slice, tile, i * len, 0usize, len, 1usize, unroll);
        }
    } else {
        #[unroll(unroll)]
        for i in 0..chunk {
            partials[(row * chunk + i) * parts + part] = dot_shared(slice, tile, i * len, part, len, parts, unroll);
        }
        reduce_partials(partials, totals, row, part, chunk, parts, unroll);
        #[unroll(unroll)]
        for i in 0..chunk {
            dots[i] = totals[row * chunk + i];
        }
    }
    dots
}
