//! Where a key-side cube (dK, dV) sits: its keys and the query rows that attend them.
//!
//! Cubes are numbered `(b, hk, tile)` with the tile fastest. A window's tile is `keys`
//! consecutive keys and its query rows `(t, h)` (`h` fastest) have `t` in the contiguous
//! `[s0, s_end - 1 + w)`. A selection's tile is sub-tile `u` of the block of segment `item` (see
//! [`crate::kernel::selection::index`]), and its query rows are that segment's part of the block's list.

use cubecl::prelude::*;

use super::rows::offset3;

/// A selection's inverted index as the key kernels read it ([`crate::kernel::selection::index`]):
/// per block list `offsets` and `counts` `[B, H_kv, n_blocks]` into the listed rows `entries`
/// `[B, H_kv, T * n]`, and the lists' segments, one key cube each: `segment_base` (a list's
/// first segment), `segment_block` (a segment's block) and `segment_total` `[B, H_kv]`.
/// Placeholders for a window.
#[derive(CubeLaunch, CubeType)]
pub struct BlockLists {
    pub offsets: Tensor<u32>,
    pub counts: Tensor<u32>,
    pub entries: Tensor<u32>,
    pub segment_base: Tensor<u32>,
    pub segment_block: Tensor<u32>,
    pub segment_total: Tensor<u32>,
}

#[derive(CubeType, Clone)]
pub struct KeyCube {
    /// False for surplus cubes: past the grid, past this `(b, hk)`'s segments, or a sub-tile
    /// wholly past the end of a ragged last block.
    pub exists: bool,
    pub b: usize,
    pub hk: usize,
    /// Query heads per KV head, fixed at compile time: the walks divide by it once per
    /// walked row, and a constant divisor is a multiply where a runtime one is a dozen
    /// instructions.
    #[cube(comptime)]
    pub g: usize,
    /// The selected block and the segment (selection only).
    pub j: usize,
    pub item: usize,
    /// The cube's keys `[s0, s_end)`.
    pub s0: usize,
    pub s_end: usize,
    /// Query rows the cube walks, and where a selection's list part starts in `entries`.
    pub n_rows: usize,
    pub list_at: usize,
}

#[cube]
impl KeyCube {
    #[allow(clippy::too_many_arguments)]
    pub fn new<E: CubePrimitive>(
        q: &Tensor<E>,
        k: &Tensor<E>,
        lists: &BlockLists,
        span: usize,
        segment: usize,
        #[comptime] window: bool,
        #[comptime] keys: usize,
        #[comptime] g: usize,
    ) -> KeyCube {
        let (t_len, h_kv) = (q.shape(1), k.shape(2));
        let mut sub_tiles = 1usize;
        let mut tiles = t_len.div_ceil(keys);
        if !window {
            sub_tiles = span.div_ceil(keys);
            tiles = lists.segment_block.shape(2) * sub_tiles;
        }
        let cube = CUBE_POS;
        let mut exists = cube < q.shape(0) * h_kv * tiles;
        let tile = cube % tiles;
        let hk = (cube / tiles) % h_kv;
        let b = cube / (tiles * h_kv);
        let item = tile / sub_tiles;
        let mut j = 0usize;
        let mut s0 = tile * keys;
        let mut s_end = s0 + keys;
        if !window && exists {
            // The grid is sized for the most segments a `(b, hk)` can have.
            if item >= lists.segment_total[b * h_kv + hk] as usize {
                exists = false;
            } else {
                j = lists.segment_block[offset3::<u32>(&lists.segment_block, b, hk, item)] as usize;
                s0 = j * span + (tile % sub_tiles) * keys;
                s_end = min(s0 + keys, j * span + span);
            }
        }
        s_end = min(s_end, t_len);
        if s0 >= s_end {
            exists = false;
        }
        let mut n_rows = 0usize;
        let mut list_at = 0usize;
        if exists {
            if window {
                n_rows = (min(t_len, s_end - 1 + span) - s0) * g;
            } else {
                let list = offset3::<u32>(&lists.offsets, b, hk, j);
                let first = (item - lists.segment_base[list] as usize) * segment;
                list_at = (b * h_kv + hk) * lists.entries.shape(2) + lists.offsets[list] as usize + first;
                n_rows = min(lists.counts[list] as usize - first, segment) * g;
            }
        }
        KeyCube { exists, b, hk, g, j, item, s0, s_end, n_rows, list_at }
    }

    /// A window's walked rows (positions from `s0`, `g` heads each) that come before `end`, the
    /// end of the document of the cube's last key ([`super::rows::document_end`]): no later row
    /// attends the cube. `n_rows` itself where `end` is the row's length.
    pub fn window_rows_before(&self, end: usize) -> usize {
        let g = comptime!(self.g);
        min(self.n_rows, (end - self.s0) * g)
    }

    /// Query position of walked row `at`.
    pub fn query_of(&self, entries: &Tensor<u32>, at: usize, #[comptime] window: bool) -> usize {
        let g = comptime!(self.g);
        let mut t = self.s0 + at / g;
        if !window {
            t = entries[self.list_at + at / g] as usize;
        }
        t
    }

    /// Query head of walked row `at` (rows run over the KV head's `g` query heads fastest).
    pub fn head_of(&self, at: usize) -> usize {
        let g = comptime!(self.g);
        self.hk * g + at % g
    }

    /// Row of key `s` in a selection's `partial [B * H_kv, segments, span * (d_k + d_v)]`.
    pub fn partial_row(&self, segments: usize, h_kv: usize, s: usize, span: usize) -> usize {
        segment_row(self.b, self.hk, h_kv, segments, self.item, s - self.j * span, span)
    }
}

/// Row of `partial [B * H_kv, segments, span * (d_k + d_v)]` holding segment `item`'s share
/// for key `key` of its block (`key < span`), written by the key kernel, read by `sum_segments`.
#[cube]
pub fn segment_row(b: usize, hk: usize, h_kv: usize, segments: usize, item: usize, key: usize, span: usize) -> usize {
    ((b * h_kv + hk) * segments + item) * span + key
}

/// The two walked rows a lane holds (`l / 4` and `l / 4 + 8` of its plane's tile): query
/// position, head, and whether the row exists.
#[derive(CubeType)]
pub struct ListedRows {
    pub t: Array<usize>,
    pub h: Array<usize>,
    pub real: Array<bool>,
}

#[cube]
impl ListedRows {
    /// The lane's rows of the plane's tile at row `tile` of the chunk of walked rows
    /// `first..first + count`, whose positions stand at `positions[at..]`.
    #[allow(clippy::too_many_arguments)]
    pub fn in_chunk(
        positions: &SharedMemory<u32>,
        cube: &KeyCube,
        at: usize,
        first: usize,
        tile: usize,
        count: usize,
        lane: usize,
    ) -> ListedRows {
        let mut t = Array::<usize>::new(2usize);
        let mut h = Array::<usize>::new(2usize);
        let mut real = Array::<bool>::new(2usize);
        #[unroll]
        for half in 0..2usize {
            let local = tile + lane / 4 + 8 * half;
            let is_real = local < count;
            let row = first + select(is_real, local, 0usize);
            t[half] = positions[at + local] as usize;
            h[half] = cube.head_of(row);
            real[half] = is_real;
        }
        ListedRows { t, h, real }
    }
}
