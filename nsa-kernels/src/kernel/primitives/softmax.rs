//! Online softmax over register-resident score tiles: running row statistics and masks.

use cubecl::prelude::*;

use super::fragments::{Pair, MMA_N};
use super::layout::MASKED;
use super::query_cube::LaneRows;
use super::rows::{attends, NEG_LARGE};

/// Running maximum and (this lane's share of the) sum of each of the lane's two rows; the
/// quad's shares are added once, at the end (the maxima are the quad's, so one correction
/// serves all four shares).
#[derive(CubeType)]
pub struct RowStats {
    pub max: Array<f32>,
    pub sum: Array<f32>,
}

#[cube]
impl RowStats {
    pub fn new() -> RowStats {
        let mut max = Array::<f32>::new(2usize);
        let mut sum = Array::<f32>::new(2usize);
        #[unroll]
        for half in 0..2usize {
            max[half] = f32::new(NEG_LARGE);
            sum[half] = 0.0f32;
        }
        RowStats { max, sum }
    }

    /// One key tile of the online softmax: turns the raw (unscaled) masked scores into
    /// probabilities `exp(s scale - max)` in place and returns the factor that rescales each
    /// row's accumulated output. The maximum is kept scaled (`scale > 0` keeps the order).
    ///
    /// Why raw scores: the scale folds into the exponential's argument (one fused multiply-add
    /// per score instead of a multiply and a subtraction), and a masked score needs no test of
    /// its own. A row that has no attended key yet (its maximum still masked) is shifted by 0
    /// instead of its maximum, so its masked scores give `exp(-huge) = 0` and never
    /// `exp(0) = 1`: one test per row rather than one per score.
    pub fn update(&mut self, scores: &mut Array<Pair<f32>>, scale: f32, #[comptime] key_tile: usize) -> Array<f32> {
        let mut correction = Array::<f32>::new(2usize);
        #[unroll]
        for half in 0..2usize {
            let mut tile_max = f32::new(NEG_LARGE);
            #[unroll]
            for j in 0..key_tile / MMA_N {
                let s = scores[2 * j + half];
                tile_max = max(tile_max, max(s[0], s[1]));
            }
            tile_max = max(tile_max, plane_shuffle_xor(tile_max, 1u32));
            tile_max = max(tile_max, plane_shuffle_xor(tile_max, 2u32));
            let new_max = max(self.max[half], tile_max * scale);
            let shift = select(new_max > MASKED * scale, new_max, 0.0f32);
            correction[half] = (self.max[half] - shift).exp();
            let mut tile_sum = 0.0f32;
            #[unroll]
            for j in 0..key_tile / MMA_N {
                let mut s = scores[2 * j + half];
                #[unroll]
                for e in 0..2usize {
                    s[e] = fma(s[e], scale, -shift).exp();
                    tile_sum += s[e];
                }
                scores[2 * j + half] = s;
            }
            self.max[half] = new_max;
            self.sum[half] = self.sum[half] * correction[half] + tile_sum;
        }
        correction
    }

    /// The quad's sum of row `half`.
    pub fn row_sum(&self, half: usize) -> f32 {
        let mut sum = self.sum[half];
        sum += plane_shuffle_xor(sum, 1u32);
        sum += plane_shuffle_xor(sum, 2u32);
        sum
    }
}

/// Masks keys past the tile's `count`, outside a row's window or before its document's start
/// (keys `first..first + count` of the tile; the lane holds keys `8j + 2 (l % 4) + e`) to
/// `NEG_LARGE`, leaving the others as they are. Padding rows (zero queries, never written) need
/// no mask. Only tiles at the walk's ends, or before a document start, mask anything
/// ([`tile_needs_mask`]).
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn mask_scores(
    scores: &mut Array<Pair<f32>>,
    lanes: &LaneRows,
    first: usize,
    count: usize,
    span: usize,
    lane: usize,
    #[comptime] key_tile: usize,
) {
    let column = 2 * (lane % 4);
    #[unroll]
    for j in 0..key_tile / MMA_N {
        #[unroll]
        for half in 0..2usize {
            let mut s = scores[2 * j + half];
            #[unroll]
            for e in 0..2usize {
                let key = j * MMA_N + column + e;
                let valid =
                    key < count && attends(lanes.t[half], first + key, span, true) && first + key >= lanes.start[half];
                s[e] = select(valid, s[e], f32::new(NEG_LARGE));
            }
            scores[2 * j + half] = s;
        }
    }
}

/// [`mask_scores`], then every score times `scale` (masked ones stay below `MASKED`).
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn mask_and_scale(
    scores: &mut Array<Pair<f32>>,
    lanes: &LaneRows,
    first: usize,
    count: usize,
    span: usize,
    scale: f32,
    lane: usize,
    needs_mask: bool,
    #[comptime] key_tile: usize,
) {
    if needs_mask {
        mask_scores(scores, lanes, first, count, span, lane, key_tile);
    }
    let scale_pair = Pair::<f32>::new(scale);
    #[unroll]
    for i in 0..2 * key_tile / MMA_N {
        scores[i] = scores[i] * scale_pair;
    }
}

/// Whether the key tile `first..first + count` (of `key_tile`) holds a key that some query of
/// `t0..t_end` does not attend: a partial tile, a key past `t0`, a key before the last query's
/// window, or one before the last query's document start `last_start` (0 without documents:
/// starts never decrease along a row, so the last query's is the cube's latest). The same for
/// the whole cube, so the branch does not diverge.
#[cube]
pub fn tile_needs_mask(
    first: usize,
    count: usize,
    t0: usize,
    t_end: usize,
    span: usize,
    last_start: usize,
    #[comptime] key_tile: usize,
) -> bool {
    count < key_tile || first + key_tile > t0 + 1 || first + span < t_end || first < last_start
}
