//! The compressed branch: every query row against the compressed blocks complete at its
//! position, and the selection scores those probabilities give.
//!
//! Keys are few (one per `stride` tokens), so a unit owns a whole row in f32 registers and walks
//! the keys staged in shared memory; no `T x N` matrix is written, forward or backward.
//!
//! - Query side (forward, dQ): one cube per `(b, hk, tile of queries)`, one unit per row `(t, h)`
//!   (`h` fastest). Every row of a cube attends a prefix of the keys, so the cube stages the
//!   prefix its last query sees and each row stops at its own.
//! - Key side (dK, dV): one cube per `(split, b, hk, tile of keys)`, one unit per key. A split is
//!   a range of query positions; the splits' partial sums are added by [`sum_splits`].
//! - Scores: one unit per `(b, hk, t, selection block)` sums `w_ij * p_t,h,i` over the group's
//!   heads and the compressed blocks `i` overlapping block `j` (the spec's Eq. 9 and 10).

use cubecl::prelude::*;

use super::rows::NEG_LARGE;
use super::rows::{add_shared, load_slice, offset3, stage_rows, store_row_result, store_slice, zero_slice};

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

/// `a[a_at..a_at + len] . b[b_at..b_at + len]` of two shared-memory rows, as [`dot_row`].
#[cube]
fn dot_tiles(a: &SharedMemory<f32>, a_at: usize, b: &SharedMemory<f32>, b_at: usize, #[comptime] len: usize) -> f32 {
    let mut s0 = 0.0f32;
    let mut s1 = 0.0f32;
    let mut s2 = 0.0f32;
    let mut s3 = 0.0f32;
    #[unroll]
    for i in 0..len / 4 {
        s0 += a[a_at + 4 * i] * b[b_at + 4 * i];
        s1 += a[a_at + 4 * i + 1] * b[b_at + 4 * i + 1];
        s2 += a[a_at + 4 * i + 2] * b[b_at + 4 * i + 2];
        s3 += a[a_at + 4 * i + 3] * b[b_at + 4 * i + 3];
    }
    #[unroll]
    for i in (len / 4) * 4..len {
        s0 += a[a_at + i] * b[b_at + i];
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

/// `q [B, T, H_q, d_k]`, `k [B, N, H_kv, d_k]`, `v [B, N, H_kv, d_v]` -> `out [B, T, H_q, d_v]`
/// and `lse [B, T, H_q]` (f32; `NEG_LARGE` with a zero row for a row that attends no block).
/// Last axes contiguous. Cube `queries * g` units.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn compressed_forward<F: Float>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    v: &Tensor<F>,
    out: &mut Tensor<F>,
    lse: &mut Tensor<f32>,
    scale: f32,
    length: u32,
    stride: u32,
    #[comptime] g: usize,
    #[comptime] queries: usize,
    #[comptime] d_k: usize,
    #[comptime] d_v: usize,
    #[comptime] chunk: usize,
    #[define(F)] _dtype: StorageType,
) {
    let unit = RowUnit::new::<F>(q, k, length as usize, stride as usize, g, queries);
    if !unit.exists {
        terminate!();
    }
    let (b, hk, t, h) = (unit.b, unit.hk, unit.t, unit.h);
    let q_row = load_slice::<F>(q, offset3::<F>(q, b, t, h), 0usize, scale, d_k, 1usize);
    let mut acc = zero_slice(d_v, 1usize);
    let mut row_max = f32::new(NEG_LARGE);
    let mut sum = 0.0f32;
    let mut k_tile = SharedMemory::<f32>::new(chunk * d_k);
    let mut v_tile = SharedMemory::<f32>::new(chunk * d_v);

    let mut first = 0usize;
    while first < unit.cube_keys {
        let count = min(unit.cube_keys - first, chunk);
        stage_rows::<F, f32>(k, &mut k_tile, 0usize, b, first, count, hk, chunk, d_k, d_k);
        stage_rows::<F, f32>(v, &mut v_tile, 0usize, b, first, count, hk, chunk, d_v, d_v);
        sync_cube();
        for key in 0..unit.attended(first, count) {
            let s = dot_row(&q_row, &k_tile, key * d_k, d_k);
            if s > row_max {
                // Rescale what was accumulated under the old maximum.
                let correction = (row_max - s).exp();
                sum *= correction;
                #[unroll]
                for i in 0..d_v {
                    acc[i] *= correction;
                }
                row_max = s;
            }
            let p = (s - row_max).exp();
            sum += p;
            add_shared(&mut acc, p, &v_tile, key * d_v, 0usize, d_v, 1usize);
        }
        sync_cube();
        first += count;
    }
    if unit.active {
        store_row_result::<F>(out, lse, b, t, h, 0usize, &acc, row_max, sum, d_v, 1usize);
    }
}

/// dQ, and `delta = dO . O` per row (f32, for the key side): the forward's walk with the
/// probabilities recomputed from the saved log-sum-exp.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn compressed_backward_query<F: Float>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    v: &Tensor<F>,
    out: &Tensor<F>,
    lse: &Tensor<f32>,
    grad_out: &Tensor<F>,
    grad_q: &mut Tensor<F>,
    delta: &mut Tensor<f32>,
    scale: f32,
    length: u32,
    stride: u32,
    #[comptime] g: usize,
    #[comptime] queries: usize,
    #[comptime] d_k: usize,
    #[comptime] d_v: usize,
    #[comptime] chunk: usize,
    #[define(F)] _dtype: StorageType,
) {
    let unit = RowUnit::new::<F>(q, k, length as usize, stride as usize, g, queries);
    if !unit.exists {
        terminate!();
    }
    let (b, hk, t, h) = (unit.b, unit.hk, unit.t, unit.h);
    let q_row = load_slice::<F>(q, offset3::<F>(q, b, t, h), 0usize, scale, d_k, 1usize);
    let do_row = load_slice::<F>(grad_out, offset3::<F>(grad_out, b, t, h), 0usize, 1.0f32, d_v, 1usize);
    let o_row = load_slice::<F>(out, offset3::<F>(out, b, t, h), 0usize, 1.0f32, d_v, 1usize);
    let mut row_delta = 0.0f32;
    #[unroll]
    for i in 0..d_v {
        row_delta += do_row[i] * o_row[i];
    }
    let row_lse = lse[offset3::<f32>(lse, b, t, h)];
    let mut dq = zero_slice(d_k, 1usize);
    let mut k_tile = SharedMemory::<f32>::new(chunk * d_k);
    let mut v_tile = SharedMemory::<f32>::new(chunk * d_v);

    let mut first = 0usize;
    while first < unit.cube_keys {
        let count = min(unit.cube_keys - first, chunk);
        stage_rows::<F, f32>(k, &mut k_tile, 0usize, b, first, count, hk, chunk, d_k, d_k);
        stage_rows::<F, f32>(v, &mut v_tile, 0usize, b, first, count, hk, chunk, d_v, d_v);
        sync_cube();
        for key in 0..unit.attended(first, count) {
            let p = (dot_row(&q_row, &k_tile, key * d_k, d_k) - row_lse).exp();
            let dp = dot_row(&do_row, &v_tile, key * d_v, d_v);
            add_shared(&mut dq, p * (dp - row_delta), &k_tile, key * d_k, 0usize, d_k, 1usize);
        }
        sync_cube();
        first += count;
    }
    if unit.active {
        store_slice::<F>(grad_q, offset3::<F>(grad_q, b, t, h), 0usize, &dq, scale, d_k, 1usize);
        delta[offset3::<f32>(delta, b, t, h)] = row_delta;
    }
}

/// Vector width of the key side's loads: 4 (16-byte shared-memory loads) when both head dims
/// allow it.
pub fn key_vector(d_k: usize, d_v: usize) -> usize {
    if d_k.is_multiple_of(4) && d_v.is_multiple_of(4) {
        4
    } else {
        1
    }
}

/// Stages rows `first..first + count` of head `hk` of `src [B, *, H, d]` (vectors) at rows of
/// `stride` vectors of `tile` as f32, zero past `count`; rows of `g` heads each when `g > 1`
/// (row `r` is position `first + r / g`, head `hk * g + r % g`).
#[cube]
#[allow(clippy::too_many_arguments)]
fn stage_vectors<F: Float, N: Size>(
    src: &Tensor<Vector<F, N>>,
    tile: &mut SharedMemory<Vector<f32, N>>,
    b: usize,
    first: usize,
    rows: usize,
    count: usize,
    hk: usize,
    #[comptime] g: usize,
    #[comptime] per_row: usize,
    #[comptime] stride: usize,
    #[comptime] vector: usize,
) {
    let mut idx = UNIT_POS as usize;
    while idx < rows * per_row {
        let (row, c) = (idx / per_row, idx % per_row);
        let mut value = Vector::<f32, N>::new(0.0f32);
        if row < count {
            let at = offset3::<Vector<F, N>>(src, b, first + row / g, hk * g + row % g);
            value = Vector::<f32, N>::cast_from(src[at / vector + c]);
        }
        tile[row * stride + c] = value;
        idx += CUBE_DIM as usize;
    }
}

/// `a[a_at..] . b[b_at..]` over `len` vectors of two shared-memory rows, in two interleaved
/// sums, lanes added at the end.
#[cube]
fn dot_vectors<N: Size>(
    a: &SharedMemory<Vector<f32, N>>,
    a_at: usize,
    b: &SharedMemory<Vector<f32, N>>,
    b_at: usize,
    #[comptime] len: usize,
    #[comptime] vector: usize,
) -> f32 {
    let mut even = Vector::<f32, N>::new(0.0f32);
    let mut odd = Vector::<f32, N>::new(0.0f32);
    #[unroll]
    for c in 0..len / 2 {
        even += a[a_at + 2 * c] * b[b_at + 2 * c];
        odd += a[a_at + 2 * c + 1] * b[b_at + 2 * c + 1];
    }
    #[unroll]
    for c in (len / 2) * 2..len {
        even += a[a_at + c] * b[b_at + c];
    }
    let sum = even + odd;
    let mut total = 0.0f32;
    #[unroll]
    for lane in 0..vector {
        total += sum[lane];
    }
    total
}

/// dK and dV of each key over one split's query positions: `partial [splits, B, N, H_kv,
/// d_k + d_v]` (f32), row `(split, b, i, hk)` holding dK then dV. Cube `keys * g` units, unit
/// `head * keys + key`: with `keys` a plane, a plane walks one head's rows (its query reads are
/// broadcasts) and the heads' sums are added in shared memory at the end. The queries are
/// staged `positions` at a time with all `g` heads; rows are read in vectors of `vector`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn compressed_backward_key<F: Float, N: Size>(
    q: &Tensor<Vector<F, N>>,
    k: &Tensor<Vector<F, N>>,
    v: &Tensor<Vector<F, N>>,
    grad_out: &Tensor<Vector<F, N>>,
    lse: &Tensor<f32>,
    delta: &Tensor<f32>,
    partial: &mut Tensor<Vector<f32, N>>,
    scale: f32,
    length: u32,
    stride: u32,
    span: u32,
    #[comptime] g: usize,
    #[comptime] keys: usize,
    #[comptime] positions: usize,
    #[comptime] d_k: usize,
    #[comptime] d_v: usize,
    #[comptime] vector: usize,
    #[define(F)] _dtype: StorageType,
) {
    let (batch, t_len, n, h_kv) = (q.shape(0), q.shape(1), k.shape(1), k.shape(2));
    let (length, stride, span) = (length as usize, stride as usize, span as usize);
    let tiles = n.div_ceil(keys);
    let cube = CUBE_POS;
    let tile = cube % tiles;
    let hk = (cube / tiles) % h_kv;
    let b = (cube / (tiles * h_kv)) % batch;
    let split = cube / (tiles * h_kv * batch);
    if split >= partial.shape(0) {
        terminate!();
    }
    let unit = UNIT_POS as usize;
    let (head, key) = (unit / keys, unit % keys);
    let i0 = tile * keys;
    let key_count = min(n - i0, keys);
    let i = i0 + key;
    let (kv, vv) = (comptime!(d_k / vector), comptime!(d_v / vector));
    // Key rows padded by one vector, so units reading their own rows hit distinct banks.
    let (k_stride, v_stride) = (comptime!(d_k / vector + 1), comptime!(d_v / vector + 1));

    let mut k_tile = SharedMemory::<Vector<f32, N>>::new(keys * k_stride);
    let mut v_tile = SharedMemory::<Vector<f32, N>>::new(keys * v_stride);
    stage_vectors::<F, N>(k, &mut k_tile, b, i0, keys, key_count, hk, 1usize, kv, k_stride, vector);
    stage_vectors::<F, N>(v, &mut v_tile, b, i0, keys, key_count, hk, 1usize, vv, v_stride, vector);
    let mut q_tile = SharedMemory::<Vector<f32, N>>::new(positions * g * kv);
    let mut do_tile = SharedMemory::<Vector<f32, N>>::new(positions * g * vv);
    let mut lse_tile = SharedMemory::<f32>::new(positions * g);
    let mut delta_tile = SharedMemory::<f32>::new(positions * g);

    let mut dk = Array::<Vector<f32, N>>::new(kv);
    let mut dv = Array::<Vector<f32, N>>::new(vv);
    #[unroll]
    for c in 0..kv {
        dk[c] = Vector::<f32, N>::new(0.0f32);
    }
    #[unroll]
    for c in 0..vv {
        dv[c] = Vector::<f32, N>::new(0.0f32);
    }
    // This split's positions from the first one that sees the tile's first key.
    let end = min((split + 1) * span, t_len);
    let mut start = max(split * span, i0 * stride + length - 1);
    // The position from which this unit's key is complete.
    let own_first = i * stride + length - 1;
    while start < end {
        let count = min(end - start, positions);
        let rows = count * g;
        stage_vectors::<F, N>(q, &mut q_tile, b, start, positions * g, rows, hk, g, kv, kv, vector);
        stage_vectors::<F, N>(grad_out, &mut do_tile, b, start, positions * g, rows, hk, g, vv, vv, vector);
        let mut idx = unit;
        while idx < positions * g {
            let mut row_lse = 0.0f32;
            let mut row_delta = 0.0f32;
            if idx < rows {
                let at = offset3::<f32>(lse, b, start + idx / g, hk * g + idx % g);
                row_lse = lse[at];
                row_delta = delta[at];
            }
            lse_tile[idx] = row_lse;
            delta_tile[idx] = row_delta;
            idx += CUBE_DIM as usize;
        }
        sync_cube();
        if key < key_count {
            let mut first = count;
            if own_first < start + count {
                first = max(own_first, start) - start;
            }
            for position in first..count {
                let r = position * g + head;
                let s = dot_vectors::<N>(&k_tile, key * k_stride, &q_tile, r * kv, kv, vector);
                let dp = dot_vectors::<N>(&v_tile, key * v_stride, &do_tile, r * vv, vv, vector);
                let p = (s * scale - lse_tile[r]).exp();
                let ds = Vector::<f32, N>::new(p * (dp - delta_tile[r]));
                let pv = Vector::<f32, N>::new(p);
                #[unroll]
                for c in 0..vv {
                    dv[c] += pv * do_tile[r * vv + c];
                }
                #[unroll]
                for c in 0..kv {
                    dk[c] += ds * q_tile[r * kv + c];
                }
            }
        }
        sync_cube();
        start += count;
    }

    // The heads' sums, added one head at a time into the key tiles (no longer read).
    sync_cube();
    #[unroll]
    for h in 0..g {
        if head == h && key < key_count {
            #[unroll]
            for c in 0..kv {
                let at = key * k_stride + c;
                k_tile[at] = select(h == 0, dk[c], k_tile[at] + dk[c]);
            }
            #[unroll]
            for c in 0..vv {
                let at = key * v_stride + c;
                v_tile[at] = select(h == 0, dv[c], v_tile[at] + dv[c]);
            }
        }
        sync_cube();
    }
    if head == 0 && key < key_count {
        let row = (((split * batch + b) * n + i) * h_kv + hk) * (kv + vv);
        let scale_v = Vector::<f32, N>::new(scale);
        #[unroll]
        for c in 0..kv {
            partial[row + c] = k_tile[key * k_stride + c] * scale_v;
        }
        #[unroll]
        for c in 0..vv {
            partial[row + kv + c] = v_tile[key * v_stride + c];
        }
    }
}

/// `grad_k`, `grad_v` (`[B, N, H_kv, d]`, contiguous) as the sums of the splits' partials.
#[cube(launch)]
pub fn sum_splits<F: Float>(
    partial: &Tensor<f32>,
    grad_k: &mut Tensor<F>,
    grad_v: &mut Tensor<F>,
    #[comptime] d_k: usize,
    #[comptime] d_v: usize,
    #[define(F)] _dtype: StorageType,
) {
    let rows = grad_k.len() / d_k;
    let pos = ABSOLUTE_POS;
    if pos >= rows * (d_k + d_v) {
        terminate!();
    }
    let mut total = 0.0f32;
    for split in 0..partial.shape(0) {
        total += partial[split * rows * (d_k + d_v) + pos];
    }
    let (row, x) = (pos / (d_k + d_v), pos % (d_k + d_v));
    if x < d_k {
        grad_k[row * d_k + x] = F::cast_from(total);
    } else {
        grad_v[row * d_v + x - d_k] = F::cast_from(total);
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
