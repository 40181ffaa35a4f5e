//! Register-resident matrix products on CUDA's manual MMA (`mma.sync` m16n8k16, f16/bf16 in,
//! f32 accumulation), the building blocks of the flash kernels ([`crate::kernel::window::forward`]).
//!
//! A plane works on a 16-row tile. In PTX's register layout lane `l` holds, of a `[16, 8]` f32
//! result tile, rows `l / 4` and `l / 4 + 8` at columns `2 (l % 4)` and `+ 1`: one `Pair` per
//! row. Results here are arrays of such tiles, element `2j + half` being tile `j`'s pair for row
//! `half`. Two neighbouring 8-column result tiles, rounded to the storage type, are exactly the
//! A operand of a product over those 16 columns, so a score tile becomes the next product's
//! input without leaving registers. Rows staged in shared memory (16-byte vectors, rows of
//! whole vectors) are read as operands by `ldmatrix`, transposed or not.
//!
//! Two products cover every attention pass: `a . rows^T` ([`products_with_rows`]: scores
//! `q K^T`, `dO V^T`, and on the key side `K Q^T`, `V dO^T`) and `acc += p . rows`
//! ([`accumulate_with_rows`]: `p V`, `ds K`, `p^T dO`, `ds^T Q`).

use cubecl::cmma::{MatrixIdent, MmaDefinition};
use cubecl::prelude::*;

use super::layout::VECTOR;

/// Two elements of one 32-bit register: the unit of every MMA operand here.
pub type Pair<E> = Vector<E, Const<2>>;

/// The MMA shape: rows, columns of a result tile, and the reduced axis.
pub const MMA_M: usize = 16;
pub const MMA_N: usize = 8;
pub const MMA_K: usize = 16;

/// The definition every flash kernel uses.
#[cube]
pub fn mma<F: Float>() -> MmaDefinition<F, F, f32> {
    MmaDefinition::<F, F, f32>::new(MMA_M, MMA_N, MMA_K)
}

/// The A fragments of 16 staged rows (`first_row..first_row + 16`, row stride `stride`
/// elements) over `d` columns, 4 registers per 16 columns: `ldmatrix.x4` of the four 8x8
/// quarters, lane `l` naming row `l % 8` of quarter `l / 8` (quarters in the order of the A
/// registers: rows 0-7 and 8-15 of columns 0-7, then of columns 8-15).
#[cube]
pub fn row_fragments<F: Float, N: Size>(
    def: MmaDefinition<F, F, f32>,
    staged: &SharedMemory<Vector<F, N>>,
    at: usize,
    first_row: usize,
    lane: usize,
    #[comptime] d: usize,
    #[comptime] stride: usize,
) -> Array<Pair<F>> {
    let mut frags = Array::<Pair<F>>::new(comptime!(4 * d / MMA_K));
    let (quarter, r) = (lane / 8, lane % 8);
    let row = first_row + r + 8 * (quarter % 2);
    #[unroll]
    for kk in 0..d / MMA_K {
        let col = kk * MMA_K + 8 * (quarter / 2);
        let regs = load_quarters::<F, N>(def, staged, at + row * stride + col, false);
        #[unroll]
        for i in 0..4usize {
            frags[4 * kk + i] = regs[i];
        }
    }
    frags
}

/// `a . rows^T`: the plane's 16 rows (A fragments over `d` columns, from [`row_fragments`])
/// against `n_rows` staged rows (at element `at`, row stride `stride`), as `n_rows / 8` result
/// tiles. The staged rows are the B operand read column-major, so one non-transposed
/// `ldmatrix.x4` gives two 8-row tiles' B fragments for 16 columns.
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn products_with_rows<F: Float, N: Size>(
    def: MmaDefinition<F, F, f32>,
    a_frags: &Array<Pair<F>>,
    staged: &SharedMemory<Vector<F, N>>,
    at: usize,
    lane: usize,
    #[comptime] d: usize,
    #[comptime] stride: usize,
    #[comptime] n_rows: usize,
) -> Array<Pair<f32>> {
    let mut result = zero_pairs(comptime!(2 * n_rows / MMA_N));
    let (quarter, r) = (lane / 8, lane % 8);
    #[unroll]
    for kk in 0..d / MMA_K {
        let a = operand::<F>(a_frags, 4 * kk, 4usize);
        #[unroll]
        for jj in 0..n_rows / 16 {
            // Quarters: rows 0-7 at columns 0-7, 8-15; then rows 8-15 at the same columns.
            let row = jj * 16 + r + 8 * (quarter / 2);
            let col = kk * MMA_K + 8 * (quarter % 2);
            let b = load_quarters::<F, N>(def, staged, at + row * stride + col, false);
            #[unroll]
            for half_tile in 0..2usize {
                mma_into::<F>(def, &a, &b, 2 * half_tile, &mut result, 2 * jj + half_tile);
            }
        }
    }
    result
}

/// `acc += p . rows`: `p`, result tiles over `n_rows` columns (rounded to the storage type, as
/// flash attention does: two 8-column tiles make one A fragment), times `n_rows` staged rows of
/// `d` columns, into `acc`'s `d / 8` tiles. The staged rows are the B operand read row-major,
/// so a transposed `ldmatrix.x4` gives two 8-column tiles' B fragments.
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn accumulate_with_rows<F: Float, N: Size>(
    def: MmaDefinition<F, F, f32>,
    p: &Array<Pair<f32>>,
    staged: &SharedMemory<Vector<F, N>>,
    at: usize,
    lane: usize,
    acc: &mut Array<Pair<f32>>,
    #[comptime] d: usize,
    #[comptime] stride: usize,
    #[comptime] n_rows: usize,
) {
    #[unroll]
    for kk in 0..n_rows / MMA_K {
        let mut a = Array::<Pair<F>>::new(4usize);
        #[unroll]
        for i in 0..4usize {
            a[i] = Pair::<F>::cast_from(p[4 * kk + i]);
        }
        accumulate_step::<F, N>(def, &a, kk, staged, at, lane, acc, d, stride);
    }
}

/// One 16-row step `kk` of [`accumulate_with_rows`]: `acc += a . rows[16 kk..16 kk + 16]`, `a`
/// an A fragment over those 16 columns.
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn accumulate_step<F: Float, N: Size>(
    def: MmaDefinition<F, F, f32>,
    a: &Array<Pair<F>>,
    kk: usize,
    staged: &SharedMemory<Vector<F, N>>,
    at: usize,
    lane: usize,
    acc: &mut Array<Pair<f32>>,
    #[comptime] d: usize,
    #[comptime] stride: usize,
) {
    let (quarter, r) = (lane / 8, lane % 8);
    #[unroll]
    for nn in 0..d / 16 {
        // Quarters: rows 0-7 and 8-15 of columns 0-7, then of columns 8-15.
        let row = kk * MMA_K + r + 8 * (quarter % 2);
        let col = nn * 16 + 8 * (quarter / 2);
        let b = load_quarters::<F, N>(def, staged, at + row * stride + col, true);
        #[unroll]
        for half_tile in 0..2usize {
            mma_into::<F>(def, &a, &b, 2 * half_tile, acc, 2 * nn + half_tile);
        }
    }
}

/// Writes the lane's result tiles (16 rows, `columns` columns, rounded to the storage type) to
/// rows `first_row..first_row + 16`, columns from `first_col` (even), of a shared tile of pairs
/// (row stride `stride` pairs).
#[cube]
pub fn store_pair_tiles<F: Float>(
    tile: &mut SharedMemory<Pair<F>>,
    tiles: &Array<Pair<f32>>,
    first_row: usize,
    first_col: usize,
    lane: usize,
    #[comptime] columns: usize,
    #[comptime] stride: usize,
) {
    #[unroll]
    for j in 0..columns / MMA_N {
        #[unroll]
        for half in 0..2usize {
            let row = first_row + lane / 4 + 8 * half;
            tile[row * stride + (first_col + j * MMA_N) / 2 + lane % 4] = Pair::<F>::cast_from(tiles[2 * j + half]);
        }
    }
}

/// The A fragment of rows `first_row..first_row + 16`, columns `16 kk..16 kk + 16` of the
/// transpose of a shared tile of pairs (the tile's rows are the fragment's columns; row stride
/// `stride` pairs): `ldmatrix.x4.trans`, lane `l` naming tile row `16 kk + 8 (q / 2) + l % 8`
/// at column `first_row + 8 (q % 2)` for its quarter `q = l / 8`.
#[cube]
pub fn transposed_fragment<F: Float>(
    def: MmaDefinition<F, F, f32>,
    tile: &SharedMemory<Pair<F>>,
    first_row: usize,
    kk: usize,
    lane: usize,
    #[comptime] stride: usize,
) -> Array<Pair<F>> {
    let (quarter, r) = (lane / 8, lane % 8);
    let row = kk * MMA_K + 8 * (quarter / 2) + r;
    let start = row * stride + (first_row + 8 * (quarter % 2)) / 2;
    def.load_matrix::<Pair<F>, Const<2>>(&tile.slice(start, start + 1), MatrixIdent::A, 4usize, true)
}

/// `ldmatrix.x4` (optionally transposed) of the four 8x8 quarters whose row this lane names at
/// element `at` of `staged` (a multiple of the 16-byte vector).
#[cube]
fn load_quarters<F: Float, N: Size>(
    def: MmaDefinition<F, F, f32>,
    staged: &SharedMemory<Vector<F, N>>,
    at: usize,
    #[comptime] transpose: bool,
) -> Array<Pair<F>> {
    let start = at / VECTOR;
    def.load_matrix::<Vector<F, N>, Const<2>>(&staged.slice(start, start + 1), MatrixIdent::B, 4usize, transpose)
}

/// `acc`'s result tile `tile` += `a` times the B fragment at registers `b_at`, `b_at + 1` of `b`.
#[cube]
fn mma_into<F: Float>(
    def: MmaDefinition<F, F, f32>,
    a: &Array<Pair<F>>,
    b: &Array<Pair<F>>,
    b_at: usize,
    acc: &mut Array<Pair<f32>>,
    tile: usize,
) {
    let b_frag = operand::<F>(b, b_at, 2usize);
    let c = operand::<f32>(acc, 2 * tile, 2usize);
    let d = def.execute(a, &b_frag, &c);
    acc[2 * tile] = d[0];
    acc[2 * tile + 1] = d[1];
}

/// `len` registers of `regs` from `at`: one MMA operand.
#[cube]
fn operand<E: Numeric>(regs: &Array<Pair<E>>, at: usize, #[comptime] len: usize) -> Array<Pair<E>> {
    let mut part = Array::<Pair<E>>::new(len);
    #[unroll]
    for i in 0..len {
        part[i] = regs[at + i];
    }
    part
}

/// `len` f32 register pairs of zeros.
#[cube]
pub fn zero_pairs(#[comptime] len: usize) -> Array<Pair<f32>> {
    let mut regs = Array::<Pair<f32>>::new(len);
    #[unroll]
    for i in 0..len {
        regs[i] = Pair::<f32>::new(0.0f32);
    }
    regs
}

/// Multiplies result tiles' rows by a per-row factor (`factor[half]`).
#[cube]
pub fn scale_rows(tiles: &mut Array<Pair<f32>>, factor: &Array<f32>, #[comptime] n_tiles: usize) {
    #[unroll]
    for j in 0..n_tiles {
        #[unroll]
        for half in 0..2usize {
            tiles[2 * j + half] = tiles[2 * j + half] * Pair::<f32>::new(factor[half]);
        }
    }
}

/// Writes the lane's two rows of result tiles over `d` columns, times `factor[half]`, to the
/// rows of `dst` starting at `base[half]` where `write[half]`: its columns `2 (l % 4)`, `+ 1`
/// of each tile.
#[cube]
pub fn store_tiles<F: Float>(
    dst: &mut Tensor<F>,
    base: &Array<usize>,
    write: &Array<bool>,
    tiles: &Array<Pair<f32>>,
    factor: &Array<f32>,
    lane: usize,
    #[comptime] d: usize,
) {
    let column = 2 * (lane % 4);
    #[unroll]
    for half in 0..2usize {
        if write[half] {
            let row = base[half] + column;
            #[unroll]
            for j in 0..d / MMA_N {
                let o = tiles[2 * j + half];
                #[unroll]
                for e in 0..2usize {
                    dst[row + j * MMA_N + e] = F::cast_from(o[e] * factor[half]);
                }
            }
        }
    }
}

/// Writes the lane's two rows of result tiles (`d` columns, already scaled, rounded to the
/// storage type) to `dst` as whole 16-byte vectors, where `write[half]`: row `half` starts at
/// vector `row_at[half]`. A quad holds a row's 8-column tiles 2 columns per lane; a 4x4
/// transpose of pairs by two rounds of shuffles gives lane `c` whole tiles `4m + c`, so a plane
/// writes 64 contiguous bytes per row and instruction rather than 2-element pieces.
#[cube]
pub fn store_rows_whole<F: Float, N: Size>(
    dst: &mut Tensor<Vector<F, N>>,
    row_at: &Array<usize>,
    write: &Array<bool>,
    tiles: &Array<Pair<f32>>,
    lane: usize,
    #[comptime] d: usize,
) {
    let c = lane % 4;
    let n_tiles = comptime!(d / MMA_N);
    #[unroll]
    for half in 0..2usize {
        #[unroll]
        for m in 0..n_tiles.div_ceil(4) {
            // Item `k`: tile `4m + k`'s pair of this row (zero past the last tile).
            let mut items = Array::<Pair<f32>>::new(4usize);
            #[unroll]
            for k in 0..4usize {
                items[k] = Pair::<f32>::new(0.0f32);
                if comptime!(4 * m + k < n_tiles) {
                    items[k] = tiles[2 * (4 * m + k) + half];
                }
            }
            transpose_quad(&mut items, c, 2usize);
            transpose_quad(&mut items, c, 1usize);
            // Now item `k` is lane `k`'s pair of tile `4m + c`: columns `2k`, `2k + 1`.
            if write[half] && 4 * m + c < n_tiles {
                let mut vector = Vector::<F, N>::empty();
                #[unroll]
                for k in 0..4usize {
                    vector[2 * k] = F::cast_from(items[k][0]);
                    vector[2 * k + 1] = F::cast_from(items[k][1]);
                }
                let at = row_at[half] + 4 * m + c;
                dst[at] = vector;
            }
        }
    }
}

/// One round of a quad's 4x4 transpose of pairs (lane `c` holding row `c`): lanes `c` and
/// `c ^ bit` swap the items whose index differs from `c` in `bit` (`bit` 2, then 1).
#[cube]
fn transpose_quad(items: &mut Array<Pair<f32>>, c: usize, #[comptime] bit: usize) {
    let low = comptime!(if bit == 2 { 1usize } else { 2usize });
    let keeps_low = (c / bit) % 2 == 0;
    let mask = comptime!(bit as u32);
    #[unroll]
    for i in 0..2usize {
        // The pair of items this round may swap: index `i * low` with or without `bit`.
        let (without, with) = (comptime!(i * low), comptime!(i * low + bit));
        let sent = select_pair(keeps_low, items[with], items[without]);
        let mut got = Pair::<f32>::new(0.0f32);
        got[0] = plane_shuffle_xor(sent[0], mask);
        got[1] = plane_shuffle_xor(sent[1], mask);
        if keeps_low {
            items[with] = got;
        } else {
            items[without] = got;
        }
    }
}

/// `a` where `cond`, else `b`.
#[cube]
fn select_pair(cond: bool, a: Pair<f32>, b: Pair<f32>) -> Pair<f32> {
    let mut out = b;
    out[0] = select(cond, a[0], b[0]);
    out[1] = select(cond, a[1], b[1]);
    out
}
