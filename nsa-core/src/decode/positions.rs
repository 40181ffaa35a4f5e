//! Where each sequence's new token sits and what that makes visible: built once per step from
//! the host's lengths and read by every layer, so a layer adds no index arithmetic of its own.
//! Every tensor's shape depends only on the batch and the cache's maximum length.

use burn::tensor::{backend::Backend, Bool, DType, Int, Tensor, TensorData};
use nsa_kernels::DecodeAttentionBackend;

use super::cache::compressed_blocks;
use crate::config::NsaConfig;
use crate::rope::{Rope, RopeRows};

/// One decode step's positions.
#[derive(Clone, Debug)]
pub struct DecodePositions<B: Backend> {
    /// Each row's position `[B]` (its length before this token).
    pub at: Tensor<B, 1, Int>,
    /// The rotation at those positions, for every layer's queries and keys.
    pub rope: RopeRows<B>,
    /// What NSA layers read (`None` for a dense model).
    pub nsa: Option<NsaPositions<B>>,
    /// Positions `0..=t_b`, `[B, 1, 1, L]`: what a dense layer's token sees (`None` for an NSA
    /// model).
    pub causal: Option<Tensor<B, 4, Bool>>,
}

/// What an NSA layer's step reads of the positions `t_b`.
#[derive(Clone, Debug)]
pub struct NsaPositions<B: Backend> {
    /// The compressed blocks this step's tokens complete, on a step where any does (one step
    /// in `d`): the other steps skip the compression.
    pub emit: Option<Emission<B>>,
    /// The masks the step's tensor ops read; `None` on a backend with a decode kernel, which
    /// derives them from the positions.
    pub masks: Option<StepMasks<B>>,
}

/// Where a step's compressed blocks come from and go.
#[derive(Clone, Debug)]
pub struct Emission<B: Backend> {
    /// The tail's slots in position order `t + 1 - l ..= t`, `[B, l]`.
    pub tail_order: Tensor<B, 2, Int>,
    /// The compressed block this token completes, `[B, 1, N, 1]` (no slot when it completes none).
    pub emit_hit: Tensor<B, 4, Bool>,
}

/// Masks and orders a step in tensor ops reads.
#[derive(Clone, Debug)]
pub struct StepMasks<B: Backend> {
    /// The compression tail's slot `t % l`, `[B, 1, l, 1]`.
    pub tail_hit: Tensor<B, 4, Bool>,
    /// Compressed blocks visible to the token (`i < n_cmp(t)`), `[B, 1, 1, N]`.
    pub compressed_visible: Tensor<B, 4, Bool>,
    /// The window ring's slot `t % R`, `[B, 1, R, 1]`.
    pub window_hit: Tensor<B, 4, Bool>,
    /// Ring slots holding one of the last `min(w, t + 1)` positions, `[B, 1, 1, R]`.
    pub window_visible: Tensor<B, 4, Bool>,
    /// Selection blocks always taken (0 and the two local ones, when eligible), `[B, 1, 1, nb]`.
    pub forced: Tensor<B, 4, Bool>,
    /// Eligible blocks that are not forced, `[B, 1, 1, nb]`.
    pub candidate: Tensor<B, 4, Bool>,
    /// How many candidates each row takes besides the forced blocks, `[B, 1, 1, nb]`.
    pub remaining: Tensor<B, 4, Int>,
    /// Each row's position, `[B, 1, 1, 1]`: the last key a selected block may show it.
    pub last_key: Tensor<B, 4, Int>,
}

impl<B: DecodeAttentionBackend> DecodePositions<B> {
    /// The step at `lengths` for a cache of `max_len` positions: for NSA layers of shape `nsa`,
    /// for dense layers when `dense`, rotating by `rope` in `dtype`.
    pub fn new(
        lengths: &[usize],
        max_len: usize,
        nsa: Option<&NsaConfig>,
        dense: bool,
        (rope, dtype): (&Rope<B>, DType),
        device: &B::Device,
    ) -> Self {
        let at = per_row(lengths, |t| t as i64, device);
        let masks = !B::has_decode_kernel();
        DecodePositions {
            rope: rope.rows_at(&at, dtype),
            at,
            nsa: nsa.map(|c| NsaPositions::new(c, lengths, max_len, masks, device)),
            causal: dense.then(|| below(per_row(lengths, |t| t as i64 + 1, device), max_len)),
        }
    }
}

impl<B: Backend> NsaPositions<B> {
    fn new(c: &NsaConfig, lengths: &[usize], max_len: usize, masks: bool, device: &B::Device) -> Self {
        let b = lengths.len();
        let n_slots = compressed_blocks(c, max_len).max(1);
        // The block that position `t` completes: `i` with `i*d + l = t + 1`.
        let emitted = |t: usize| match t + 1 >= c.l && (t + 1 - c.l).is_multiple_of(c.d) {
            true => ((t + 1 - c.l) / c.d) as i64,
            false => -1,
        };
        let emit = lengths.iter().any(|&t| emitted(t) >= 0).then(|| {
            let order: Vec<i64> =
                lengths.iter().flat_map(|&t| (0..c.l).map(move |r| ((t + 1 + r) % c.l) as i64)).collect();
            Emission {
                tail_order: Tensor::from_data(TensorData::new(order, [b, c.l]), device),
                emit_hit: slot_hit(per_row(lengths, emitted, device), n_slots),
            }
        });
        NsaPositions { emit, masks: masks.then(|| StepMasks::new(c, lengths, max_len, device)) }
    }
}

impl<B: Backend> StepMasks<B> {
    fn new(c: &NsaConfig, lengths: &[usize], max_len: usize, device: &B::Device) -> Self {
        let b = lengths.len();
        let n_slots = compressed_blocks(c, max_len).max(1);
        let ring = c.w.min(max_len);
        let n_blocks = max_len.div_ceil(c.l_sel);
        let shape = [b, 1, 1, n_blocks];
        let current = per_row(lengths, |t| (t / c.l_sel) as i64, device).reshape([b, 1, 1, 1]).expand(shape);
        let block = arange::<B>(n_blocks, device).reshape([1, 1, 1, n_blocks]).expand(shape);
        let eligible = block.clone().lower_equal(current.clone());
        let is_forced = block
            .clone()
            .equal_elem(0)
            .bool_or(block.clone().equal(current.clone()))
            .bool_or(block.add_scalar(1).equal(current.clone()));
        StepMasks {
            tail_hit: slot_hit(per_row(lengths, |t| (t % c.l) as i64, device), c.l),
            compressed_visible: below(per_row(lengths, |t| compressed_blocks(c, t + 1) as i64, device), n_slots),
            window_hit: slot_hit(per_row(lengths, |t| (t % ring) as i64, device), ring),
            window_visible: below(per_row(lengths, |t| (t + 1).min(ring) as i64, device), ring),
            forced: eligible.clone().bool_and(is_forced.clone()),
            candidate: eligible.bool_and(is_forced.bool_not()),
            // Distinct forced blocks: {0} in block 0, {0, 1} in block 1, three from block 2 on.
            remaining: current.clamp_max(2).add_scalar(1).neg().add_scalar(c.n as i64),
            last_key: per_row(lengths, |t| t as i64, device).reshape([b, 1, 1, 1]),
        }
    }
}

/// `f(t_b)` for each row, `[B]`.
fn per_row<B: Backend>(lengths: &[usize], f: impl Fn(usize) -> i64, device: &B::Device) -> Tensor<B, 1, Int> {
    let values: Vec<i64> = lengths.iter().map(|&t| f(t)).collect();
    Tensor::from_data(TensorData::new(values, [lengths.len()]), device)
}

fn arange<B: Backend>(n: usize, device: &B::Device) -> Tensor<B, 1, Int> {
    Tensor::arange(0..n as i64, device)
}

/// Slot `slot_b` of `slots`, `[B, 1, slots, 1]` (none for a negative slot).
fn slot_hit<B: Backend>(slot: Tensor<B, 1, Int>, slots: usize) -> Tensor<B, 4, Bool> {
    let b = slot.dims()[0];
    let device = slot.device();
    arange::<B>(slots, &device)
        .reshape([1, 1, slots, 1])
        .expand([b, 1, slots, 1])
        .equal(slot.reshape([b, 1, 1, 1]).expand([b, 1, slots, 1]))
}

/// Slots `0..count_b`, `[B, 1, 1, slots]`.
fn below<B: Backend>(count: Tensor<B, 1, Int>, slots: usize) -> Tensor<B, 4, Bool> {
    let b = count.dims()[0];
    let device = count.device();
    arange::<B>(slots, &device)
        .reshape([1, 1, 1, slots])
        .expand([b, 1, 1, slots])
        .lower(count.reshape([b, 1, 1, 1]).expand([b, 1, 1, slots]))
}
