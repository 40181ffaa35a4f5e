//! dK/dV with everything per key row in registers (flash attention 2's backward layout,
//! [`crate::kernel::primitives::fragments`]), computing what
//! [`crate::kernel::portable::backward::attention_backward_key`] does, for a window or a selection.
//!
//! A cube holds `16 * planes` keys of one KV head ([`KeyCube`]: consecutive keys of a window,
//! or a whole selected block); plane `p` owns 16 of them, whose K and V rows are A fragments for
//! the whole walk, and whose dK and dV are result tiles. The cube walks the query rows `(t, h)`
//! that attend its keys (a window's `t` in `[s0, s_end - 1 + w)`, `h` fastest; a selection's
//! segment of the block's list), `q_rows` at a time: per chunk, `s^T = K q^T` and
//! `dp^T = V dO^T` as result tiles (keys as rows), `p^T = exp(s^T scale - lse)` and
//! `ds^T = p^T (dp^T - delta)` in place, then `dV += p^T dO` and `dK += ds^T q`, the chunk's q
//! and dO rows read from shared memory by transposed `ldmatrix`; each chunk is copied by
//! `cp.async` while the one before is computed ([`crate::kernel::primitives::walk`]). A window's
//! cube writes its dK and dV; a selection's writes its segment's shares to `partial`, which
//! [`crate::kernel::selection::segments::sum_segments`] adds up (a block's list spans several
//! cubes). At narrow heads dQ is folded in ([`fold_query_gradient`]); else a selection's is
//! [`crate::kernel::selection::dq::selection_dq_flash`]'s and a window's
//! [`crate::kernel::window::dq`]'s.

mod chunk;

use cubecl::prelude::*;

use crate::kernel::key_gradients::chunk::{chunk_gradients, fold_query_gradient};
use crate::kernel::primitives::fragments::{mma, row_fragments, store_tiles, zero_pairs, Pair, MMA_M, MMA_N};
use crate::kernel::primitives::key_cube::KeyCube;
use crate::kernel::primitives::layout::{max_usize, VECTOR};
use crate::kernel::primitives::rows::offset3;
use crate::kernel::primitives::staging::stage_vector_rows;
use crate::kernel::primitives::walk::{issue_gradient_rows, next_chunk, TileBarriers};
use crate::tiling::storage_stride;

/// `q`, `k`, `v`, `dO`, `lse`, `delta` as [`crate::kernel::window::dq::window_dq_flash`], and a
/// selection's inverted index (placeholders for a window) -> a window's `grad_k`, `grad_v`, or
/// a selection's `partial` (`[B * H_kv, segments, span * (d_k + d_v)]`, as the portable key
/// kernel's). Cube `(32, planes)` units; `q_rows`
/// a multiple of 16; a selection's block is the cube's `16 * planes` keys.
#[cube(launch, launch_unchecked, fast_math = FastMath::all())]
#[allow(clippy::too_many_arguments)]
pub fn attention_key_flash<F: Float, N: Size, A: Size>(
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
    grad_q: &mut Tensor<Atomic<Vector<f32, A>>>,
    scale: f32,
    span: u32,
    segment: u32,
    #[comptime] window: bool,
    #[comptime] d_k: usize,
    #[comptime] d_v: usize,
    #[comptime] planes: usize,
    #[comptime] q_rows: usize,
    #[comptime] fold_dq: bool,
    #[comptime] atomic_width: usize,
    #[comptime] g: usize,
    #[define(F)] _dtype: StorageType,
) {
    let keys = comptime!(planes * MMA_M);
    let span = span as usize;
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
    let (b, hk, s0, s_end) = (cube.b, cube.hk, cube.s0, cube.s_end);
    let t_len = q.shape(1);
    let def = mma::<F>();
    let lane = UNIT_POS_X as usize;
    let plane = UNIT_POS_Y as usize;

    // The cube's K and V rows while their fragments load, then two buffers of walked rows (q
    // and dO): the next chunk's copies fly while the current one is computed.
    let ks = comptime!(storage_stride(d_k));
    let vs = comptime!(storage_stride(d_v));
    let chunk = comptime!(q_rows * (ks + vs));
    // Folding dQ keeps the K rows (the B operand of `ds K`): the buffers start after them.
    let base = comptime!(if fold_dq { keys * ks } else { 0 });
    let mut staged = SharedMemory::<Vector<F, N>>::new_aligned(
        comptime!((base + max_usize(keys * (ks + vs) - base, 2 * chunk)) / VECTOR),
        16usize,
    );
    // With `fold_dq`, the chunk's `ds^T` (keys as rows) in the storage type, read back
    // transposed as `ds`'s A fragments.
    let ds_stride = comptime!(storage_stride(q_rows) / 2);
    let mut ds_tile =
        SharedMemory::<Pair<F>>::new_aligned(comptime!(if fold_dq { keys * ds_stride } else { 4 }), 16usize);
    let units = CUBE_DIM as usize;
    stage_vector_rows::<F, N>(
        k,
        &mut staged,
        0usize,
        b,
        s0,
        s_end - s0,
        hk,
        keys,
        d_k,
        ks,
        VECTOR,
        UNIT_POS as usize,
        units,
    );
    stage_vector_rows::<F, N>(
        v,
        &mut staged,
        comptime!(keys * ks),
        b,
        s0,
        s_end - s0,
        hk,
        keys,
        d_v,
        vs,
        VECTOR,
        UNIT_POS as usize,
        units,
    );
    sync_cube();
    let k_frags = row_fragments::<F, N>(def, &staged, 0usize, plane * MMA_M, lane, d_k, ks);
    let v_frags = row_fragments::<F, N>(def, &staged, comptime!(keys * ks), plane * MMA_M, lane, d_v, vs);
    sync_cube();

    // The lane's two key rows.
    let mut key = Array::<usize>::new(2usize);
    let mut real = Array::<bool>::new(2usize);
    #[unroll]
    for half in 0..2usize {
        key[half] = s0 + plane * MMA_M + lane / 4 + 8 * half;
        real[half] = key[half] < s_end;
    }

    let mut dk = zero_pairs(comptime!(2 * d_k / MMA_N));
    let mut dv = zero_pairs(comptime!(2 * d_v / MMA_N));
    // Per walked row of each buffer's chunk: its position, lse and delta.
    let mut positions = SharedMemory::<u32>::new(comptime!(2 * q_rows));
    let mut stats = SharedMemory::<f32>::new(comptime!(4 * q_rows));
    let barriers = TileBarriers::new();

    // Scalars for the chunk being computed; the next chunk's are fresh variables (see
    // `window_forward_flash`).
    let mut row_first = 0usize;
    let mut count = min(cube.n_rows, q_rows);
    let mut slot = 0usize;
    if count > 0 {
        issue_gradient_rows::<F, N>(
            q,
            grad_out,
            lse,
            delta,
            entries,
            &cube,
            &mut staged,
            &mut positions,
            &mut stats,
            &barriers,
            row_first,
            count,
            slot,
            base,
            window,
            q_rows,
            d_k,
            d_v,
            planes,
        );
    }
    while row_first < cube.n_rows {
        let (next_first, next_count) = next_chunk(row_first, count, cube.n_rows, q_rows);
        let next_slot = 1 - slot;
        if next_first < cube.n_rows {
            issue_gradient_rows::<F, N>(
                q,
                grad_out,
                lse,
                delta,
                entries,
                &cube,
                &mut staged,
                &mut positions,
                &mut stats,
                &barriers,
                next_first,
                next_count,
                next_slot,
                base,
                window,
                q_rows,
                d_k,
                d_v,
                planes,
            );
        }
        barriers.wait(slot);
        let at = base + slot * chunk;

        // A window's chunk attends every key of the cube unless the chunk is partial, starts
        // before the cube's last key, or ends past its first key's window. A selection's rows
        // come in any order: always masked.
        let mut needs_mask = true;
        if window {
            let (t_first, t_last) = (s0 + row_first / g, s0 + (row_first + count - 1) / g);
            needs_mask = count < q_rows || t_first + 1 < s_end || t_last >= s0 + span;
        }
        // The mask is decided per chunk, outside the row groups, so each group's body has no
        // branch (a branch per score pair kept the compiler from scheduling across them).
        if needs_mask {
            chunk_gradients::<F, N>(
                def,
                &k_frags,
                &v_frags,
                &staged,
                &mut ds_tile,
                &positions,
                &stats,
                &mut dk,
                &mut dv,
                at,
                slot,
                &key,
                &real,
                count,
                span,
                scale,
                plane,
                lane,
                true,
                window,
                fold_dq,
                q_rows,
                d_k,
                d_v,
            );
        } else if comptime!(window) {
            chunk_gradients::<F, N>(
                def,
                &k_frags,
                &v_frags,
                &staged,
                &mut ds_tile,
                &positions,
                &stats,
                &mut dk,
                &mut dv,
                at,
                slot,
                &key,
                &real,
                count,
                span,
                scale,
                plane,
                lane,
                false,
                window,
                fold_dq,
                q_rows,
                d_k,
                d_v,
            );
        }
        if fold_dq {
            sync_cube();
            fold_query_gradient::<F, N, A>(
                def,
                &ds_tile,
                &staged,
                &positions,
                grad_q,
                &cube,
                slot,
                row_first,
                count,
                scale,
                plane,
                lane,
                d_k,
                keys,
                q_rows,
                atomic_width,
            );
        }
        // The chunk after next overwrites this buffer and its statistics.
        sync_cube();
        row_first = next_first;
        count = next_count;
        slot = next_slot;
    }

    let mut factor_k = Array::<f32>::new(2usize);
    let mut factor_v = Array::<f32>::new(2usize);
    #[unroll]
    for half in 0..2usize {
        factor_k[half] = scale;
        factor_v[half] = 1.0f32;
    }
    let mut base_k = Array::<usize>::new(2usize);
    let mut base_v = Array::<usize>::new(2usize);
    if window {
        #[unroll]
        for half in 0..2usize {
            let row = min(key[half], t_len - 1);
            base_k[half] = offset3::<F>(grad_k, b, row, hk);
            base_v[half] = offset3::<F>(grad_v, b, row, hk);
        }
        store_tiles::<F>(grad_k, &base_k, &real, &dk, &factor_k, lane, d_k);
        store_tiles::<F>(grad_v, &base_v, &real, &dv, &factor_v, lane, d_v);
    } else {
        let (segments, h_kv) = (segment_block.shape(2), k.shape(2));
        #[unroll]
        for half in 0..2usize {
            let row = cube.partial_row(segments, h_kv, min(key[half], s_end - 1), span);
            base_k[half] = row * comptime!(d_k + d_v);
            base_v[half] = base_k[half] + d_k;
        }
        store_tiles::<f32>(partial, &base_k, &real, &dk, &factor_k, lane, d_k);
        store_tiles::<f32>(partial, &base_v, &real, &dv, &factor_v, lane, d_v);
    }
}
