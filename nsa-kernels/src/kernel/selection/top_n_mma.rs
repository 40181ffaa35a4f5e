//! [`super::top_n`] with the products on CUDA's tensor cores (f16/bf16 storage): the same
//! scores, forced blocks and top-n, from the same staged chunks of compressed keys.
//!
//! A cube serves `rows` consecutive queries of one `(b, hk)` (one plane each, as the portable
//! kernel); their `rows * g` query rows `(position, head)`, in the order of the window kernels
//! (`kernel::primitives::query_cube`), are staged once and padded to whole MMA tiles. Per chunk:
//! 1. [`chunk_probabilities`]: the planes split the chunk's 16-key groups, each computing
//!    `p = exp(q . k scale - lse)` of every query row by MMA into shared memory;
//! 2. [`group_sums`]: each query's plane sums its `g` heads' rows, masking keys it cannot see;
//! 3. [`add_chunk_mass`]: the overlap-weighted block scores, as the portable kernel.
//!
//! Then each plane takes its query's blocks alone ([`take_best_in_plane`]: shuffles, no cube
//! barriers).
//!
//! The dot products accumulate in f32 in the tensor core's order rather than element by
//! element, so near-ties may rank differently from the portable kernel; equal key rows still
//! give equal scores.

use cubecl::prelude::*;

use super::block_scores::add_chunk_mass;
use super::plane_top_n::take_best_in_plane;
use super::probabilities::{chunk_probabilities, group_sums};
use super::selection_cube::SelectionCube;
use super::top_n::write_list;
use crate::kernel::compression::visible::visible_blocks;
use crate::kernel::primitives::fragments::{mma, Pair, MMA_M};
use crate::kernel::primitives::layout::VECTOR;
use crate::kernel::primitives::rows::{document_start, offset3};
use crate::kernel::primitives::staging::{stage_query_rows, stage_vector_rows};
use crate::tile_sizes::{storage_stride, SELECTION_CHUNK as CHUNK, SELECTION_PROB_STRIDE};

/// [`super::top_n::select_top_n`]'s inputs and output (document `starts` with `documents`),
/// `q` and `k` as vectors of [`VECTOR`] 16-bit elements (`d_k` a multiple of 16). Cube
/// `(LANES, rows)`, `rows` dividing the chunk's 16-key groups; `blocks >= ceil(T / block_size)`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn select_top_n_mma<F: Float, I: Int, N: Size>(
    q: &Tensor<Vector<F, N>>,
    k: &Tensor<Vector<F, N>>,
    lse: &Tensor<f32>,
    starts: &Tensor<I>,
    list: &mut Tensor<I>,
    scale: f32,
    #[comptime] documents: bool,
    #[comptime] length: usize,
    #[comptime] stride: usize,
    #[comptime] block_size: usize,
    #[comptime] g: usize,
    #[comptime] d_k: usize,
    #[comptime] rows: usize,
    #[comptime] blocks: usize,
    #[comptime] n: usize,
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    let cube = SelectionCube::new(q.shape(0), q.shape(1), k.shape(2), rows);
    if !cube.exists {
        terminate!();
    }
    let (b, hk, t0, t, r, lane) = (cube.b, cube.hk, cube.t0, cube.t, cube.r, cube.lane);
    let def = mma::<F>();
    let row_tiles = comptime!((rows * g).div_ceil(MMA_M));
    let ks = comptime!(storage_stride(d_k));

    let mut queries = SharedMemory::<Vector<F, N>>::new_aligned(comptime!(row_tiles * MMA_M * ks / VECTOR), 16usize);
    let mut keys = SharedMemory::<Vector<F, N>>::new_aligned(comptime!(CHUNK * ks / VECTOR), 16usize);
    let mut probs = SharedMemory::<Pair<f32>>::new(comptime!(row_tiles * MMA_M * SELECTION_PROB_STRIDE / 2));
    let mut stats = SharedMemory::<f32>::new(comptime!(row_tiles * MMA_M));
    let mut mass = SharedMemory::<f32>::new(rows * CHUNK);
    let mut scores = SharedMemory::<f32>::new(rows * blocks);
    stage_query_rows::<F, N>(q, &mut queries, b, t0, hk, g, comptime!(rows * g), row_tiles, d_k, ks);
    stage_row_stats(lse, &mut stats, &mut scores, b, hk, t0, g, rows, row_tiles, blocks);
    sync_cube();

    let n_keys = k.shape(1);
    let visible = visible_blocks(t, n_keys, length, stride);
    let walk_end = visible_blocks(cube.t_last, n_keys, length, stride);
    // The first compressed and selection blocks of the query's document.
    let start = document_start::<I>(starts, b, t, documents);
    let first_key = start.div_ceil(stride);
    let mut first = 0usize;
    while first < walk_end {
        let count = min(walk_end - first, CHUNK);
        let unit = UNIT_POS as usize;
        stage_vector_rows::<F, N>(
            k,
            &mut keys,
            0usize,
            b,
            first,
            count,
            hk,
            CHUNK,
            d_k,
            ks,
            VECTOR,
            unit,
            CUBE_DIM as usize,
        );
        sync_cube();
        chunk_probabilities::<F, N>(def, &queries, &keys, &stats, &mut probs, r, lane, scale, rows, row_tiles, d_k);
        sync_cube();
        group_sums(&probs, &mut mass, r, lane, first, visible, first_key, g);
        sync_cube();
        // The next chunk's staging and products touch neither `mass` nor `scores`, and
        // `group_sums` rewrites `mass` only after two more barriers.
        add_chunk_mass(&mass, &mut scores, r, lane, first, count, length, stride, block_size, blocks);
        first += count;
    }
    sync_cube();

    let mut chosen = SharedMemory::<u32>::new(rows * n);
    let mut taken = SharedMemory::<u32>::new(rows);
    take_best_in_plane(&mut scores, &mut chosen, &mut taken, start / block_size, t / block_size, r, lane, blocks, n);
    if cube.active {
        write_list::<I, Tensor<I>>(list, &chosen, &taken, offset3::<I>(list, b, t, hk), r, lane, n);
    }
}

/// The log-sum-exps of the staged query rows (0 for padding rows and rows past the sequence),
/// and the queries' block scores zeroed.
#[cube]
#[allow(clippy::too_many_arguments)]
fn stage_row_stats(
    lse: &Tensor<f32>,
    stats: &mut SharedMemory<f32>,
    scores: &mut SharedMemory<f32>,
    b: usize,
    hk: usize,
    t0: usize,
    #[comptime] g: usize,
    #[comptime] rows: usize,
    #[comptime] row_tiles: usize,
    #[comptime] blocks: usize,
) {
    let t_len = lse.shape(1);
    let mut idx = UNIT_POS as usize;
    while idx < row_tiles * MMA_M {
        let mut value = 0.0f32;
        if idx < rows * g && t0 + idx / g < t_len {
            value = lse[offset3::<f32>(lse, b, t0 + idx / g, hk * g + idx % g)];
        }
        stats[idx] = value;
        idx += CUBE_DIM as usize;
    }
    idx = UNIT_POS as usize;
    while idx < rows * blocks {
        scores[idx] = 0.0f32;
        idx += CUBE_DIM as usize;
    }
}
