//! Inverts the block index: for each `(b, h_kv, block)`, the queries that selected it, as
//! compressed rows (`counts`, exclusive-scan `offsets`, and `entries` of `[B, H_kv, T * n]`).
//! Counting and filling use integer atomics; the order of queries inside a block follows the
//! atomics, which only changes the summation order of `dk`/`dv`.
//!
//! Each block's list is cut into segments of at most `segment` queries, one key cube each, so
//! a block every query picks (block 0 is forced) does not leave one cube with all the work.
//! `segment_base [B, H_kv, n_blocks]` numbers a block's first segment within its `(b, hk)`,
//! `segment_block [B, H_kv, max_segments]` maps a segment back to its block, and
//! `segment_total [B, H_kv]` counts them.

use cubecl::prelude::*;

/// Decodes slot `pos` of `blocks [B, T, H_kv, n]` (numbered in row-major order) into
/// `(b, t, hk)` and the listed block (negative for an unused slot). Reads through the strides:
/// a block list made by Burn on CUDA may have padded rows.
#[cube]
fn slot_of<I: Int>(blocks: &Tensor<I>, pos: usize) -> (usize, usize, usize, i32) {
    let (t_len, h_kv, n) = (blocks.shape(1), blocks.shape(2), blocks.shape(3));
    let i = pos % n;
    let hk = (pos / n) % h_kv;
    let t = (pos / (n * h_kv)) % t_len;
    let b = pos / (n * h_kv * t_len);
    let at = b * blocks.stride(0) + t * blocks.stride(1) + hk * blocks.stride(2) + i * blocks.stride(3);
    (b, t, hk, i32::cast_from(blocks[at]))
}

/// The slots of a cube of the counting and filling kernels: `rows` consecutive positions
/// (`CUBE_POS_X`) of batch row `CUBE_POS_Y`, whose slots are contiguous in row-major order;
/// `(start, end)` and how many of each KV head's first blocks the cube tallies in shared
/// memory (`hot_bins / H_kv`).
#[cube]
fn cube_slots<I: Int>(
    blocks: &Tensor<I>,
    #[comptime] rows: usize,
    #[comptime] hot_bins: usize,
) -> (usize, usize, usize) {
    let (t_len, h_kv, n) = (blocks.shape(1), blocks.shape(2), blocks.shape(3));
    let (b, t0) = (CUBE_POS_Y as usize, CUBE_POS_X as usize * rows);
    let per_row = h_kv * n;
    let start = (b * t_len + min(t0, t_len)) * per_row;
    let end = (b * t_len + min(t0 + rows, t_len)) * per_row;
    (start, end, hot_bins / h_kv)
}

/// Zeroes a cube's tallies.
#[cube]
fn clear_tallies(tallies: &mut SharedMemory<Atomic<u32>>, #[comptime] hot_bins: usize) {
    let mut bin = UNIT_POS as usize;
    while bin < hot_bins {
        tallies[bin].store(0u32);
        bin += CUBE_DIM as usize;
    }
}

/// Tallies the cube's slots `start..end` whose block `j` is among its KV head's first `hot`
/// (bin `hk * hot + j`). With `count_rest` (the count) every other listed block is added to
/// `rest[b, hk, j]` at once; the fill leaves those for its second pass.
#[cube]
#[allow(clippy::too_many_arguments)]
fn tally_slots<I: Int>(
    blocks: &Tensor<I>,
    tallies: &mut SharedMemory<Atomic<u32>>,
    rest: &mut Tensor<Atomic<u32>>,
    start: usize,
    end: usize,
    hot: usize,
    n_blocks: usize,
    #[comptime] count_rest: bool,
) {
    let (b, h_kv) = (CUBE_POS_Y as usize, blocks.shape(2));
    let mut pos = start + UNIT_POS as usize;
    while pos < end {
        let (_b, _t, hk, j) = slot_of::<I>(blocks, pos);
        if j >= 0 {
            let j = u32::cast_from(j) as usize;
            if j < hot {
                tallies[hk * hot + j].fetch_add(1u32);
            } else if count_rest {
                rest[(b * h_kv + hk) * n_blocks + j].fetch_add(1u32);
            }
        }
        pos += CUBE_DIM as usize;
    }
}

/// Adds each of the cube's nonzero tallies to its block's global counter (`global[b, hk, j]`).
/// With `reserve` (the fill) the counter's value before the add, the first of the places the
/// cube reserved, goes to `reserved`, and the tally is zeroed for handing the places out.
#[cube]
#[allow(clippy::too_many_arguments)]
fn flush_tallies(
    tallies: &mut SharedMemory<Atomic<u32>>,
    global: &mut Tensor<Atomic<u32>>,
    reserved: &mut SharedMemory<u32>,
    h_kv: usize,
    hot: usize,
    n_blocks: usize,
    #[comptime] reserve: bool,
) {
    let b = CUBE_POS_Y as usize;
    let mut bin = UNIT_POS as usize;
    while bin < hot * h_kv {
        let tally = tallies[bin].load();
        if tally > 0 {
            let before = global[(b * h_kv + bin / hot) * n_blocks + bin % hot].fetch_add(tally);
            if reserve {
                reserved[bin] = before;
            }
        }
        if reserve {
            tallies[bin].store(0u32);
        }
        bin += CUBE_DIM as usize;
    }
}

/// `counts[b, hk, j] += 1` for every listed block. Every query lists block 0 (forced) and its
/// local blocks, and random selections favour early blocks: one global atomic per slot made
/// 65536 same-address atomics per KV head at 64k. A cube of `rows` queries instead tallies each
/// KV head's first `hot_bins / H_kv` blocks in shared memory and adds each tally once.
#[cube(launch)]
pub fn count_selections<I: Int>(
    blocks: &Tensor<I>,
    counts: &mut Tensor<Atomic<u32>>,
    n_blocks: u32,
    #[comptime] rows: usize,
    #[comptime] hot_bins: usize,
    #[define(I)] _dtype: StorageType,
) {
    let (start, end, hot) = cube_slots::<I>(blocks, rows, hot_bins);
    let (h_kv, n_blocks) = (blocks.shape(2), n_blocks as usize);
    let mut tallies = SharedMemory::<Atomic<u32>>::new(hot_bins);
    // Unused: the count reserves nothing.
    let mut reserved = SharedMemory::<u32>::new(1usize);
    clear_tallies(&mut tallies, hot_bins);
    sync_cube();
    tally_slots::<I>(blocks, &mut tallies, counts, start, end, hot, n_blocks, true);
    sync_cube();
    flush_tallies(&mut tallies, counts, &mut reserved, h_kv, hot, n_blocks, false);
}

/// `offsets[b, hk, :]` = exclusive prefix sum of `counts[b, hk, :]`, and the segments of each
/// block (see the module doc); one cube of `units` units per `(b, hk)`. Each unit takes a run
/// of consecutive blocks: it sums its run, one unit scans the `units` sums in shared memory,
/// and each unit writes its run's offsets and segments from its sum's prefix (one unit walking
/// every block would be a serial chain of global loads).
#[cube(launch)]
pub fn scan_counts(
    counts: &Tensor<u32>,
    offsets: &mut Tensor<u32>,
    segment_base: &mut Tensor<u32>,
    segment_block: &mut Tensor<u32>,
    segment_total: &mut Tensor<u32>,
    segment: u32,
    #[comptime] units: usize,
) {
    let list = CUBE_POS;
    let unit = UNIT_POS as usize;
    let n_blocks = counts.shape(2);
    let max_segments = segment_block.shape(2);
    let run = n_blocks.div_ceil(units);
    let start = min(unit * run, n_blocks);
    let end = min(start + run, n_blocks);

    let mut rows = 0u32;
    let mut segments = 0u32;
    for j in start..end {
        let count = counts[list * n_blocks + j];
        rows += count;
        segments += count.div_ceil(segment);
    }
    let mut row_prefix = SharedMemory::<u32>::new(units);
    let mut segment_prefix = SharedMemory::<u32>::new(units);
    row_prefix[unit] = rows;
    segment_prefix[unit] = segments;
    sync_cube();
    if unit == 0 {
        let mut row_sum = 0u32;
        let mut segment_sum = 0u32;
        for u in 0..units {
            let unit_rows = row_prefix[u];
            let unit_segments = segment_prefix[u];
            row_prefix[u] = row_sum;
            segment_prefix[u] = segment_sum;
            row_sum += unit_rows;
            segment_sum += unit_segments;
        }
        segment_total[list] = segment_sum;
    }
    sync_cube();

    let mut running = row_prefix[unit];
    let mut segment_at = segment_prefix[unit];
    for j in start..end {
        let count = counts[list * n_blocks + j];
        offsets[list * n_blocks + j] = running;
        segment_base[list * n_blocks + j] = segment_at;
        let segment_end = segment_at + count.div_ceil(segment);
        while segment_at < segment_end {
            segment_block[list * max_segments + segment_at as usize] = j as u32;
            segment_at += 1u32;
        }
        running += count;
    }
}

/// Writes each selecting query into its block's rows, and beside it (`slots`, laid out as
/// `entries`) where the block stands in that query's list: the key-major selection forward
/// writes its partial results there ([`crate::kernel::selection::partials`]). Cubes as [`count_selections`]'s:
/// a cube tallies its queries of each first block in shared memory, reserves that many places
/// of the block's rows with one global atomic, and hands them out by shared atomics.
#[cube(launch)]
pub fn fill_selections<I: Int>(
    blocks: &Tensor<I>,
    offsets: &Tensor<u32>,
    cursor: &mut Tensor<Atomic<u32>>,
    entries: &mut Tensor<u32>,
    slots: &mut Tensor<u32>,
    #[comptime] rows: usize,
    #[comptime] hot_bins: usize,
    #[define(I)] _dtype: StorageType,
) {
    let (start, end, hot) = cube_slots::<I>(blocks, rows, hot_bins);
    let (b, h_kv, n_blocks) = (CUBE_POS_Y as usize, blocks.shape(2), offsets.shape(2));
    let mut tallies = SharedMemory::<Atomic<u32>>::new(hot_bins);
    let mut reserved = SharedMemory::<u32>::new(hot_bins);
    clear_tallies(&mut tallies, hot_bins);
    sync_cube();
    tally_slots::<I>(blocks, &mut tallies, cursor, start, end, hot, n_blocks, false);
    sync_cube();
    flush_tallies(&mut tallies, cursor, &mut reserved, h_kv, hot, n_blocks, true);
    sync_cube();
    let mut pos = start + UNIT_POS as usize;
    while pos < end {
        let (_b, t, hk, j) = slot_of::<I>(blocks, pos);
        if j >= 0 {
            let j = u32::cast_from(j) as usize;
            let list = (b * h_kv + hk) * n_blocks + j;
            let place = if j < hot {
                let bin = hk * hot + j;
                reserved[bin] + tallies[bin].fetch_add(1u32)
            } else {
                cursor[list].fetch_add(1u32)
            };
            let entry = (b * h_kv + hk) * entries.shape(2) + (offsets[list] + place) as usize;
            entries[entry] = t as u32;
            slots[entry] = (pos % blocks.shape(3)) as u32;
        }
        pos += CUBE_DIM as usize;
    }
}
