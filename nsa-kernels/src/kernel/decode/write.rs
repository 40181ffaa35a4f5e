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

/// The slots of each cache a step writes (tail, selected store, window ring).
#[derive(CubeType, CubeLaunch, Clone, Copy)]
pub struct CacheSlots {
    pub tail: usize,
    pub selected: usize,
    pub window: usize,
}

/// `projected [B, W]`, `gate_bias [3 H]`, the rotation rows `cos, sin [B, d_k]` and the
/// positions `[B]` -> `queries [B, 1, H, d_k]` and `gates [B, 1, 3, H]`, and the caches
/// `[B, H_kv, S, d]` written at slot `t % S` (the selected branch's store has a slot per
/// position, so `t % S = t`), each with its `S` in `slots`. All contiguous: as arrays, whose
/// lengths go with the launch where a tensor's shape and strides would be uploaded.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn decode_write<F: Float, I: Int>(
    projected: &Array<F>,
    gate_bias: &Array<F>,
    cos: &Array<F>,
    sin: &Array<F>,
    positions: &Array<I>,
    tail_k: &mut Array<F>,
    tail_v: &mut Array<F>,
    selected_k: &mut Array<F>,
    selected_v: &mut Array<F>,
    window_k: &mut Array<F>,
    window_v: &mut Array<F>,
    queries: &mut Array<F>,
    gates: &mut Array<F>,
    slots: CacheSlots,
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
            let at = Put { set, b, hk, t, i };
            put_set::<F>(tail_k, selected_k, window_k, &slots, at, value, kv_heads, d_k, kv_sets);
        }
    } else if j < gates_at {
        let k = j - rotated;
        let set = k / comptime!(kv_heads * d_v);
        let (hk, i) = ((k / d_v) % kv_heads, k % d_v);
        let at = Put { set, b, hk, t, i };
        put_set::<F>(tail_v, selected_v, window_v, &slots, at, projected[row + j], kv_heads, d_v, kv_sets);
    } else {
        let k = j - gates_at;
        let z = f32::cast_from(projected[row + j]) + f32::cast_from(gate_bias[k]);
        gates[b * comptime!(3 * heads) + k] = F::cast_from(1.0f32 / (1.0f32 + (-z).exp()));
    }
}

/// Column `j` of the row at `row` rotated with its pair: RoPE on interleaved pairs `(2i, 2i+1)`,
/// `(e, o) -> (e cos - o sin, e sin + o cos)`, the rotation's cosine and sine at `angle`.
#[cube]
fn rotate<F: Float>(projected: &Array<F>, cos: &Array<F>, sin: &Array<F>, row: usize, j: usize, angle: usize) -> f32 {
    let x = f32::cast_from(projected[row + j]);
    // The pair's other column: `j + 1` for an even column, `j - 1` for an odd one.
    let p = f32::cast_from(projected[row + j + 1 - 2 * (j % 2)]);
    let swapped = select(j % 2 == 0, -p, p);
    x * f32::cast_from(cos[angle]) + swapped * f32::cast_from(sin[angle])
}

/// Where a value goes: element `i` of KV head `hk` of sequence `b` at position `t`, of key or
/// value set `set`.
#[derive(CubeType, Clone, Copy)]
struct Put {
    set: usize,
    b: usize,
    hk: usize,
    t: usize,
    i: usize,
}

/// Writes `value` at `at` into the caches of the branches that read its set (`d` elements a
/// row).
#[cube]
#[allow(clippy::too_many_arguments, clippy::collapsible_else_if)]
fn put_set<F: Float>(
    tail: &mut Array<F>,
    selected: &mut Array<F>,
    window: &mut Array<F>,
    slots: &CacheSlots,
    at: Put,
    value: F,
    #[comptime] kv_heads: usize,
    #[comptime] d: usize,
    #[comptime] kv_sets: usize,
) {
    if comptime!(kv_sets == 1) {
        tail[slot_at(&at, slots.tail, kv_heads, d)] = value;
        selected[slot_at(&at, slots.selected, kv_heads, d)] = value;
        window[slot_at(&at, slots.window, kv_heads, d)] = value;
    } else {
        if at.set == 0 {
            tail[slot_at(&at, slots.tail, kv_heads, d)] = value;
        } else if at.set == 1 {
            selected[slot_at(&at, slots.selected, kv_heads, d)] = value;
        } else {
            window[slot_at(&at, slots.window, kv_heads, d)] = value;
        }
    }
}

/// The index of `at` in a contiguous cache `[B, H_kv, S, d]` of `S = slots`: slot `t % S`.
#[cube]
fn slot_at(at: &Put, slots: usize, #[comptime] kv_heads: usize, #[comptime] d: usize) -> usize {
    ((at.b * kv_heads + at.hk) * slots + at.t % slots) * d + at.i
}
