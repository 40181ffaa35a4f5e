//! The decode step's tile kernels: one cube per `(tile, b * H_kv + hk)` attends one tile of a
//! branch's cache rows for the group's `g` heads ([`super::tile`]) and writes its partial.
//! [`decode_tiles`] runs the compressed branch (keeping its raw scores for the selection) and
//! the window; [`decode_selected_tiles`], after the selection, the chosen blocks.

use cubecl::prelude::*;

use super::tile::{finish_tile, keep_scores, partial_at, score_tile, stage_queries, TileShared};
use crate::kernel::compression::visible::visible_blocks;
use crate::kernel::primitives::rows::offset3;
use crate::tile_sizes::DECODE_TILE as TILE;

/// Tiles of [`TILE`] rows it takes to hold `rows` rows.
#[cube]
pub fn tiles_of(rows: usize) -> usize {
    (rows + TILE - 1) / TILE
}

/// `q [B, 1, H_q, d_k]`, the compressed blocks and the window ring (`[B, S, H_kv, d]` as vectors
/// of `vector` elements, any strides but contiguous rows), the positions `[B]` -> the partials
/// `[B * H_kv, tiles_c + tiles_w, g, 2 + d_v]` of the compressed branch's tiles
/// (`tiles_c = ceil(N / TILE)`) then the window's, and the compressed branch's scaled scores
/// `[B * H_kv, N, g]`. Tiles past the visible blocks or the ring's filled slots write nothing
/// (the merge stops before them).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn decode_tiles<F: Float, I: Int, N: Size>(
    q: &Tensor<F>,
    compressed_k: &Tensor<Vector<F, N>>,
    compressed_v: &Tensor<Vector<F, N>>,
    window_k: &Tensor<Vector<F, N>>,
    window_v: &Tensor<Vector<F, N>>,
    positions: &Tensor<I>,
    partials: &mut Tensor<f32>,
    scores: &mut Tensor<f32>,
    scale: f32,
    #[comptime] length: usize,
    #[comptime] stride: usize,
    #[comptime] g: usize,
    #[comptime] d_k: usize,
    #[comptime] d_v: usize,
    #[comptime] vector: usize,
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    let h_kv = compressed_k.shape(2);
    let (tile, bh) = (CUBE_POS_X as usize, CUBE_POS_Y as usize);
    let (b, hk) = (bh / h_kv, bh % h_kv);
    let t = u32::cast_from(positions[b]) as usize;
    let n_compressed = compressed_k.shape(1);
    let tiles_c = tiles_of(n_compressed);
    let compressed = tile < tiles_c;
    let mut first = tile * TILE;
    let mut end = visible_blocks(t, n_compressed, length, stride);
    if !compressed {
        first = (tile - tiles_c) * TILE;
        end = min(t + 1, window_k.shape(1));
    }
    if first >= end {
        terminate!();
    }
    let count = min(end - first, TILE);
    let at = partial_at(bh, tile, 0, partials.shape(1), g, d_v);

    let mut shared = TileShared::new(g, d_k, d_v);
    stage_queries::<F>(q, &mut shared, b, hk, scale, g, d_k);
    if compressed {
        score_tile::<F, N>(compressed_k, &mut shared, b, hk, first, count, g, d_k, vector);
        keep_scores(&shared, scores, (bh * n_compressed + first) * g, count, g);
        finish_tile::<F, N>(&mut shared, compressed_v, partials, b, hk, first, count, at, g, d_v, vector);
    } else {
        score_tile::<F, N>(window_k, &mut shared, b, hk, first, count, g, d_k, vector);
        finish_tile::<F, N>(&mut shared, window_v, partials, b, hk, first, count, at, g, d_v, vector);
    }
}

/// `q`, the selected branch's cache (`[B, S, H_kv, d]` as vectors of `vector` elements), the
/// positions and the block lists
/// `[B, 1, H_kv, n]` -> the partials `[B * H_kv, first_tile + n * parts, g, 2 + d_v]`: tile
/// `first_tile + slot * parts + part` holds rows `part * TILE..` of the slot's block (`parts = ceil(block_size / TILE)`),
/// those after the position `t` masked; an unused slot's tiles are empty.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn decode_selected_tiles<F: Float, I: Int, N: Size>(
    q: &Tensor<F>,
    selected_k: &Tensor<Vector<F, N>>,
    selected_v: &Tensor<Vector<F, N>>,
    positions: &Tensor<I>,
    list: &Tensor<I>,
    partials: &mut Tensor<f32>,
    scale: f32,
    #[comptime] first_tile: usize,
    #[comptime] block_size: usize,
    #[comptime] g: usize,
    #[comptime] d_k: usize,
    #[comptime] d_v: usize,
    #[comptime] vector: usize,
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    let h_kv = selected_k.shape(2);
    let (tile, bh) = (CUBE_POS_X as usize, CUBE_POS_Y as usize);
    let (b, hk) = (bh / h_kv, bh % h_kv);
    let t = u32::cast_from(positions[b]) as usize;
    let parts = comptime!(block_size.div_ceil(TILE));
    let (slot, part) = (tile / parts, tile % parts);
    let j = i32::cast_from(list[offset3::<I>(list, b, 0, hk) + slot * list.stride(3)]);
    let mut first = 0usize;
    let mut count = 0usize;
    if j >= 0 {
        let block = u32::cast_from(j) as usize * block_size;
        first = block + part * TILE;
        let end = min(block + block_size, t + 1);
        if first < end {
            count = min(end - first, TILE);
        }
    }
    let at = partial_at(bh, first_tile + tile, 0, partials.shape(1), g, d_v);

    let mut shared = TileShared::new(g, d_k, d_v);
    stage_queries::<F>(q, &mut shared, b, hk, scale, g, d_k);
    score_tile::<F, N>(selected_k, &mut shared, b, hk, first, count, g, d_k, vector);
    finish_tile::<F, N>(&mut shared, selected_v, partials, b, hk, first, count, at, g, d_v, vector);
}
