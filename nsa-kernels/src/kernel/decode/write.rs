//! A decode step's new token, from its layer's one projection product to where the step reads
//! it: the queries rotated, the gates' sigmoid, and each branch's key (rotated) and value written
//! into its cache at the sequence's position `t` (a run-time value). One unit per column of the
//! product, so a layer's whole hand-over from the product to the attention is one launch.
//!
//! The product's columns, per sequence: the `H` query heads, then each key set's `H_kv` heads
//! (`d_k` each), each value set's `H_kv` heads (`d_v` each), then the `3 H` gate logits. With
//! three key/value sets, set `i` belongs to branch `i` (compressed, selected, window); with one,
//! every branch caches set 0.

use cubecl::prelude::*;

use crate::kernel::primitives::rows::offset3;

/// `projected [B, W]` (contiguous), `gate_bias [3 H]`, the rotation rows `cos, sin [B, d_k]`
/// (contiguous) and the positions `[B]` -> `queries [B, 1, H, d_k]` and `gates [B, 1, 3, H]`
/// (contiguous), and the caches `[B, H_kv, S, d]` (any strides) written at slot `t % S` (the
/// selected branch's store has a slot per position, so `t % S = t`).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn decode_write<F: Float, I: Int>(
    projected: &Tensor<F>,
    gate_bias: &Tensor<F>,
    cos: &Tensor<F>,
    sin: &Tensor<F>,
    positions: &Tensor<I>,
    tail_k: &mut Tensor<F>,
    tail_v: &mut Tensor<F>,
    selected_k: &mut Tensor<F>,
    selected_v: &mut Tensor<F>,
    window_k: &mut Tensor<F>,
    window_v: &mut Tensor<F>,
    queries: &mut Tensor<F>,
    gates: &mut Tensor<F>,
    #[comptime] heads: usize,
    #[comptime] kv_heads: usize,
    #[comptime] d_k: usize,
    #[comptime] d_v: usize,
    #[comptime] kv_sets: usize,
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    let rotated = comptime!((heads + kv_sets * kv_heads) * d_k);
    let gates_at = comptime!(rotated + kv_sets * kv_heads * d_v);
    let width = comptime!(gates_at + 3 * heads);
    let pos = ABSOLUTE_POS;
    if pos >= positions.len() * width {
        terminate!();
    }
    let (b, j) = (pos / width, pos % width);
    let t = u32::cast_from(positions[b]) as usize;
    let row = b * width;

    if j < rotated {
        let value = F::cast_from(rotate::<F>(projected, cos, sin, row, j, b * d_k + j % d_k));
        if j < comptime!(heads * d_k) {
            queries[b * comptime!(heads * d_k) + j] = value;
        } else {
            let k = j - comptime!(heads * d_k);
            let set = k / comptime!(kv_heads * d_k);
            let (hk, i) = ((k / d_k) % kv_heads, k % d_k);
            put_set::<F>(tail_k, selected_k, window_k, set, b, hk, t, i, value, kv_sets);
        }
    } else if j < gates_at {
        let k = j - rotated;
        let set = k / comptime!(kv_heads * d_v);
        let (hk, i) = ((k / d_v) % kv_heads, k % d_v);
        put_set::<F>(tail_v, selected_v, window_v, set, b, hk, t, i, projected[row + j], kv_sets);
    } else {
        let k = j - gates_at;
        let z = f32::cast_from(projected[row + j]) + f32::cast_from(gate_bias[k]);
        gates[b * comptime!(3 * heads) + k] = F::cast_from(1.0f32 / (1.0f32 + (-z).exp()));
    }
}

/// Column `j` of the row at `row` rotated with its pair: RoPE on interleaved pairs `(2i, 2i+1)`,
/// `(e, o) -> (e cos - o sin, e sin + o cos)`, the rotation's cosine and sine at `angle`.
#[cube]
fn rotate<F: Float>(
    projected: &Tensor<F>,
    cos: &Tensor<F>,
    sin: &Tensor<F>,
    row: usize,
    j: usize,
    angle: usize,
) -> f32 {
    let x = f32::cast_from(projected[row + j]);
    // The pair's other column: `j + 1` for an even column, `j - 1` for an odd one.
    let p = f32::cast_from(projected[row + j + 1 - 2 * (j % 2)]);
    let swapped = select(j % 2 == 0, -p, p);
    x * f32::cast_from(cos[angle]) + swapped * f32::cast_from(sin[angle])
}

/// Writes `value` (element `i` of KV head `hk`, sequence `b`, position `t`) into the caches of
/// the branches that read set `set`.
#[cube]
#[allow(clippy::too_many_arguments, clippy::collapsible_else_if)]
fn put_set<F: Float>(
    tail: &mut Tensor<F>,
    selected: &mut Tensor<F>,
    window: &mut Tensor<F>,
    set: usize,
    b: usize,
    hk: usize,
    t: usize,
    i: usize,
    value: F,
    #[comptime] kv_sets: usize,
) {
    if comptime!(kv_sets == 1) {
        put::<F>(tail, b, hk, t, i, value);
        put::<F>(selected, b, hk, t, i, value);
        put::<F>(window, b, hk, t, i, value);
    } else {
        if set == 0 {
            put::<F>(tail, b, hk, t, i, value);
        } else if set == 1 {
            put::<F>(selected, b, hk, t, i, value);
        } else {
            put::<F>(window, b, hk, t, i, value);
        }
    }
}

/// `cache[b, hk, t % S, i] = value` for a cache of `S` slots.
#[cube]
fn put<F: Float>(cache: &mut Tensor<F>, b: usize, hk: usize, t: usize, i: usize, value: F) {
    let at = offset3::<F>(cache, b, hk, t % cache.shape(2));
    cache[at + i * cache.stride(3)] = value;
}
