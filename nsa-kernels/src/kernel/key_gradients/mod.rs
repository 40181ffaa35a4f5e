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

use cubecl::cmma::MmaDefinition;
use cubecl::prelude::*;

use crate::kernel::key_gradients::chunk::{chunk_gradients, fold_query_gradient};
use crate::kernel::primitives::chunk_copies::GradientRows;
use crate::kernel::primitives::fragments::{mma, row_fragments, store_tiles, zero_pairs, Pair, MMA_M, MMA_N};
use crate::kernel::primitives::key_cube::{BlockLists, KeyCube};
use crate::kernel::primitives::layout::{max_usize, VECTOR};
use crate::kernel::primitives::rows::{document_end, offset3, RowStarts};
use crate::kernel::primitives::staging::stage_vector_rows;
use crate::kernel::primitives::walk::{walk_pipelined, ChunkCompute};
use crate::tile_sizes::storage_stride;

/// `q`, `k`, `v`, `dO`, `lse`, `delta` as [`crate::kernel::window::dq::window_dq_flash`], and a
/// selection's inverted index (placeholders for a window) -> a window's `grad_k`, `grad_v`, or
/// a selection's `partial` (`[B * H_kv, segments, span * (d_k + d_v)]`, as the portable key
/// kernel's). Cube `(32, planes)` units; `q_rows`
/// a multiple of 16; a selection's block is the cube's `16 * planes` keys.
#[cube(launch, launch_unchecked, fast_math = FastMath::all())]
// `clone()` of a handle: see `chunk_copies`.
#[allow(clippy::too_many_arguments, clippy::clone_on_copy)]
pub fn attention_key_flash<F: Float, I: Int, N: Size, A: Size>(
    q: &Tensor<Vector<F, N>>,
    k: &Tensor<Vector<F, N>>,
    v: &Tensor<Vector<F, N>>,
    grad_out: &Tensor<Vector<F, N>>,
    lse: &Tensor<f32>,
    delta: &Tensor<f32>,
    lists: &BlockLists,
    starts: &Tensor<I>,
    grad_k: &mut Tensor<F>,
    grad_v: &mut Tensor<F>,
    partial: &mut Tensor<f32>,
    grad_q: &mut Tensor<Atomic<Vector<f32, A>>>,
    scale: f32,
    span: u32,
    segment: u32,
    #[comptime] window: bool,
    #[comptime] documents: bool,
    #[comptime] d_k: usize,
    #[comptime] d_v: usize,
    #[comptime] planes: usize,
    #[comptime] q_rows: usize,
    #[comptime] fold_dq: bool,
    #[comptime] atomic_width: usize,
    #[comptime] g: usize,
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    let keys = comptime!(planes * MMA_M);
    let span = span as usize;
    let cube = KeyCube::new::<Vector<F, N>>(q, k, lists, span, segment as usize, window, keys, g);
    if !cube.exists {
        terminate!();
    }
    let (b, hk, s0, s_end) = (cube.b, cube.hk, cube.s0, cube.s_end);
    let t_len = q.shape(1);
    let mut n_rows = cube.n_rows;
    if window {
        n_rows = cube.window_rows_before(document_end::<I>(starts, b, s_end - 1, t_len, documents));
    }
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
    let ds_tile = SharedMemory::<Pair<F>>::new_aligned(comptime!(if fold_dq { keys * ds_stride } else { 4 }), 16usize);
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

    // Per walked row of each buffer's chunk: its position, lse and delta.
    let positions = SharedMemory::<u32>::new(comptime!(2 * q_rows));
    let stats = SharedMemory::<f32>::new(comptime!(4 * q_rows));
    let mut rows = GradientRows::<F, N>::new(
        q,
        grad_out,
        lse,
        delta,
        &lists.entries,
        &cube,
        &staged,
        &positions,
        &stats,
        base,
        window,
        q_rows,
        d_k,
        d_v,
        planes,
    );
    let mut grads = KeyChunkGradients::<F, I, N, A> {
        staged,
        ds_tile,
        positions,
        stats,
        row_starts: RowStarts::<I>::new(starts, b, documents),
        grad_q: grad_q.clone(),
        cube: cube.clone(),
        def,
        k_frags,
        v_frags,
        key,
        real,
        dk: zero_pairs(comptime!(2 * d_k / MMA_N)),
        dv: zero_pairs(comptime!(2 * d_v / MMA_N)),
        span,
        scale,
        plane,
        lane,
        window,
        documents,
        fold_dq,
        q_rows,
        d_k,
        d_v,
        atomic_width,
        keys,
        base,
    };
    walk_pipelined::<GradientRows<F, N>, KeyChunkGradients<F, I, N, A>>(&mut rows, &mut grads, 0usize, n_rows, q_rows);
    let (key, real) = (grads.key, grads.real);

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
        store_tiles::<F>(grad_k, &base_k, &real, &grads.dk, &factor_k, lane, d_k);
        store_tiles::<F>(grad_v, &base_v, &real, &grads.dv, &factor_v, lane, d_v);
    } else {
        let (segments, h_kv) = (lists.segment_block.shape(2), k.shape(2));
        #[unroll]
        for half in 0..2usize {
            let row = cube.partial_row(segments, h_kv, min(key[half], s_end - 1), span);
            base_k[half] = row * comptime!(d_k + d_v);
            base_v[half] = base_k[half] + d_k;
        }
        store_tiles::<f32>(partial, &base_k, &real, &grads.dk, &factor_k, lane, d_k);
        store_tiles::<f32>(partial, &base_v, &real, &grads.dv, &factor_v, lane, d_v);
    }
}

/// The key cube's compute per chunk of walked rows: the chunk's share of dK and dV, and at
/// narrow heads its dQ folded in.
#[derive(CubeType)]
struct KeyChunkGradients<F: Float, I: Int, N: Size, A: Size> {
    staged: SharedMemory<Vector<F, N>>,
    ds_tile: SharedMemory<Pair<F>>,
    positions: SharedMemory<u32>,
    stats: SharedMemory<f32>,
    row_starts: RowStarts<I>,
    grad_q: Tensor<Atomic<Vector<f32, A>>>,
    cube: KeyCube,
    def: MmaDefinition<F, F, f32>,
    k_frags: Array<Pair<F>>,
    v_frags: Array<Pair<F>>,
    /// The lane's two key rows, and whether each is a real key.
    key: Array<usize>,
    real: Array<bool>,
    dk: Array<Pair<f32>>,
    dv: Array<Pair<f32>>,
    span: usize,
    scale: f32,
    plane: usize,
    lane: usize,
    #[cube(comptime)]
    window: bool,
    #[cube(comptime)]
    documents: bool,
    #[cube(comptime)]
    fold_dq: bool,
    #[cube(comptime)]
    q_rows: usize,
    #[cube(comptime)]
    d_k: usize,
    #[cube(comptime)]
    d_v: usize,
    #[cube(comptime)]
    atomic_width: usize,
    #[cube(comptime)]
    keys: usize,
    /// Where the walked rows' buffers start in `staged`.
    #[cube(comptime)]
    base: usize,
}

#[cube]
impl<F: Float, I: Int, N: Size, A: Size> ChunkCompute for KeyChunkGradients<F, I, N, A> {
    fn compute(this: &mut Self, first: usize, count: usize, slot: usize) {
        let (window, fold_dq, q_rows, keys) = comptime!((this.window, this.fold_dq, this.q_rows, this.keys));
        let documents = comptime!(this.documents);
        let (d_k, d_v, g) = comptime!((this.d_k, this.d_v, this.cube.g));
        let chunk = comptime!(q_rows * (storage_stride(d_k) + storage_stride(d_v)));
        let at = comptime!(this.base) + slot * chunk;
        let (s0, s_end, span) = (this.cube.s0, this.cube.s_end, this.span);
        let (def, scale, plane, lane) = (this.def, this.scale, this.plane, this.lane);

        // A window's chunk attends every key of the cube unless the chunk is partial, starts
        // before the cube's last key, or ends past its first key's window. A selection's rows
        // come in any order, and packed documents' rows may start after the cube's first key:
        // always masked.
        let mut needs_mask = true;
        let bounded = comptime!(window && !documents);
        if bounded {
            let (t_first, t_last) = (s0 + first / g, s0 + (first + count - 1) / g);
            needs_mask = count < q_rows || t_first + 1 < s_end || t_last >= s0 + span;
        }
        // The mask is decided per chunk, outside the row groups, so each group's body has no
        // branch (a branch per score pair kept the compiler from scheduling across them).
        if needs_mask {
            chunk_gradients::<F, I, N>(
                def,
                &this.k_frags,
                &this.v_frags,
                &this.staged,
                &mut this.ds_tile,
                &this.positions,
                &this.stats,
                &this.row_starts,
                &mut this.dk,
                &mut this.dv,
                at,
                slot,
                &this.key,
                &this.real,
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
            chunk_gradients::<F, I, N>(
                def,
                &this.k_frags,
                &this.v_frags,
                &this.staged,
                &mut this.ds_tile,
                &this.positions,
                &this.stats,
                &this.row_starts,
                &mut this.dk,
                &mut this.dv,
                at,
                slot,
                &this.key,
                &this.real,
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
                &this.ds_tile,
                &this.staged,
                &this.positions,
                &mut this.grad_q,
                &this.cube,
                slot,
                first,
                count,
                scale,
                plane,
                lane,
                d_k,
                keys,
                q_rows,
                comptime!(this.atomic_width),
            );
        }
    }
}
