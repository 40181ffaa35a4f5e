//! Where a block-selection cube sits and which query each of its planes serves, for both
//! top-n kernels ([`super::top_n`], [`super::top_n_mma`]).
//!
//! Cubes are numbered `(b, hk, tile)` with the tile fastest; a tile is `rows` consecutive
//! queries, one plane of `LANES` units each (unit `(lane, r)` is lane `lane` of query row `r`).
//! Rows past the sequence end (the last tile of a ragged `T`) take part in every barrier with
//! the last query's position and write nothing.

use cubecl::prelude::*;

#[derive(CubeType, Clone)]
pub struct SelectionCube {
    /// False for the surplus cubes of a rounded-up launch grid.
    pub exists: bool,
    pub b: usize,
    pub hk: usize,
    /// The tile's first query and its last real one.
    pub t0: usize,
    pub t_last: usize,
    /// This plane's query row, its position (clamped into the sequence) and this unit's lane.
    pub r: usize,
    pub t: usize,
    pub lane: usize,
    /// The row is a real query, whose list is written.
    pub active: bool,
}

#[cube]
impl SelectionCube {
    /// The cube of `CUBE_POS` over `batch` sequences of `t_len` queries and `h_kv` KV heads.
    pub fn new(batch: usize, t_len: usize, h_kv: usize, #[comptime] rows: usize) -> SelectionCube {
        let tiles = t_len.div_ceil(rows);
        let cube = CUBE_POS;
        let tile = cube % tiles;
        let t0 = tile * rows;
        let r = UNIT_POS_Y as usize;
        SelectionCube {
            exists: cube < batch * h_kv * tiles,
            b: cube / (tiles * h_kv),
            hk: (cube / tiles) % h_kv,
            t0,
            t_last: min(t0 + rows, t_len) - 1,
            r,
            t: min(t0 + r, t_len - 1),
            lane: UNIT_POS_X as usize,
            active: t0 + r < t_len,
        }
    }
}
