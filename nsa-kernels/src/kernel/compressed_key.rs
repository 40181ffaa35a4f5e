//! The compressed branch's key side (dK, dV): one cube per `(split, b, hk, tile of keys)`, a
//! unit per key and query head of the group. A split is a range of query positions; the splits'
//! partial sums are added by [`sum_splits`]. The query side is [`super::compressed`].

use cubecl::prelude::*;

use super::rows::offset3;

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
