//! The decode step's tile kernels: one cube per `(tile, b * H_kv + hk)` attends one tile of a
//! branch's cache rows for the group's `g` heads ([`super::tile`]) and writes its partial.
//! [`decode_tiles`] runs the compressed branch (keeping its raw scores for the selection) and
//! the window; [`decode_selected_tiles`], after the selection, the chosen blocks.

use cubecl::prelude::*;

use super::tile::{cache_row, finish_tile, keep_scores, partial_at, score_tile, stage_queries, TileShared};
use super::StepExtent;
use crate::kernel::compression::visible::visible_blocks;
use crate::tile_sizes::DECODE_TILE as TILE;

/// Tiles of [`TILE`] rows it takes to hold `rows` rows.
#[cube]
pub fn tiles_of(rows: usize) -> usize {
    (rows + TILE - 1) / TILE
}

/// `q [B, 1, H_q, d_k]`, the compressed blocks and the window ring (`[B, H_kv, S, d]` as vectors
/// of `vector` elements), the positions `[B]` -> the partials
/// `[B * H_kv, tiles_c + tiles_w, g, 2 + d_v]` of the compressed branch's tiles
/// (`tiles_c = ceil(N / TILE)`) then the window's, and the compressed branch's scaled scores
/// `[B * H_kv, N, g]`. Tiles past the visible blocks or the ring's filled slots write nothing
/// (the merge stops before them).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn decode_tiles<F: Float, I: Int, N: Size>(
    q: &Array<F>,
    compressed_k: &Array<Vector<F, N>>,
    compressed_v: &Array<Vector<F, N>>,
    window_k: &Array<Vector<F, N>>,
    window_v: &Array<Vector<F, N>>,
    positions: &Array<I>,
    partials: &mut Array<f32>,
    scores: &mut Array<f32>,
    extent: StepExtent,
    scale: f32,
    #[comptime] length: usize,
    #[comptime] stride: usize,
    #[comptime] g: usize,
    #[comptime] d_k: usize,
    #[comptime] d_v: usize,
    #[comptime] vector: usize,
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    let (tile, bh) = (CUBE_POS_X as usize, CUBE_POS_Y as usize);
    let t = u32::cast_from(positions[bh / extent.h_kv]) as usize;
    let n_compressed = extent.n_compressed;
    let tiles_c = tiles_of(n_compressed);
    let compressed = tile < tiles_c;
    let mut first = tile * TILE;
    let mut end = visible_blocks(t, n_compressed, length, stride);
    let mut slots = n_compressed;
    if !compressed {
        first = (tile - tiles_c) * TILE;
        end = min(t + 1, extent.ring);
        slots = extent.ring;
    }
    if first >= end {
        terminate!();
    }
    let count = min(end - first, TILE);
    let at = partial_at(bh, tile, 0, extent.tiles, g, d_v);
    let (keys_at, values_at) = (cache_row(bh, first, slots, d_k), cache_row(bh, first, slots, d_v));

    let mut shared = TileShared::new(g, d_k, d_v);
    stage_queries::<F>(q, &mut shared, bh, scale, g, d_k);
    if compressed {
        score_tile::<F, N>(compressed_k, &mut shared, keys_at, count, g, d_k, vector);
        keep_scores(&shared, scores, (bh * n_compressed + first) * g, count, g);
        finish_tile::<F, N>(&mut shared, compressed_v, partials, values_at, count, at, g, d_v, vector);
    } else {
        score_tile::<F, N>(window_k, &mut shared, keys_at, count, g, d_k, vector);
        finish_tile::<F, N>(&mut shared, window_v, partials, values_at, count, at, g, d_v, vector);
    }
}

/// `q`, the selected branch's cache (`[B, H_kv, S, d]` as vectors of `vector` elements), the
/// positions and the block lists
/// `[B, 1, H_kv, n]` -> the partials `[B * H_kv, first_tile + n * parts, g, 2 + d_v]`: tile
/// `first_tile + slot * parts + part` holds rows `part * TILE..` of the slot's block (`parts = ceil(block_size / TILE)`),
/// those after the position `t` masked; an unused slot's tiles are empty.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn decode_selected_tiles<F: Float, I: Int, N: Size>(
    q: &Array<F>,
    selected_k: &Array<Vector<F, N>>,
    selected_v: &Array<Vector<F, N>>,
    positions: &Array<I>,
    list: &Array<I>,
    partials: &mut Array<f32>,
    extent: StepExtent,
    scale: f32,
    #[comptime] first_tile: usize,
    #[comptime] block_size: usize,
    #[comptime] g: usize,
    #[comptime] d_k: usize,
    #[comptime] d_v: usize,
    #[comptime] vector: usize,
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    let (tile, bh) = (CUBE_POS_X as usize, CUBE_POS_Y as usize);
    let t = u32::cast_from(positions[bh / extent.h_kv]) as usize;
    let parts = comptime!(block_size.div_ceil(TILE));
    let (slot, part) = (tile / parts, tile % parts);
    let j = i32::cast_from(list[bh * extent.n + slot]);
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
    let at = partial_at(bh, first_tile + tile, 0, extent.tiles, g, d_v);
    let (keys_at, values_at) = (cache_row(bh, first, extent.max_len, d_k), cache_row(bh, first, extent.max_len, d_v));

    let mut shared = TileShared::new(g, d_k, d_v);
    stage_queries::<F>(q, &mut shared, bh, scale, g, d_k);
    score_tile::<F, N>(selected_k, &mut shared, keys_at, count, g, d_k, vector);
    finish_tile::<F, N>(&mut shared, selected_v, partials, values_at, count, at, g, d_v, vector);
}
