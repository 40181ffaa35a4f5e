//! The selection scores from the compressed branch's probabilities (the spec's Eq. 9 and 10),
//! and which compressed blocks a query sees. The branch's attention itself is dense products
//! and [`super::compressed_rows`].
//!
//! Scores walk the compressed keys from the query side: one cube per `(b, hk, tile of
//! queries)`, one unit per row `(t, h)` (`h` fastest) holding its query in f32 registers. Every
//! row of a cube sees a prefix of the keys, so the cube stages the prefix its last query sees in
//! shared memory and each row stops at its own; `sum_group` then adds each group's heads.

use cubecl::prelude::*;

use super::rows::{load_slice, offset3, stage_rows};

/// `row . tile[at..at + len]` for a register row: four independent sums, so consecutive
/// multiply-adds do not wait on each other.
#[cube]
fn dot_row(row: &Array<f32>, tile: &SharedMemory<f32>, at: usize, #[comptime] len: usize) -> f32 {
    let mut s0 = 0.0f32;
    let mut s1 = 0.0f32;
    let mut s2 = 0.0f32;
    let mut s3 = 0.0f32;
    #[unroll]
    for i in 0..len / 4 {
        s0 += row[4 * i] * tile[at + 4 * i];
        s1 += row[4 * i + 1] * tile[at + 4 * i + 1];
        s2 += row[4 * i + 2] * tile[at + 4 * i + 2];
        s3 += row[4 * i + 3] * tile[at + 4 * i + 3];
    }
    #[unroll]
    for i in (len / 4) * 4..len {
        s0 += row[i] * tile[at + i];
    }
    (s0 + s1) + (s2 + s3)
}

/// Compressed blocks complete at position `t` (`i * stride + length - 1 <= t`), at most `n`.
#[cube]
pub fn visible_blocks(t: usize, n: usize, length: usize, stride: usize) -> usize {
    let mut count = 0usize;
    if t + 1 >= length {
        count = min((t + 1 - length) / stride + 1, n);
    }
    count
}

/// Where a query-side unit sits: cube `(b, hk, tile)` with the tile fastest, unit `r` serving
/// query `t0 + r / g` and head `hk * g + r % g`. Units past the sequence end stage and wait
/// with the others but store nothing.
#[derive(CubeType)]
pub struct RowUnit {
    pub exists: bool,
    pub b: usize,
    pub hk: usize,
    pub t: usize,
    pub h: usize,
    pub active: bool,
    /// Keys the cube stages (its last query's) and keys this row attends.
    pub cube_keys: usize,
    pub own_keys: usize,
}

#[cube]
impl RowUnit {
    pub fn new<F: Float>(
        q: &Tensor<F>,
        k: &Tensor<F>,
        length: usize,
        stride: usize,
        #[comptime] g: usize,
        #[comptime] queries: usize,
    ) -> RowUnit {
        let (t_len, n, h_kv) = (q.shape(1), k.shape(1), k.shape(2));
        let tiles = t_len.div_ceil(queries);
        let cube = CUBE_POS;
        let exists = cube < q.shape(0) * h_kv * tiles;
        let tile = cube % tiles;
        let hk = (cube / tiles) % h_kv;
        let b = cube / (tiles * h_kv);
        let row = UNIT_POS as usize;
        let t0 = tile * queries;
        let last = min(t0 + queries, t_len) - 1;
        let mut t = t0 + row / g;
        let active = t < t_len;
        if !active {
            t = last;
        }
        let cube_keys = visible_blocks(last, n, length, stride);
        let mut own_keys = visible_blocks(t, n, length, stride);
        if !active {
            own_keys = 0;
        }
        RowUnit { exists, b, hk, t, h: hk * g + row % g, active, cube_keys, own_keys }
    }

    /// How many of the staged chunk's `count` keys, starting at key `first`, this row attends.
    pub fn attended(&self, first: usize, count: usize) -> usize {
        let mut mine = 0usize;
        if self.own_keys > first {
            mine = min(self.own_keys - first, count);
        }
        mine
    }
}

/// Per-head selection scores `head_scores [B, T, H_q, n_sel]` (f32): for each selection block
/// `j` of `block_size` tokens, the sum over the compressed blocks `i` complete at `t` of
/// `|[i*stride, i*stride + length) ∩ [j*block_size, (j+1)*block_size)| / length * p_t,h,i`,
/// `p = exp(q.k * scale - lse)`. The query side's walk: a unit owns row `(t, h)` of the output.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn compressed_head_scores<F: Float>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    lse: &Tensor<f32>,
    head_scores: &mut Tensor<f32>,
    scale: f32,
    length: u32,
    stride: u32,
    block_size: u32,
    #[comptime] g: usize,
    #[comptime] queries: usize,
    #[comptime] d_k: usize,
    #[comptime] chunk: usize,
    #[define(F)] _dtype: StorageType,
) {
    let (length, stride, block_size) = (length as usize, stride as usize, block_size as usize);
    let unit = RowUnit::new::<F>(q, k, length, stride, g, queries);
    if !unit.exists {
        terminate!();
    }
    let (b, hk, t, h) = (unit.b, unit.hk, unit.t, unit.h);
    let q_row = load_slice::<F>(q, offset3::<F>(q, b, t, h), 0usize, scale, d_k, 1usize);
    let row_lse = lse[offset3::<f32>(lse, b, t, h)];
    let n_sel = head_scores.shape(3);
    let out_row = offset3::<f32>(head_scores, b, t, h);
    if unit.active {
        for j in 0..n_sel {
            head_scores[out_row + j] = 0.0f32;
        }
    }
    let weight = 1.0f32 / f32::cast_from(length as u32);
    let mut k_tile = SharedMemory::<f32>::new(chunk * d_k);

    let mut first = 0usize;
    while first < unit.cube_keys {
        let count = min(unit.cube_keys - first, chunk);
        stage_rows::<F, f32>(k, &mut k_tile, 0usize, b, first, count, hk, chunk, d_k, d_k);
        sync_cube();
        for key in 0..unit.attended(first, count) {
            let p = (dot_row(&q_row, &k_tile, key * d_k, d_k) - row_lse).exp() * weight;
            // The selection blocks block `i` overlaps (every one lies before `t + 1`).
            let (start, end) = ((first + key) * stride, (first + key) * stride + length);
            let mut j = start / block_size;
            while j * block_size < end {
                let overlap = min(end, (j + 1) * block_size) - max(start, j * block_size);
                head_scores[out_row + j] += p * f32::cast_from(overlap as u32);
                j += 1;
            }
        }
        sync_cube();
        first += count;
    }
}

/// `scores [B, H_kv, T, n_sel]`: the per-head scores summed over each group's `g` heads
/// (the spec's Eq. 10).
#[cube(launch)]
pub fn sum_group(head_scores: &Tensor<f32>, scores: &mut Tensor<f32>, #[comptime] g: usize) {
    let pos = ABSOLUTE_POS;
    if pos >= scores.len() {
        terminate!();
    }
    let (h_kv, t_len, n_sel) = (scores.shape(1), scores.shape(2), scores.shape(3));
    let j = pos % n_sel;
    let t = (pos / n_sel) % t_len;
    let hk = (pos / (n_sel * t_len)) % h_kv;
    let b = pos / (n_sel * t_len * h_kv);
    let mut total = 0.0f32;
    #[unroll]
    for head in 0..g {
        total += head_scores[offset3::<f32>(head_scores, b, t, hk * g + head) + j];
    }
    scores[pos] = total;
}
