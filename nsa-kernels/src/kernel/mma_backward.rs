//! dK/dV on tensor cores (CMMA 16x16x16, f16/bf16 in, f32 accumulation): the key cubes of
//! [`super::backward::attention_backward_key`] (same keys, same query rows, same outputs), with
//! every product a plane-wide matrix product.
//!
//! Plane `p` owns keys `s0 + 16p ..`; its K and V rows are A fragments held for the whole walk,
//! and its dK and dV are accumulator fragments (no rescaling in a backward, so they never leave
//! the tensor-core registers until the end). Per staged chunk of `q_rows` query rows:
//! `s^T = K q^T` and `dp^T = V dO^T` go to f32 tiles in shared memory; two units per key row turn
//! them into `p^T = exp(s^T scale - lse)` and `ds^T = p^T (dp^T - delta)` (masked, rounded to the
//! storage type); then `dV += p^T dO` and `dK += ds^T q`.
//!
//! With `fold_dq` the cube also adds its keys' share of dQ, `scale * ds K`, to an f32 `grad_q`
//! by atomics (flash attention 2's backward): the planes' `ds^T` tiles and the cube's K rows,
//! kept in shared memory, give each plane some `16 x 16` tiles of the chunk's dQ. A query's dQ
//! then costs no second pass over its keys (the query-side dQ kernels re-read every key of a
//! query's window or blocks and recomputed `s` and `dp`).

use cubecl::cmma::{self, Matrix, MatrixIdent, MatrixLayout};
use cubecl::prelude::*;

use super::key::KeyCube;
use super::mma_forward::{
    storage_fragment, tile_fragment, tile_row_fragments, tile_span, zero_accumulators, zero_tile, ALIGN, TILE, VECTOR,
};
use super::rows::{attends, offset3, stage_listed_vector_rows, stage_vector_rows};
use crate::tiling::{f32_stride, storage_stride, KeyMmaTiling};

/// Same arguments as the plain key kernel; cube `(32, planes)` units, `keys = 16 * planes`;
/// `q_rows` query rows staged per step (a multiple of 32: two units per key row take half each).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn attention_backward_key_mma<F: Float, N: Size>(
    q: &Tensor<Vector<F, N>>,
    k: &Tensor<Vector<F, N>>,
    v: &Tensor<Vector<F, N>>,
    grad_out: &Tensor<Vector<F, N>>,
    lse: &Tensor<f32>,
    delta: &Tensor<f32>,
    offsets: &Tensor<u32>,
    counts: &Tensor<u32>,
    entries: &Tensor<u32>,
    segment_base: &Tensor<u32>,
    segment_block: &Tensor<u32>,
    segment_total: &Tensor<u32>,
    grad_k: &mut Tensor<F>,
    grad_v: &mut Tensor<F>,
    partial: &mut Tensor<f32>,
    grad_q: &mut Tensor<Atomic<f32>>,
    scale: f32,
    span: u32,
    segment: u32,
    #[comptime] window: bool,
    #[comptime] d_k: usize,
    #[comptime] d_v: usize,
    #[comptime] planes: usize,
    #[comptime] q_rows: usize,
    #[comptime] fold_dq: bool,
    #[comptime] g: usize,
    #[define(F)] _dtype: StorageType,
) {
    let span = span as usize;
    let keys = comptime!(planes * TILE);
    let cube = KeyCube::new::<Vector<F, N>>(
        q,
        k,
        offsets,
        counts,
        entries,
        segment_base,
        segment_block,
        segment_total,
        span,
        segment as usize,
        window,
        keys,
        g,
    );
    if !cube.exists {
        terminate!();
    }
    let plane = UNIT_POS_Y as usize;
    let lane = UNIT_POS_X as usize;
    let local = lane / 2;
    let half = lane % 2;
    // This unit's key row.
    let s = cube.s0 + plane * TILE + local;

    // One buffer: the cube's K and V rows while their fragments load, then each chunk's q, dO
    // (at `rows_at`; with `fold_dq` after the K rows, which stay for `ds K`). Rows are padded
    // (`storage_stride`, `f32_stride`) against shared-memory bank conflicts.
    let ks = comptime!(storage_stride(d_k));
    let vs = comptime!(storage_stride(d_v));
    let rows_at = comptime!(if fold_dq { keys * ks } else { 0 });
    let mut staged = SharedMemory::<Vector<F, N>>::new_aligned(
        comptime!(KeyMmaTiling::staged_elems(keys, q_rows, ks, vs, fold_dq) / VECTOR),
        ALIGN,
    );
    stage_vector_rows::<F, N>(
        k,
        &mut staged,
        0usize,
        cube.b,
        cube.s0,
        cube.s_end - cube.s0,
        cube.hk,
        keys,
        d_k,
        ks,
        VECTOR,
        UNIT_POS as usize,
        CUBE_DIM as usize,
    );
    stage_vector_rows::<F, N>(
        v,
        &mut staged,
        comptime!(keys * ks),
        cube.b,
        cube.s0,
        cube.s_end - cube.s0,
        cube.hk,
        keys,
        d_v,
        vs,
        VECTOR,
        UNIT_POS as usize,
        CUBE_DIM as usize,
    );
    sync_cube();
    let k_frags = tile_row_fragments::<F, N>(&staged, plane * TILE * ks, d_k, ks);
    let v_frags = tile_row_fragments::<F, N>(&staged, comptime!(keys * ks) + plane * TILE * vs, d_v, vs);
    sync_cube();

    let dk = zero_accumulators(d_k);
    let dv = zero_accumulators(d_v);

    // Per plane: f32 `s^T` and `dp^T` tiles `[16, q_rows]`; storage-type `p^T`, `ds^T`.
    let qst = comptime!(f32_stride(q_rows));
    let wst = comptime!(storage_stride(q_rows));
    // (With `fold_dq` also the chunk's dQ, `[q_rows, f32_stride(d_k)]`, once `s^T`, `dp^T` are spent.)
    let mut scores =
        SharedMemory::<f32>::new_aligned(comptime!(KeyMmaTiling::score_elems(planes, q_rows, d_k, fold_dq)), ALIGN);
    let mut weights = SharedMemory::<F>::new_aligned(comptime!(2 * planes * TILE * wst), ALIGN);
    let mut stats = SharedMemory::<f32>::new(comptime!(2 * q_rows));
    let mut positions = SharedMemory::<u32>::new(q_rows);
    let s_region = plane * 2 * TILE * qst;
    let dp_region = s_region + TILE * qst;
    let p_region = plane * 2 * TILE * wst;
    let ds_region = p_region + TILE * wst;
    let do_at = comptime!(rows_at + q_rows * ks);

    let mut row_first = 0usize;
    while row_first < cube.n_rows {
        let count = min(cube.n_rows - row_first, q_rows);
        stage_query_chunk::<F, N>(
            q,
            grad_out,
            lse,
            delta,
            entries,
            &cube,
            &mut staged,
            &mut stats,
            &mut positions,
            row_first,
            count,
            window,
            rows_at,
            q_rows,
            d_k,
            d_v,
        );
        sync_cube();

        // s^T = K q^T and dp^T = V dO^T (q and dO read column-major: their transposes).
        #[unroll]
        for n in 0..q_rows / TILE {
            let st = zero_tile();
            #[unroll]
            for kk in 0..d_k / TILE {
                let at = rows_at + n * TILE * ks + kk * TILE;
                let qt = tile_fragment::<F, N>(&staged, at, MatrixIdent::B, MatrixLayout::ColMajor, ks);
                cmma::execute::<F, F, f32, f32>(k_frags.index(kk), &qt, &st, &st);
            }
            let at = s_region + n * TILE;
            cmma::store(
                &mut scores.slice_mut(at, at + comptime!(tile_span(qst))),
                &st,
                qst as u32,
                MatrixLayout::RowMajor,
            );
            let dpt = zero_tile();
            #[unroll]
            for kk in 0..d_v / TILE {
                let at = do_at + n * TILE * vs + kk * TILE;
                let dot = tile_fragment::<F, N>(&staged, at, MatrixIdent::B, MatrixLayout::ColMajor, vs);
                cmma::execute::<F, F, f32, f32>(v_frags.index(kk), &dot, &dpt, &dpt);
            }
            let at = dp_region + n * TILE;
            cmma::store(
                &mut scores.slice_mut(at, at + comptime!(tile_span(qst))),
                &dpt,
                qst as u32,
                MatrixLayout::RowMajor,
            );
        }
        sync_plane();

        // p^T and ds^T for this unit's key row, every other query row of the chunk (the two
        // units of a key row read neighbouring words).
        #[unroll]
        for c in 0..q_rows / 2 {
            let col = 2 * c + half;
            let valid = col < count && s < cube.s_end && attends(positions[col] as usize, s, span, window);
            let at = local * qst + col;
            let p = select(valid, (scores[s_region + at] * scale - stats[col]).exp(), 0.0f32);
            let ds = p * (scores[dp_region + at] - stats[q_rows + col]);
            weights[p_region + local * wst + col] = F::cast_from(p);
            weights[ds_region + local * wst + col] = F::cast_from(ds);
        }
        sync_plane();

        // dV += p^T dO, dK += ds^T q.
        #[unroll]
        for kk in 0..q_rows / TILE {
            let pt = storage_fragment::<F>(&weights, p_region + kk * TILE, MatrixLayout::RowMajor, wst);
            let dst = storage_fragment::<F>(&weights, ds_region + kk * TILE, MatrixLayout::RowMajor, wst);
            #[unroll]
            for n in 0..d_v / TILE {
                let at = do_at + kk * TILE * vs + n * TILE;
                let dob = tile_fragment::<F, N>(&staged, at, MatrixIdent::B, MatrixLayout::RowMajor, vs);
                cmma::execute::<F, F, f32, f32>(&pt, &dob, dv.index(n), dv.index(n));
            }
            #[unroll]
            for n in 0..d_k / TILE {
                let at = rows_at + kk * TILE * ks + n * TILE;
                let qb = tile_fragment::<F, N>(&staged, at, MatrixIdent::B, MatrixLayout::RowMajor, ks);
                cmma::execute::<F, F, f32, f32>(&dst, &qb, dk.index(n), dk.index(n));
            }
        }
        if fold_dq {
            sync_cube();
            fold_query_gradient::<F, N>(
                &staged,
                &weights,
                &mut scores,
                &positions,
                grad_q,
                &cube,
                row_first,
                count,
                scale,
                ks,
                wst,
                planes,
                q_rows,
                d_k,
            );
        }
        // The next chunk overwrites q, dO and the statistics.
        sync_cube();
        row_first += count;
    }

    // Out through the plane's score tile, one 16x16 fragment at a time.
    let segments = segment_block.shape(2);
    let h_kv = k.shape(2);
    #[unroll]
    for n in 0..d_k / TILE {
        write_fragment::<F>(
            dk.index(n),
            &mut scores,
            s_region,
            grad_k,
            partial,
            &cube,
            s,
            n * TILE,
            scale,
            segments,
            h_kv,
            span,
            local,
            half,
            window,
            0usize,
            d_k + d_v,
        );
    }
    #[unroll]
    for n in 0..d_v / TILE {
        write_fragment::<F>(
            dv.index(n),
            &mut scores,
            s_region,
            grad_v,
            partial,
            &cube,
            s,
            n * TILE,
            1.0f32,
            segments,
            h_kv,
            span,
            local,
            half,
            window,
            d_k,
            d_k + d_v,
        );
    }
}

/// Walked rows `row_first..row_first + count` (padded to `q_rows` with zeros): their query
/// positions, `lse` and `delta` (at `q_rows`) in `stats`, and their q and dO rows in `staged`.
#[cube]
#[allow(clippy::too_many_arguments)]
fn stage_query_chunk<F: Float, N: Size>(
    q: &Tensor<Vector<F, N>>,
    grad_out: &Tensor<Vector<F, N>>,
    lse: &Tensor<f32>,
    delta: &Tensor<f32>,
    entries: &Tensor<u32>,
    cube: &KeyCube,
    staged: &mut SharedMemory<Vector<F, N>>,
    stats: &mut SharedMemory<f32>,
    positions: &mut SharedMemory<u32>,
    row_first: usize,
    count: usize,
    #[comptime] window: bool,
    #[comptime] rows_at: usize,
    #[comptime] q_rows: usize,
    #[comptime] d_k: usize,
    #[comptime] d_v: usize,
) {
    let mut i = UNIT_POS as usize;
    while i < q_rows {
        let mut t = 0usize;
        let mut row_lse = 0.0f32;
        let mut row_delta = 0.0f32;
        if i < count {
            let at = row_first + i;
            t = cube.query_of(entries, at, window);
            let h = cube.head_of(at);
            row_lse = lse[offset3::<f32>(lse, cube.b, t, h)];
            row_delta = delta[offset3::<f32>(delta, cube.b, t, h)];
        }
        positions[i] = t as u32;
        stats[i] = row_lse;
        stats[q_rows + i] = row_delta;
        i += CUBE_DIM as usize;
    }
    sync_cube();
    let ks = comptime!(storage_stride(d_k));
    let vs = comptime!(storage_stride(d_v));
    stage_listed_vector_rows::<F, N>(
        q,
        staged,
        rows_at,
        positions,
        cube.b,
        cube.hk,
        comptime!(cube.g),
        row_first,
        count,
        q_rows,
        d_k,
        ks,
        VECTOR,
    );
    stage_listed_vector_rows::<F, N>(
        grad_out,
        staged,
        comptime!(rows_at + q_rows * ks),
        positions,
        cube.b,
        cube.hk,
        comptime!(cube.g),
        row_first,
        count,
        q_rows,
        d_v,
        vs,
        VECTOR,
    );
}

/// Adds the chunk's share of dQ, `scale * ds K` over the cube's keys, to `grad_q` (f32, by
/// atomics: other key cubes add theirs to the same rows). The `[q_rows, d_k]` result is cut in
/// 16x16 tiles dealt round-robin to the planes; tile `(m, n)` sums plane `p`'s `ds^T` (read
/// column-major: its transpose) times the K rows `16p..` kept at the start of `staged`. The
/// tiles meet in `scores` and every unit adds a strided share of the chunk's `count` rows.
/// Called by every unit after a cube barrier (all planes' `ds^T` written); leaves `scores` busy.
#[cube]
#[allow(clippy::too_many_arguments)]
fn fold_query_gradient<F: Float, N: Size>(
    staged: &SharedMemory<Vector<F, N>>,
    weights: &SharedMemory<F>,
    scores: &mut SharedMemory<f32>,
    positions: &SharedMemory<u32>,
    grad_q: &mut Tensor<Atomic<f32>>,
    cube: &KeyCube,
    row_first: usize,
    count: usize,
    scale: f32,
    #[comptime] ks: usize,
    #[comptime] wst: usize,
    #[comptime] planes: usize,
    #[comptime] q_rows: usize,
    #[comptime] d_k: usize,
) {
    let plane = UNIT_POS_Y as usize;
    let qst = comptime!(f32_stride(d_k));
    let col_tiles = comptime!(d_k / TILE);
    let tiles = comptime!(q_rows / TILE * col_tiles);
    #[unroll]
    for round in 0..comptime!(tiles.div_ceil(planes)) {
        let tile = round * planes + plane;
        if tile < tiles {
            let (m, n) = (tile / col_tiles, tile % col_tiles);
            let acc = zero_tile();
            #[unroll]
            for p in 0..planes {
                // Plane `p`'s ds^T tile `[16 keys, q_rows]` sits after its p^T tile.
                let ds =
                    storage_fragment::<F>(weights, (2 * p + 1) * TILE * wst + m * TILE, MatrixLayout::ColMajor, wst);
                let kb =
                    tile_fragment::<F, N>(staged, p * TILE * ks + n * TILE, MatrixIdent::B, MatrixLayout::RowMajor, ks);
                cmma::execute::<F, F, f32, f32>(&ds, &kb, &acc, &acc);
            }
            let at = m * TILE * qst + n * TILE;
            cmma::store(
                &mut scores.slice_mut(at, at + comptime!(tile_span(qst))),
                &acc,
                qst as u32,
                MatrixLayout::RowMajor,
            );
        }
    }
    sync_cube();
    let mut idx = UNIT_POS as usize;
    while idx < count * d_k {
        let (r, c) = (idx / d_k, idx % d_k);
        let h = cube.head_of(row_first + r);
        let at = offset3::<Atomic<f32>>(grad_q, cube.b, positions[r] as usize, h) + c;
        grad_q[at].fetch_add(scores[r * qst + c] * scale);
        idx += CUBE_DIM as usize;
    }
}

/// Columns `col0..col0 + 16` of this unit's key row from one accumulator fragment, times
/// `scale`: to `dst` for a window, to the segment's share in `partial` (at column `offset +
/// col0` of a `width`-wide row) for a selection. Through the plane's shared tile at `region`.
#[cube]
#[allow(clippy::too_many_arguments)]
fn write_fragment<F: Float>(
    frag: &Matrix<f32>,
    tile: &mut SharedMemory<f32>,
    region: usize,
    dst: &mut Tensor<F>,
    partial: &mut Tensor<f32>,
    cube: &KeyCube,
    s: usize,
    col0: usize,
    scale: f32,
    segments: usize,
    h_kv: usize,
    span: usize,
    local: usize,
    half: usize,
    #[comptime] window: bool,
    offset: usize,
    width: usize,
) {
    let ost = comptime!(f32_stride(TILE));
    cmma::store(
        &mut tile.slice_mut(region, region + comptime!(tile_span(ost))),
        frag,
        ost as u32,
        MatrixLayout::RowMajor,
    );
    sync_plane();
    if s < cube.s_end {
        #[unroll]
        for c in 0..TILE / 2 {
            let col = 2 * c + half;
            let value = tile[region + local * ost + col] * scale;
            if window {
                dst[offset3::<F>(dst, cube.b, s, cube.hk) + col0 + col] = F::cast_from(value);
            } else {
                let row = cube.partial_row(segments, h_kv, s, span);
                partial[row * width + offset + col0 + col] = value;
            }
        }
    }
    sync_plane();
}

/// `delta = dO . O` per query row `(b, t, h)`, for the key cubes that fold dQ (without them
/// the query-side dQ kernel writes it on its way). A cube of `(d_v / VECTOR, rows)` units: unit
/// `(x, y)` multiplies 16-byte vector `x` of row `y` (so a plane's loads are consecutive), the
/// row's partial sums meet in shared memory and its first unit adds them.
///
/// With `zero_d_k > 0` it also zeroes the row's `zero_d_k` columns of `grad_q_sum` (contiguous
/// `[B, T, H_q, zero_d_k]` f32), the buffer the folding kernels then add dQ to by atomics: one
/// launch fewer than a fill of its own.
#[cube(launch)]
pub fn row_delta<F: Float, N: Size>(
    out: &Tensor<Vector<F, N>>,
    grad_out: &Tensor<Vector<F, N>>,
    delta: &mut Tensor<f32>,
    grad_q_sum: &mut Tensor<f32>,
    #[comptime] d_v: usize,
    #[comptime] rows: usize,
    #[comptime] zero_d_k: usize,
    #[define(F)] _dtype: StorageType,
) {
    let per_row = comptime!(d_v / VECTOR);
    let mut partials = SharedMemory::<f32>::new(comptime!(rows * per_row));
    let (t_len, h_q) = (delta.shape(1), delta.shape(2));
    let (c, y) = (UNIT_POS_X as usize, UNIT_POS_Y as usize);
    let row = CUBE_POS * rows + y;
    let exists = row < delta.shape(0) * t_len * h_q;
    let (b, t, h) = (row / (t_len * h_q), (row / h_q) % t_len, row % h_q);
    let mut sum = 0.0f32;
    if exists {
        let (o, d_o) = (
            out[offset3::<Vector<F, N>>(out, b, t, h) / VECTOR + c],
            grad_out[offset3::<Vector<F, N>>(grad_out, b, t, h) / VECTOR + c],
        );
        #[unroll]
        for e in 0..VECTOR {
            sum += f32::cast_from(d_o[e]) * f32::cast_from(o[e]);
        }
    }
    partials[y * per_row + c] = sum;
    sync_cube();
    if exists && c == 0 {
        let mut total = 0.0f32;
        #[unroll]
        for i in 0..per_row {
            total += partials[y * per_row + i];
        }
        delta[offset3::<f32>(delta, b, t, h)] = total;
    }
    if comptime!(zero_d_k > 0) && exists {
        #[unroll]
        for i in 0..zero_d_k.div_ceil(per_row) {
            let column = c + i * per_row;
            if column < zero_d_k {
                grad_q_sum[row * zero_d_k + column] = 0.0f32;
            }
        }
    }
}
