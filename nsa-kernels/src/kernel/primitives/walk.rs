//! The pipelined walk every tensor-core kernel steps through: a cube walks a range `start..end`
//! (a window's key tiles, or the query rows that attend the cube's keys) `rows` at a time,
//! staging each chunk by asynchronous copies (`cp.async`) into one of two buffers, so that the
//! next chunk's copies fly while the current one is computed.
//!
//! What a chunk's copies are ([`ChunkCopies`], [`super::chunk_copies`]) and what its compute is
//! ([`ChunkCompute`], the kernel's) belong to the kernel; the order of copies, barriers and
//! syncs is [`walk_pipelined`]'s alone.

use cubecl::prelude::barrier::Barrier;
use cubecl::prelude::*;

/// The copies of one chunk into a staging buffer.
#[cube]
pub trait ChunkCopies: CubeType {
    /// Starts the copies of chunk `first..first + count` into buffer `slot` (0 or 1). Rows past
    /// `count` copy the chunk's last real row (finite values, which the kernels mask).
    fn issue(this: &mut Self, first: usize, count: usize, slot: usize);
}

/// What a kernel does with one staged chunk.
#[cube]
pub trait ChunkCompute: CubeType {
    /// Computes chunk `first..first + count` from buffer `slot`, whose copies have landed.
    fn compute(this: &mut Self, first: usize, count: usize, slot: usize);
}

/// Walks `start..end`, `rows` at a time: the first chunk's copies, then per chunk: the next
/// chunk's copies into the other buffer, a wait for the current one's, its compute, and a cube
/// sync before its buffer is reused. The chunk's bounds are scalars and the next chunk's are
/// fresh variables, so nothing the compute reads changes under it.
#[cube]
pub fn walk_pipelined<C: ChunkCopies, K: ChunkCompute>(
    copies: &mut C,
    compute: &mut K,
    start: usize,
    end: usize,
    #[comptime] rows: usize,
) {
    let barriers = TileBarriers::new();
    let (_, first_count) = next_chunk(start, 0usize, end, rows);
    let mut first = start;
    let mut count = first_count;
    let mut slot = 0usize;
    if count > 0 {
        C::issue(copies, first, count, slot);
        barriers.commit(slot);
    }
    while first < end {
        let (next_first, next_count) = next_chunk(first, count, end, rows);
        let next_slot = 1 - slot;
        if next_first < end {
            C::issue(copies, next_first, next_count, next_slot);
            barriers.commit(next_slot);
        }
        barriers.wait(slot);
        K::compute(compute, first, count, slot);
        // The chunk after next overwrites this buffer.
        sync_cube();
        first = next_first;
        count = next_count;
        slot = next_slot;
    }
}

/// The chunk after `first..first + count` in a walk that ends at `end`, `rows` at a time:
/// `(first, count)`, with count 0 past the end.
#[cube]
fn next_chunk(first: usize, count: usize, end: usize, #[comptime] rows: usize) -> (usize, usize) {
    let next = first + count;
    (next, select(next < end, min(end - min(next, end), rows), 0usize))
}

/// One barrier per staging buffer: a unit commits its copies into a buffer to that buffer's
/// barrier, and every unit waits on it before reading the buffer.
#[derive(CubeType)]
struct TileBarriers {
    first: Shared<Barrier>,
    second: Shared<Barrier>,
}

#[cube]
impl TileBarriers {
    fn new() -> TileBarriers {
        TileBarriers {
            first: Barrier::shared(CUBE_DIM, UNIT_POS == 0),
            second: Barrier::shared(CUBE_DIM, UNIT_POS == 0),
        }
    }

    /// Commits this unit's copies into buffer `slot`.
    fn commit(&self, slot: usize) {
        if slot == 0 {
            self.first.commit_copy_async();
        } else {
            self.second.commit_copy_async();
        }
    }

    /// Waits until every unit's copies into buffer `slot` have landed.
    fn wait(&self, slot: usize) {
        if slot == 0 {
            self.first.arrive_and_wait();
        } else {
            self.second.arrive_and_wait();
        }
    }
}
