//! The block selection's split of work (see `kernel::selection::top_n`).

use crate::tile_sizes::{SELECTION_CHUNK, SELECTION_LANES, SELECTION_PROB_STRIDE};

/// Block selection (see `kernel::selection::top_n`): a cube of `rows` planes serves `rows`
/// consecutive queries, keeping each one's `blocks` block scores in shared memory beside the
/// queries and a chunk of compressed keys. More rows share each staged key chunk; the scores
/// grow with `T`, so long sequences take fewer rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SelectionTiling {
    pub rows: usize,
    pub blocks: usize,
}

/// Queries a selection cube holds at most.
const SELECTION_ROWS: usize = 8;
/// Shared memory a selection cube may use (dynamic above 48 KiB on CUDA, as [`super::MMA_SHARED`]).
pub const SELECTION_SHARED: usize = 96 * 1024;

impl SelectionTiling {
    /// For `t` queries, blocks of `block_size` tokens, `n` per query, groups of `g` heads of
    /// `d_k`, in `shared` bytes; an error line when even one query's scores do not fit.
    pub fn plan(t: usize, block_size: usize, n: usize, g: usize, d_k: usize, shared: usize) -> Result<Self, String> {
        // Rounded up to a plane, so that nearby lengths share one compiled kernel.
        let blocks = t.div_ceil(block_size).max(1).next_multiple_of(SELECTION_LANES);
        let shared = shared.min(SELECTION_SHARED);
        let fits = |rows: usize| Self { rows, blocks }.shared_floats(g, d_k, n) * 4 <= shared;
        match (1..=SELECTION_ROWS).rev().find(|&rows| fits(rows)) {
            Some(rows) => Ok(Self { rows, blocks }),
            None => Err(format!(
                "sequence too long for the block selection on this device: {} selection blocks of {block_size} \
                 tokens need {} KiB of shared memory, the device gives a cube {} KiB",
                t.div_ceil(block_size),
                Self { rows: 1, blocks }.shared_floats(g, d_k, n) * 4 / 1024,
                shared / 1024
            )),
        }
    }

    /// Shared memory the kernel declares (f32 and u32 words): a chunk of keys (rows padded by
    /// at most 4 words), then per query its `g` query rows and log-sum-exps, block scores, the
    /// chunk's key masses, the argmax's two exchange rows, and the chosen blocks with their count.
    pub fn shared_floats(&self, g: usize, d_k: usize, n: usize) -> usize {
        let per_query = g * d_k + g + self.blocks + SELECTION_CHUNK + 2 * SELECTION_LANES + n + 1;
        SELECTION_CHUNK * (d_k + 4) + self.rows * per_query
    }

    /// The tensor-core kernel's split (`kernel::selection::top_n_mma`): as [`Self::plan`], with
    /// `rows` a power of two that divides the chunk's 16-key groups among the cube's planes.
    pub fn plan_tensor_core(
        t: usize,
        block_size: usize,
        n: usize,
        g: usize,
        d_k: usize,
        shared: usize,
    ) -> Result<Self, String> {
        let blocks = t.div_ceil(block_size).max(1).next_multiple_of(SELECTION_LANES);
        let shared = shared.min(SELECTION_SHARED);
        [8, 4, 2, 1]
            .into_iter()
            .map(|rows| Self { rows, blocks })
            .find(|tiling| tiling.tensor_core_bytes(g, d_k, n) <= shared)
            .ok_or_else(|| format!("{} selection blocks do not fit the tensor-core selection", t.div_ceil(block_size)))
    }

    /// The query rows `(position, head)` of a tensor-core cube, in whole MMA tiles of 16.
    pub fn row_tiles(&self, g: usize) -> usize {
        (self.rows * g).div_ceil(16)
    }

    /// Shared memory the tensor-core kernel declares (bytes): its query rows and a chunk of
    /// keys (16-bit, rows padded by 16 bytes), the query rows' probabilities against the chunk
    /// and log-sum-exps (f32), then per query its block scores, the chunk's key masses and the
    /// chosen blocks with their count (its argmax goes by plane shuffles).
    pub fn tensor_core_bytes(&self, g: usize, d_k: usize, n: usize) -> usize {
        let query_rows = 16 * self.row_tiles(g);
        let staged = (query_rows + SELECTION_CHUNK) * (d_k + 8) * 2;
        let probabilities = query_rows * (SELECTION_PROB_STRIDE + 1) * 4;
        let per_query = self.blocks + SELECTION_CHUNK + n + 1;
        staged + probabilities + self.rows * per_query * 4
    }

    /// f32 elements per shared-memory read of the staged query and key rows: 4 (16 bytes)
    /// where `d_k` allows.
    pub fn vector(d_k: usize) -> usize {
        [4, 2, 1].into_iter().find(|v| d_k.is_multiple_of(*v)).unwrap_or(1)
    }
}
