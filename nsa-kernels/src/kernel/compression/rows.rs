//! The compressed branch's row kernels: the few compressed keys make its score matrix small
//! (`T x N` per head, `N ~ T / stride`), so its products run as batched dense GEMMs on the
//! tensor cores ([`crate::compressed`]) and these kernels do what lies between them:
//!
//! - [`swap_middle_axes`] moves each head's rows between the layer's `[B, T, H, d]` and the
//!   products' one-matrix-per-head `[B, H, T, d]`, a whole 16-byte vector per unit.
//! - [`expand_heads`] lays each query head's copy of its KV head's keys (or values) out as one
//!   matrix of the batch, zero rows padding `N` to the products' width; [`add_leading_rows`]
//!   adds a query chunk's dK or dV share (over the keys it sees) to the sum, and [`sum_heads`]
//!   adds the group's heads back.
//! - [`compressed_probs`] turns a row of raw scores into the masked softmax (query `t` sees the
//!   blocks complete at `t`) and its log-sum-exp; [`compressed_grad_scores`] recomputes those
//!   probabilities from the log-sum-exp and gives the scores' gradient
//!   `p (dp - sum_j p_j dp_j) scale`.
//!
//! A row is served by [`ROW_UNITS`] units, each taking every `ROW_UNITS`-th column; their
//! partial maxima and sums meet in shared memory (no plane operations, so WGPU runs them too).

use cubecl::prelude::*;

use super::visible::visible_blocks;
use crate::kernel::primitives::rows::{offset3, NEG_LARGE};

/// Units per row of the row kernels. A row is short (`N` padded to 16: 128 columns at T = 2048),
/// so few units each take several columns: fewer partial sums to combine, more independent loads
/// per unit.
pub const ROW_UNITS: usize = 8;

/// `dst[a, y0 + y, x] = src[a, x0 + x, y]` (rows of `d`, both contiguous) for `y < y_len`,
/// `x < x_len`: the axes of `[A, X, Y, d]` swapped into `[A, Y, X, d]`, and a window of `X`
/// read or of `Y` written (a chunk of queries taken from the layer's `[B, T, H, d]`, or a
/// chunk's `[B, H, T, d]` rows put back). Indexed in vectors of `vector` elements (`vector`
/// divides `d`); one unit per vector of the window.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn swap_middle_axes<F: Float, N: Size>(
    src: &Tensor<Vector<F, N>>,
    dst: &mut Tensor<Vector<F, N>>,
    x0: u32,
    y0: u32,
    x_len: u32,
    y_len: u32,
    #[comptime] vector: usize,
    #[define(F)] _dtype: StorageType,
) {
    let per_row = dst.shape(3) / vector;
    let (x_len, y_len) = (x_len as usize, y_len as usize);
    let pos = ABSOLUTE_POS;
    if pos >= dst.shape(0) * y_len * x_len * per_row {
        terminate!();
    }
    let c = pos % per_row;
    let row = pos / per_row;
    let x = row % x_len;
    let y = (row / x_len) % y_len;
    let a = row / (x_len * y_len);
    let (src_x, src_y) = (src.shape(1), src.shape(2));
    let dst_y = dst.shape(1);
    dst[((a * dst_y + y0 as usize + y) * x_len + x) * per_row + c] =
        src[((a * src_x + x0 as usize + x) * src_y + y) * per_row + c];
}

/// `src [B, N, H_kv, d]` -> `dst [B * H_q, width, d]` (contiguous): matrix `b * H_q + h` holds
/// KV head `h / g`'s rows, then zero rows up to `width`.
#[cube(launch)]
pub fn expand_heads<F: Float>(
    src: &Tensor<F>,
    dst: &mut Tensor<F>,
    #[comptime] g: usize,
    #[define(F)] _dtype: StorageType,
) {
    let pos = ABSOLUTE_POS;
    if pos >= dst.len() {
        terminate!();
    }
    let (width, d) = (dst.shape(1), dst.shape(2));
    let c = pos % d;
    let i = (pos / d) % width;
    let bh = pos / (d * width);
    let h_q = src.shape(2) * g;
    let (b, hk) = (bh / h_q, (bh % h_q) / g);
    let mut value = F::new(0.0);
    if i < src.shape(1) {
        value = src[offset3::<F>(src, b, i, hk) + c * src.stride(3)];
    }
    dst[pos] = value;
}

/// `src [B * H_q, width, d]` (f32) -> `dst [B, N, H_kv, d]` (contiguous): each KV head's rows
/// summed over its group's `g` query heads.
#[cube(launch)]
pub fn sum_heads<F: Float>(
    src: &Tensor<f32>,
    dst: &mut Tensor<F>,
    #[comptime] g: usize,
    #[define(F)] _dtype: StorageType,
) {
    let pos = ABSOLUTE_POS;
    if pos >= dst.len() {
        terminate!();
    }
    let (n, h_kv, d) = (dst.shape(1), dst.shape(2), dst.shape(3));
    let width = src.shape(1);
    let c = pos % d;
    let hk = (pos / d) % h_kv;
    let i = (pos / (d * h_kv)) % n;
    let b = pos / (d * h_kv * n);
    let mut total = 0.0f32;
    #[unroll]
    for head in 0..g {
        total += src[((b * h_kv * g + hk * g + head) * width + i) * d + c];
    }
    dst[pos] = F::cast_from(total);
}

/// `acc [A, W, d] += part [A, w, d]` on the first `w <= W` rows of each matrix (f32, both
/// contiguous): a query chunk's dK or dV share, over the keys the chunk sees, added to the sum.
#[cube(launch)]
pub fn add_leading_rows(acc: &mut Tensor<f32>, part: &Tensor<f32>) {
    let pos = ABSOLUTE_POS;
    if pos >= part.len() {
        terminate!();
    }
    let (w, d) = (part.shape(1), part.shape(2));
    let a = pos / (w * d);
    let at = a * acc.shape(1) * d + pos % (w * d);
    acc[at] = acc[at] + part[pos];
}

/// Which row of a chunk's `[B * H_q, T_c, width]` (queries `t0..t0 + T_c`) a unit serves, and
/// where that row's statistics sit in `[B, T, H_q]`. Units past the last row serve it again and
/// write nothing.
#[derive(CubeType)]
struct ScoreRow {
    active: bool,
    lane: usize,
    /// The row's slot in the cube's shared partials.
    slot: usize,
    /// First element of the row.
    at: usize,
    stat: usize,
    /// Blocks the row's query sees (`p` is zero past them).
    visible: usize,
}

#[cube]
impl ScoreRow {
    fn new(scores: &Tensor<f32>, lse: &Tensor<f32>, t0: u32, length: u32, stride: u32, n: u32) -> ScoreRow {
        let (t_len, width, h_q) = (scores.shape(1), scores.shape(2), lse.shape(2));
        let rows = scores.shape(0) * t_len;
        let row = ABSOLUTE_POS / ROW_UNITS;
        let active = row < rows;
        let row = min(row, rows - 1);
        let (bh, t) = (row / t_len, t0 as usize + row % t_len);
        let (b, h) = (bh / h_q, bh % h_q);
        ScoreRow {
            active,
            lane: UNIT_POS as usize % ROW_UNITS,
            slot: UNIT_POS as usize / ROW_UNITS,
            at: row * width,
            stat: offset3::<f32>(lse, b, t, h),
            visible: visible_blocks(t, n as usize, length as usize, stride as usize),
        }
    }

    /// The probability of column `col`: `exp(s scale - shift)` where the row sees the block,
    /// else 0.
    fn prob(&self, scores: &Tensor<f32>, col: usize, scale: f32, shift: f32) -> f32 {
        let mut p = 0.0f32;
        if col < self.visible {
            p = (scores[self.at + col] * scale - shift).exp();
        }
        p
    }

    /// The maximum (`is_max`) or the sum of the row's units' `value`s, for every unit of the
    /// row. Every unit of the cube calls it (it synchronises the cube).
    fn combine(&self, partials: &mut SharedMemory<f32>, value: f32, #[comptime] is_max: bool) -> f32 {
        partials[self.slot * ROW_UNITS + self.lane] = value;
        sync_cube();
        let mut total = partials[self.slot * ROW_UNITS];
        #[unroll]
        for i in 1..ROW_UNITS {
            let other = partials[self.slot * ROW_UNITS + i];
            if comptime!(is_max) {
                total = max(total, other);
            } else {
                total += other;
            }
        }
        sync_cube();
        total
    }
}

/// Raw scores `q . k` `[B * H_q, T_c, width]` (f32) of queries `t0..t0 + T_c` -> probabilities
/// `probs` (same shape, the storage type; zero where masked) and their rows of
/// `lse [B, T, H_q]` (f32; `NEG_LARGE` for a row that sees no block). Query `t` sees blocks
/// `i < n` with `i * stride + length - 1 <= t`. Cube `ROW_UNITS * rows` units.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn compressed_probs<F: Float>(
    scores: &Tensor<f32>,
    probs: &mut Tensor<F>,
    lse: &mut Tensor<f32>,
    scale: f32,
    t0: u32,
    length: u32,
    stride: u32,
    n: u32,
    #[comptime] rows: usize,
    #[define(F)] _dtype: StorageType,
) {
    let row = ScoreRow::new(scores, lse, t0, length, stride, n);
    let mut partials = SharedMemory::<f32>::new(rows * ROW_UNITS);
    let width = scores.shape(2);

    let mut row_max = f32::new(NEG_LARGE);
    let mut col = row.lane;
    while col < row.visible {
        row_max = max(row_max, scores[row.at + col] * scale);
        col += ROW_UNITS;
    }
    let row_max = row.combine(&mut partials, row_max, true);
    let mut sum = 0.0f32;
    col = row.lane;
    while col < row.visible {
        sum += (scores[row.at + col] * scale - row_max).exp();
        col += ROW_UNITS;
    }
    let sum = row.combine(&mut partials, sum, false);

    let mut row_lse = f32::new(NEG_LARGE);
    if row.visible > 0 {
        row_lse = row_max + sum.ln();
    }
    if row.active {
        col = row.lane;
        while col < width {
            probs[row.at + col] = F::cast_from(row.prob(scores, col, scale, row_lse));
            col += ROW_UNITS;
        }
        if row.lane == 0 {
            lse[row.stat] = row_lse;
        }
    }
}

/// Raw scores and the probabilities' gradient `dp = dO . v` (`[B * H_q, T_c, width]`, f32, of
/// queries `t0..t0 + T_c`) and the forward's `lse` -> the raw scores' gradient `p (dp - sum_j p_j dp_j) scale` and the
/// probabilities `p` (both the storage type, zero where masked). Cube `ROW_UNITS * rows` units.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn compressed_grad_scores<F: Float>(
    scores: &Tensor<f32>,
    grad_probs: &Tensor<f32>,
    lse: &Tensor<f32>,
    grad_scores: &mut Tensor<F>,
    probs: &mut Tensor<F>,
    scale: f32,
    t0: u32,
    length: u32,
    stride: u32,
    n: u32,
    #[comptime] rows: usize,
    #[define(F)] _dtype: StorageType,
) {
    let row = ScoreRow::new(scores, lse, t0, length, stride, n);
    let mut partials = SharedMemory::<f32>::new(rows * ROW_UNITS);
    let width = scores.shape(2);
    let row_lse = lse[row.stat];

    // `sum_j p_j dp_j` is `dO . O` of the flash backward, from the f32 probabilities.
    let mut delta = 0.0f32;
    let mut col = row.lane;
    while col < row.visible {
        delta += row.prob(scores, col, scale, row_lse) * grad_probs[row.at + col];
        col += ROW_UNITS;
    }
    let delta = row.combine(&mut partials, delta, false);

    if row.active {
        col = row.lane;
        while col < width {
            let p = row.prob(scores, col, scale, row_lse);
            grad_scores[row.at + col] = F::cast_from(p * (grad_probs[row.at + col] - delta) * scale);
            probs[row.at + col] = F::cast_from(p);
            col += ROW_UNITS;
        }
    }
}
