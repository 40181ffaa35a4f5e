//! How the kernels split work over cubes and units: chosen on the host from the head dims, the
//! group size and the device's shared-memory limit, and passed to the kernels as comptime values.
//!
//! A row (one query head's row, or one key row) is split over `parts` units, each holding every
//! `parts`-th element of the row's vectors in registers. Splitting keeps the per-unit registers
//! near 128 floats, so a `d = 128` row does not spill to local memory, and lets a cube with few
//! rows still have enough units.

/// Registers (f32) a unit may spend on row vectors before `parts` doubles.
const ROW_REGISTERS: usize = 128;
/// Units a cube aims for.
const CUBE_UNITS: usize = 128;
/// Keys (query side) or query rows (key side) staged in shared memory per step.
const CHUNK: usize = 16;

/// Whether the portable kernels unroll their loops over a row's slice and a chunk's keys.
/// Unrolled, a unit's slices and scores live in registers, which a GPU's compiler needs to be
/// told. Mesa's lavapipe (WGPU on the CPU) runs a cube's units as a coroutine per barrier, and
/// LLVM's coroutine lowering of an unrolled kernel takes minutes; as loops it takes seconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unroll(pub bool);

/// Query-side kernels (forward, dQ): a cube holds `rows = queries * g` rows `(t, h)`, the `g`
/// heads of one KV head for `queries` consecutive positions, and walks their keys in chunks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueryTiling {
    pub parts: usize,
    pub rows: usize,
    pub chunk: usize,
    /// Whether the kernel unrolls its loops over a row's slice and a chunk's keys ([`Unroll`]).
    pub unroll: bool,
}

/// Key-side kernel (dK, dV): a cube holds `keys` consecutive key rows of one KV head and walks
/// the query rows that attend them in chunks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyTiling {
    pub parts: usize,
    pub keys: usize,
    pub chunk: usize,
    /// As [`QueryTiling::unroll`].
    pub unroll: bool,
}

/// Which query-side kernel is planned: they keep different vectors in registers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueryPass {
    /// `q` and the output accumulator.
    Forward,
    /// `q`, `dO` and the `dq` accumulator.
    Gradient,
}

impl QueryTiling {
    /// `window`: a cube takes consecutive queries, whose windows overlap almost entirely.
    /// Otherwise (selected blocks differ per query) a cube takes one query and more parts.
    pub fn plan(
        pass: QueryPass,
        window: bool,
        g: usize,
        d_k: usize,
        d_v: usize,
        shared_bytes: usize,
        unroll: Unroll,
    ) -> Self {
        let floats = match pass {
            QueryPass::Forward => d_k + d_v,
            QueryPass::Gradient => 2 * d_k + d_v,
        };
        let mut parts = fitting_parts(floats, d_k, d_v);
        let queries = if window {
            (CUBE_UNITS / (g * parts)).max(1)
        } else {
            // One query: widen the split until the cube has a useful number of units.
            while g * parts * 2 <= CUBE_UNITS / 2 && divides(parts * 2, d_k, d_v) && d_k / (parts * 2) >= 8 {
                parts *= 2;
            }
            1
        };
        let rows = queries * g;
        let mut tiling = QueryTiling { parts, rows, chunk: CHUNK, unroll: unroll.0 };
        while tiling.shared_floats(pass, d_k, d_v) * 4 > shared_bytes && tiling.chunk > 1 {
            tiling.chunk /= 2;
        }
        tiling
    }

    pub fn units(&self) -> usize {
        self.rows * self.parts
    }

    /// Shared memory the kernel declares (see `kernel::portable`).
    pub fn shared_floats(&self, pass: QueryPass, d_k: usize, d_v: usize) -> usize {
        let keys = self.chunk * (d_k + d_v);
        let exchanged = match pass {
            QueryPass::Forward => 1,
            QueryPass::Gradient => 2,
        };
        let partials = if self.parts > 1 { exchanged * self.rows * self.chunk * (self.parts + 1) } else { 0 };
        keys + partials + self.rows * self.parts
    }
}

impl KeyTiling {
    pub fn plan(d_k: usize, d_v: usize, shared_bytes: usize, unroll: Unroll) -> Self {
        let parts = fitting_parts(2 * (d_k + d_v), d_k, d_v);
        let keys = (CUBE_UNITS / parts).max(1);
        let mut tiling = KeyTiling { parts, keys, chunk: CHUNK, unroll: unroll.0 };
        while tiling.shared_floats(d_k, d_v) * 4 > shared_bytes && tiling.chunk > 1 {
            tiling.chunk /= 2;
        }
        tiling
    }

    pub fn units(&self) -> usize {
        self.keys * self.parts
    }

    /// Shared memory the kernel declares (see `kernel::portable::backward`): per staged row its
    /// q and dO, statistics, position and document start.
    pub fn shared_floats(&self, d_k: usize, d_v: usize) -> usize {
        let rows = self.chunk * (d_k + d_v + 4);
        let partials = if self.parts > 1 { 2 * self.keys * self.chunk * self.parts } else { 0 };
        rows + partials
    }
}

/// Rows a tensor-core window cube aims for: more rows share each staged K/V tile (a window cube
/// stages `w + queries` keys for its `queries` positions), against 96 KiB of shared memory.
pub const MMA_ROWS: usize = 128;
/// Shared memory a tensor-core cube may use (above 48 KiB is dynamic shared memory, which
/// CubeCL's CUDA runtime opts into per kernel; tensor-core GPUs have 100-228 KiB per SM).
pub const MMA_SHARED: usize = 96 * 1024;

/// Register-resident window forward (see `kernel::window::forward`): a cube of `planes` planes of
/// 32 lanes holds `rows` real rows (the `g` heads of `rows / g` consecutive queries) padded to
/// `16 * planes`, and stages `key_tile` keys per step. Its scores and output live in registers,
/// so shared memory holds only the K and V tiles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlashTiling {
    pub rows: usize,
    pub key_tile: usize,
}

impl FlashTiling {
    /// `None` when the head dims are not multiples of the MMA tile. Wide heads take 32-key
    /// tiles, so that a lane's registers stay near 128 f32: the forward keeps `d_k / 4` query,
    /// `key_tile / 4` score and `d_v / 4` output registers, the dQ pass `(d_k + d_v) / 4` query
    /// and dO, `key_tile / 2` score and `dp`, and `d_k / 4` dQ registers.
    pub fn plan(pass: QueryPass, g: usize, d_k: usize, d_v: usize) -> Option<Self> {
        if !d_k.is_multiple_of(MMA_TILE) || !d_v.is_multiple_of(MMA_TILE) {
            return None;
        }
        let wide = match pass {
            QueryPass::Forward => d_k + d_v > 256,
            QueryPass::Gradient => d_k + d_v > 128,
        };
        // A narrow forward lane needs about 128 registers, and CUDA's compiler is only told the
        // cube's size (`__launch_bounds__(units)`), not how many cubes should share an SM: at 8
        // planes it may take 140 and leave one cube of 8 planes per SM. A cube of 16 planes
        // caps a unit at 128 registers (65536 / 512), so 16 planes always run per SM, and each
        // staged K/V tile serves twice the queries.
        let cube_rows = if pass == QueryPass::Forward && d_k + d_v <= 128 { 2 * MMA_ROWS } else { MMA_ROWS };
        let rows = (cube_rows / g).max(1) * g;
        let key_tile = if wide { 32 } else { 64 };
        Some(FlashTiling { rows, key_tile })
    }

    /// Planes of 16 rows: `rows` rounded up.
    pub fn planes(&self) -> usize {
        self.rows.div_ceil(MMA_TILE)
    }

    /// Positions per cube.
    pub fn queries(&self, g: usize) -> usize {
        self.rows / g
    }
}

/// Register-resident dK/dV (see `kernel::key_gradients`): `planes` planes own 16 keys each and walk
/// the query rows that attend them `q_rows` at a time. A lane keeps `(d_k + d_v) / 4` K and V, as
/// many dK and dV, and one 16-row group's score and `dp` (8 registers each; the chunk is
/// computed a group at a time): wide heads walk 32 rows at a time.
///
/// At narrow heads, where the device adds f32 atomically, the cube folds its rows' dQ in
/// (`fold_dq`: `ds^T` through shared memory, `ds K` added by atomics), walking 64 rows at a time,
/// each plane taking one of the chunk's 16-row tiles and a part of `d_k`. A selection's cube is its
/// 64-key block (4 planes); a window's takes 128 keys (8 planes, half of `d_k` each, where those
/// are whole MMA tiles), so it walks `128 + w - 1` positions for 128 keys rather than `64 + w - 1`
/// for 64, and adds each row's dQ half as often. Wide heads have no registers for the dQ
/// accumulator beside dK and dV; there a window cube takes 128 keys and a window keeps its
/// query-side dQ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlashKeyTiling {
    pub planes: usize,
    pub q_rows: usize,
    pub fold_dq: bool,
}

impl FlashKeyTiling {
    /// `atomics`: the device adds f32 to global memory atomically; `shared`: the bytes of
    /// shared memory a cube may have.
    pub fn plan(window: bool, d_k: usize, d_v: usize, atomics: bool, shared: usize) -> Option<Self> {
        if !d_k.is_multiple_of(MMA_TILE) || !d_v.is_multiple_of(MMA_TILE) {
            return None;
        }
        let narrow = d_k + d_v <= 128;
        let q_rows = if narrow { 64 } else { 32 };
        let fold_dq = narrow && atomics;
        // A 128-key window cube splits d_k in two halves of whole MMA tiles.
        let halves = !fold_dq || d_k.is_multiple_of(2 * MMA_TILE);
        let planes = if window && halves { 8 } else { 4 };
        let tiling = FlashKeyTiling { planes, q_rows, fold_dq };
        // A folding window cube of 8 planes runs alone on its SM (~170 registers a unit), so
        // it may take the shared memory of the whole SM: chunks of 128 rows halve the chunks
        // walked, and with them the barriers that idle the SM while its one cube waits.
        let long = FlashKeyTiling { q_rows: 128, ..tiling };
        let alone = window && fold_dq && planes == 8;
        Some(if alone && long.shared_bytes(d_k, d_v) <= shared { long } else { tiling })
    }

    /// Shared memory of a cube at 16-bit storage: K and V rows (K kept when folding dQ) or two
    /// buffers of `q_rows` q and dO rows, the folded `ds^T` tile, and the rows' positions and
    /// statistics.
    pub fn shared_bytes(&self, d_k: usize, d_v: usize) -> usize {
        let (keys, row) = (self.keys(), storage_stride(d_k) + storage_stride(d_v));
        let base = if self.fold_dq { keys * storage_stride(d_k) } else { 0 };
        let staged = base + (keys * row - base).max(2 * self.q_rows * row);
        let ds = if self.fold_dq { keys * storage_stride(self.q_rows) } else { 0 };
        2 * (staged + ds) + 4 * 6 * self.q_rows
    }

    pub fn keys(&self) -> usize {
        self.planes * MMA_TILE
    }
}

/// Key-major selection (see `kernel::selection`): a cube stages one selected block's `keys`
/// keys (the whole block) and walks the block's listed query rows a chunk of `16 * planes`
/// at a time, copied asynchronously into two buffers, each plane taking 16 rows of a chunk
/// (`planes` for the forward, `dq_planes` for dQ, as many as the shared memory holds). A lane
/// keeps `d_k / 4` query, `keys / 4` score and `d_v / 4` output registers, so wide heads take
/// blocks of at most 64 keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlashSelectTiling {
    pub keys: usize,
    pub planes: usize,
    pub dq_planes: usize,
}

impl FlashSelectTiling {
    /// `None` when a head dim or the block size is not a multiple of the MMA tile, the block
    /// is longer than the registers allow, or not even one plane's buffers fit in `shared`
    /// bytes.
    pub fn plan(span: usize, d_k: usize, d_v: usize, shared: usize) -> Option<Self> {
        let longest = if d_k + d_v <= 128 { 128 } else { 64 };
        let fits = d_k.is_multiple_of(MMA_TILE) && d_v.is_multiple_of(MMA_TILE) && span.is_multiple_of(MMA_TILE);
        if !fits || !(MMA_TILE..=longest).contains(&span) {
            return None;
        }
        let most = |rows_bytes: fn(usize, usize) -> usize| {
            [4, 2, 1].into_iter().find(|&planes| Self::shared_bytes_for(span, planes, d_k, d_v, rows_bytes) <= shared)
        };
        Some(FlashSelectTiling {
            keys: span,
            planes: most(Self::query_row_bytes)?,
            dq_planes: most(Self::gradient_row_bytes)?,
        })
    }

    /// Bytes per walked row and buffer at 16-bit storage: in the forward the q row, its position
    /// and block slot; in dQ the q and dO rows.
    fn query_row_bytes(d_k: usize, _d_v: usize) -> usize {
        2 * storage_stride(d_k) + 2 * 4
    }

    fn gradient_row_bytes(d_k: usize, d_v: usize) -> usize {
        2 * (storage_stride(d_k) + storage_stride(d_v))
    }

    /// The block's K and V rows and two buffers of `16 * planes` walked rows.
    fn shared_bytes_for(
        keys: usize,
        planes: usize,
        d_k: usize,
        d_v: usize,
        rows_bytes: fn(usize, usize) -> usize,
    ) -> usize {
        2 * keys * (storage_stride(d_k) + storage_stride(d_v)) + 2 * planes * MMA_TILE * rows_bytes(d_k, d_v)
    }

    /// Whether the forward stages each walked row's block slot with its chunk and writes its
    /// partial results as whole rows of 16-byte vectors (a quad's transpose by shuffles) rather
    /// than 2 elements per lane, at `d_v <= 64`. Wide heads read the slot when storing and write
    /// pieces: the transpose's registers would cost the paper's `d_v = 128` cube a third of its
    /// occupancy.
    pub fn narrow_partials(d_v: usize) -> bool {
        d_v <= 64
    }

    /// Shared memory the forward and the dQ kernel declare at 16-bit storage, at most.
    pub fn shared_bytes(&self, d_k: usize, d_v: usize) -> usize {
        let forward = Self::shared_bytes_for(self.keys, self.planes, d_k, d_v, Self::query_row_bytes);
        forward.max(Self::shared_bytes_for(self.keys, self.dq_planes, d_k, d_v, Self::gradient_row_bytes))
    }
}

/// Query rows per cube of `kernel::row_delta` at head dim `d_v`: as many as fill
/// about 128 units, one per 16-byte vector of a row (`d_v / 8` at 16-bit storage).
pub fn delta_rows(d_v: usize, vector: usize) -> usize {
    (128 / (d_v / vector).max(1)).max(1)
}

/// The smallest power-of-two split that keeps `floats / parts` within the register budget and
/// divides both head dims; 1 when no split divides them.
fn fitting_parts(floats: usize, d_k: usize, d_v: usize) -> usize {
    let mut parts = 1;
    while floats / parts > ROW_REGISTERS && divides(parts * 2, d_k, d_v) {
        parts *= 2;
    }
    parts
}

fn divides(parts: usize, d_k: usize, d_v: usize) -> bool {
    d_k.is_multiple_of(parts) && d_v.is_multiple_of(parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    const H100: usize = 48 * 1024;
    const GPU: Unroll = Unroll(true);

    #[test]
    fn production_and_paper_shapes_fit_registers_and_units() {
        // Production: g = 6, d = 64.
        let fwd = QueryTiling::plan(QueryPass::Forward, true, 6, 64, 64, H100, GPU);
        assert_eq!((fwd.parts, fwd.rows), (1, 126));
        let sel = QueryTiling::plan(QueryPass::Forward, false, 6, 64, 64, H100, GPU);
        assert_eq!((sel.parts, sel.rows), (8, 6));
        let dq = QueryTiling::plan(QueryPass::Gradient, true, 6, 64, 64, H100, GPU);
        assert_eq!(dq.parts, 2);
        assert_eq!(KeyTiling::plan(64, 64, H100, GPU), KeyTiling { parts: 2, keys: 64, chunk: 16, unroll: true });
        // Paper: g = 16, d = 128.
        let fwd = QueryTiling::plan(QueryPass::Forward, true, 16, 128, 128, H100, GPU);
        assert_eq!((fwd.parts, fwd.rows), (2, 64));
        assert_eq!(KeyTiling::plan(128, 128, H100, GPU).parts, 4);
        // d_k = 192, d_v = 128.
        assert_eq!(QueryTiling::plan(QueryPass::Forward, true, 16, 192, 128, H100, GPU).parts, 4);
    }

    #[test]
    fn narrow_heads_fold_dq_into_the_key_kernel_where_atomics_add() {
        let fold =
            |window, d_k, d_v, atomics| FlashKeyTiling::plan(window, d_k, d_v, atomics, MMA_SHARED).unwrap().fold_dq;
        assert!(fold(false, 64, 64, true));
        assert!(fold(true, 64, 64, true));
        assert!(!fold(true, 64, 64, false), "no atomics: a window keeps its query-side dQ");
        assert!(!fold(false, 128, 128, true), "wide heads have no registers for it");
        assert!(!fold(true, 192, 128, true));
        // Folding has each plane take a 16-row tile of the chunk and an equal part of d_k.
        for (window, d) in [(false, 64), (true, 64), (false, 48), (true, 48), (true, 32)] {
            let narrow = FlashKeyTiling::plan(window, d, d, true, MMA_SHARED).unwrap();
            let row_tiles = narrow.q_rows / MMA_TILE;
            assert!(
                narrow.planes.is_multiple_of(row_tiles) && (d / (narrow.planes / row_tiles)).is_multiple_of(MMA_TILE),
                "{d}"
            );
        }
        assert_eq!(
            FlashKeyTiling::plan(true, 64, 64, true, MMA_SHARED).unwrap().keys(),
            128,
            "a window cube takes 128 keys"
        );
        // Alone on its SM, a folding window cube walks 128-row chunks where the SM's shared
        // memory holds them (an H100's 227 KiB), else 64.
        let h100 = FlashKeyTiling::plan(true, 64, 64, true, 227 * 1024).unwrap();
        assert_eq!((h100.q_rows, h100.planes), (128, 8));
        assert!(h100.shared_bytes(64, 64) <= 227 * 1024 && h100.shared_bytes(64, 64) > MMA_SHARED);
        assert_eq!(FlashKeyTiling::plan(true, 64, 64, true, MMA_SHARED).unwrap().q_rows, 64);
        assert_eq!(FlashKeyTiling::plan(false, 64, 64, true, 227 * 1024).unwrap().q_rows, 64, "4 planes share an SM");
        let wide_window = FlashKeyTiling::plan(true, 128, 128, true, 227 * 1024).unwrap();
        assert_eq!(wide_window, FlashKeyTiling { planes: 8, q_rows: 32, fold_dq: false });
    }

    #[test]
    fn key_major_selection_tiles_fit_the_shared_memory_and_refuse_odd_blocks() {
        for (d_k, d_v) in [(64, 64), (128, 128), (192, 128), (16, 16)] {
            let t = FlashSelectTiling::plan(64, d_k, d_v, MMA_SHARED).unwrap();
            assert!(t.shared_bytes(d_k, d_v) <= MMA_SHARED, "{t:?}");
        }
        let long = FlashSelectTiling { keys: 128, planes: 4, dq_planes: 4 };
        assert_eq!(FlashSelectTiling::plan(128, 64, 64, MMA_SHARED), Some(long));
        // The paper's heads: dQ's two buffers of q and dO rows fit for two planes only.
        let paper = FlashSelectTiling { keys: 64, planes: 4, dq_planes: 2 };
        assert_eq!(FlashSelectTiling::plan(64, 128, 128, MMA_SHARED), Some(paper));
        assert_eq!(FlashSelectTiling::plan(64, 128, 128, 1024), None);
        assert_eq!(FlashSelectTiling::plan(128, 128, 128, MMA_SHARED), None);
        assert_eq!(FlashSelectTiling::plan(24, 64, 64, MMA_SHARED), None);
        assert_eq!(FlashSelectTiling::plan(64, 72, 64, MMA_SHARED), None);
    }

    #[test]
    fn chunks_shrink_to_the_shared_memory_limit() {
        let small = KeyTiling::plan(128, 128, 16 * 1024, GPU);
        assert!(small.shared_floats(128, 128) * 4 <= 16 * 1024, "{small:?}");
        let sel = QueryTiling::plan(QueryPass::Gradient, false, 16, 128, 128, 16 * 1024, GPU);
        assert!(sel.shared_floats(QueryPass::Gradient, 128, 128) * 4 <= 16 * 1024, "{sel:?}");
    }
}

mod selection;
pub use crate::tile_sizes::{
    f32_stride, storage_stride, MMA_TILE, SELECTION_CHUNK, SELECTION_KEYS_PER_LANE, SELECTION_LANES,
    SELECTION_PROB_STRIDE,
};
pub use selection::{SelectionTiling, SELECTION_SHARED};
