//! Where a query-side cube (forward, dQ) sits and which row each of its units serves.
//!
//! Cubes are numbered `(b, hk, tile)` with the tile fastest; a tile is `queries = rows / g`
//! consecutive positions. Unit `u` serves part `u % parts` of row `u / parts`, and row `r` is
//! query `t0 + r / g`, head `hk * g + r % g`. Rows past the sequence end (the last tile of a
//! ragged `T`) still take part in staging and barriers but write nothing.

use cubecl::prelude::*;

use super::fragments::MMA_M;
use super::rows::{attends, block_range, document_start, offset3, range_count};

#[derive(CubeType, Clone)]
pub struct QueryCube {
    /// False for the surplus cubes of a rounded-up launch grid.
    pub exists: bool,
    pub b: usize,
    pub hk: usize,
    /// The tile's first query and one past its last.
    pub t0: usize,
    pub t_end: usize,
    /// This unit's query (clamped into the sequence when inactive), head, row and part.
    pub t: usize,
    pub h: usize,
    pub row: usize,
    pub part: usize,
    /// The row is a real query.
    pub active: bool,
}

#[cube]
impl QueryCube {
    pub fn new<E: CubePrimitive>(
        q: &Tensor<E>,
        k: &Tensor<E>,
        #[comptime] rows: usize,
        #[comptime] parts: usize,
    ) -> QueryCube {
        let (t_len, h_q, h_kv) = (q.shape(1), q.shape(2), k.shape(2));
        let g = h_q / h_kv;
        let queries = rows / g;
        let tiles = t_len.div_ceil(queries);
        let cube = CUBE_POS;
        let exists = cube < q.shape(0) * h_kv * tiles;
        let tile = cube % tiles;
        let hk = (cube / tiles) % h_kv;
        let b = cube / (tiles * h_kv);
        let unit = UNIT_POS as usize;
        let row = unit / parts;
        let t0 = tile * queries;
        let mut t_end = t0 + queries;
        if t_end > t_len {
            t_end = t_len;
        }
        let mut t = t0 + row / g;
        // Units past `rows` (the padding rows of a tensor-core cube) serve no query.
        let active = t < t_len && row < rows;
        if !active {
            t = t_len - 1;
        }
        QueryCube { exists, b, hk, t0, t_end, t, h: hk * g + row % g, row, part: unit % parts, active }
    }

    /// Key ranges the cube walks: the union of its queries' windows, or the selection slots of
    /// its single query.
    pub fn range_count<I: Int>(&self, blocks: &Tensor<I>, #[comptime] window: bool) -> usize {
        range_count::<I>(blocks, window)
    }

    /// Range `r` as `[start, end)`; the same for every unit of the cube.
    pub fn key_range<I: Int>(
        &self,
        blocks: &Tensor<I>,
        r: usize,
        span: usize,
        #[comptime] window: bool,
    ) -> (usize, usize) {
        let mut start = 0usize;
        let mut end = self.t_end;
        if window {
            if self.t0 + 1 > span {
                start = self.t0 + 1 - span;
            }
        } else {
            let slots = offset3::<I>(blocks, self.b, self.t0, self.hk);
            let (s, e) = block_range::<I>(blocks, slots, r, self.t0, span);
            start = s;
            end = e;
        }
        (start, end)
    }

    /// Whether this unit's query attends key `s` of a walked range.
    pub fn attends(&self, s: usize, span: usize, #[comptime] window: bool) -> bool {
        attends(self.t, s, span, window) && self.active
    }
}

/// The two rows a lane holds: `l / 4` and `l / 4 + 8` of its plane's tile.
#[derive(CubeType)]
pub struct LaneRows {
    /// Query position (clamped into the sequence when inactive) and head of each row.
    pub t: Array<usize>,
    pub h: Array<usize>,
    /// The row is a real query.
    pub active: Array<bool>,
    /// The row's first key: its document's start (0 without documents).
    pub start: Array<usize>,
}

#[cube]
impl LaneRows {
    /// The lane's rows; with `documents`, their starts from `starts` (`[B, T]`, never read
    /// without).
    #[allow(clippy::too_many_arguments)]
    pub fn new<I: Int>(
        cube: &QueryCube,
        plane: usize,
        lane: usize,
        g: usize,
        #[comptime] rows: usize,
        t_len: usize,
        starts: &Tensor<I>,
        #[comptime] documents: bool,
    ) -> LaneRows {
        let mut t = Array::<usize>::new(2usize);
        let mut h = Array::<usize>::new(2usize);
        let mut active = Array::<bool>::new(2usize);
        let mut start = Array::<usize>::new(2usize);
        #[unroll]
        for half in 0..2usize {
            let row = plane * MMA_M + lane / 4 + 8 * half;
            let pos = cube.t0 + row / g;
            let real = row < rows && pos < t_len;
            t[half] = select(real, pos, t_len - 1);
            h[half] = cube.hk * g + row % g;
            active[half] = real;
            start[half] = document_start::<I>(starts, cube.b, t[half], documents);
        }
        LaneRows { t, h, active, start }
    }
}

/// Where a query cube's keys begin: `(first, last_start)`, the first key of its walk (the start
/// of its first query's window, or of that query's document when later) and the document
/// start of its last query (0 without documents; [`crate::kernel::primitives::softmax::tile_needs_mask`]
/// masks every tile before it).
#[cube]
pub fn walk_start<I: Int>(
    cube: &QueryCube,
    span: usize,
    starts: &Tensor<I>,
    #[comptime] documents: bool,
) -> (usize, usize) {
    let mut first = 0usize;
    if cube.t0 + 1 > span {
        first = cube.t0 + 1 - span;
    }
    let first_start = document_start::<I>(starts, cube.b, cube.t0, documents);
    let last_start = document_start::<I>(starts, cube.b, cube.t_end - 1, documents);
    (max(first, first_start), last_start)
}
