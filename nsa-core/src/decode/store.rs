//! The two kinds of key/value storage a decode cache is made of, both `[B, H, S, d]` (heads
//! before slots, so a step's gather along the slot axis reads contiguous rows).
//!
//! - [`TokenStore`]: one slot per position, each written once (the selected branch's keys, dense
//!   attention's). A step appends by a scatter-add into the zeros at the rows' positions, which
//!   is exact and touches one slot per row, where a masked write would rewrite the whole store.
//! - [`Slots`]: slots that are overwritten (the window's ring, the compression tail's ring, the
//!   compressed blocks), written through a mask over the slot axis.

use burn::tensor::{backend::Backend, Bool, DType, IndexingUpdateOp, Int, Tensor};

/// Keys `[B, H, S, d_k]` and values `[B, H, S, d_v]`.
#[derive(Clone, Debug)]
pub struct KeyValues<B: Backend> {
    pub keys: Tensor<B, 4>,
    pub values: Tensor<B, 4>,
}

impl<B: Backend> KeyValues<B> {
    /// Zeros of `slots` slots for `batch` rows of `heads` heads.
    pub fn zeros(batch: usize, heads: usize, slots: usize, dims: [usize; 2], dtype: DType, device: &B::Device) -> Self {
        let [d_k, d_v] = dims;
        KeyValues {
            keys: Tensor::zeros([batch, heads, slots, d_k], (device, dtype)),
            values: Tensor::zeros([batch, heads, slots, d_v], (device, dtype)),
        }
    }

    /// Slots the store holds.
    pub fn slots(&self) -> usize {
        self.keys.dims()[2]
    }

    /// Copies `from: [1, T, H, d]` (tokens first, as the layer computes them) positions
    /// `start..start + count` into row `row`, slots `slot..slot + count`.
    pub fn copy_row(self, row: usize, slot: usize, from: &KeyValues<B>, start: usize, count: usize) -> Self {
        if count == 0 {
            return self;
        }
        let put = |store: Tensor<B, 4>, x: &Tensor<B, 4>| {
            let [_, _, h, d] = x.dims();
            let part = x.clone().narrow(1, start, count).swap_dims(1, 2).cast(store.dtype());
            store.slice_assign([row..row + 1, 0..h, slot..slot + count, 0..d], part)
        };
        KeyValues { keys: put(self.keys, &from.keys), values: put(self.values, &from.values) }
    }
}

/// One slot per position, written once: `[B, H, L, d]` for positions `0..L`.
#[derive(Clone, Debug)]
pub struct TokenStore<B: Backend>(pub KeyValues<B>);

impl<B: Backend> TokenStore<B> {
    /// Row `row`'s positions `0..T` from `from: [1, T, H, d]`.
    pub fn fill(self, row: usize, from: &KeyValues<B>) -> Self {
        let t = from.keys.dims()[1];
        TokenStore(self.0.copy_row(row, 0, from, 0, t))
    }

    /// Each row's new key and value `[B, H, 1, d]` at its position `at: [B]`. The slot holds
    /// zeros until then, so adding is writing.
    pub fn append(self, new: KeyValues<B>, at: &Tensor<B, 1, Int>) -> Self {
        let put = |store: Tensor<B, 4>, x: Tensor<B, 4>| {
            let [b, h, _, d] = x.dims();
            let index = at.clone().reshape([b, 1, 1, 1]).expand([b, h, 1, d]);
            let dtype = store.dtype();
            store.scatter(2, index, x.cast(dtype), IndexingUpdateOp::Add)
        };
        TokenStore(KeyValues { keys: put(self.0.keys, new.keys), values: put(self.0.values, new.values) })
    }
}

/// Overwritable slots `[B, H, S, d]`.
#[derive(Clone, Debug)]
pub struct Slots<B: Backend>(pub KeyValues<B>);

impl<B: Backend> Slots<B> {
    /// Writes each row's `new: [B, H, 1, d]` into the slot `hit: [B, 1, S, 1]` marks (a row
    /// with no slot marked keeps its slots as they are).
    pub fn write(self, new: KeyValues<B>, hit: &Tensor<B, 4, Bool>) -> Self {
        let put = |store: Tensor<B, 4>, x: Tensor<B, 4>| {
            let [b, h, s, d] = store.dims();
            let dtype = store.dtype();
            store.mask_where(hit.clone().expand([b, h, s, d]), x.cast(dtype).expand([b, h, s, d]))
        };
        Slots(KeyValues { keys: put(self.0.keys, new.keys), values: put(self.0.values, new.values) })
    }

    /// Row `row` of a ring of `R` slots (position `p` in slot `p % R`) filled from the last
    /// `min(R, T)` positions of `from: [1, T, H, d]`: at most two contiguous copies.
    pub fn fill_ring(self, row: usize, from: &KeyValues<B>) -> Self {
        let r = self.0.slots();
        let t = from.keys.dims()[1];
        let start = t.saturating_sub(r);
        let first_slot = start % r;
        let before_wrap = (r - first_slot).min(t - start);
        let kv = self.0.copy_row(row, first_slot, from, start, before_wrap);
        Slots(kv.copy_row(row, 0, from, start + before_wrap, t - start - before_wrap))
    }

    /// Row `row`'s slots `0..n` from `from: [1, n, H, d]` (the compressed blocks a prefill made).
    pub fn fill_front(self, row: usize, from: &KeyValues<B>) -> Self {
        let n = from.keys.dims()[1];
        Slots(self.0.copy_row(row, 0, from, 0, n))
    }

    /// The slots in the order `order: [B, R]` (slot indices per row): `[B, H, R, d]`.
    pub fn gather(&self, order: &Tensor<B, 2, Int>) -> KeyValues<B> {
        let take = |store: &Tensor<B, 4>| {
            let [b, h, _, d] = store.dims();
            let r = order.dims()[1];
            let index = order.clone().reshape([b, 1, r, 1]).expand([b, h, r, d]);
            store.clone().gather(2, index)
        };
        KeyValues { keys: take(&self.0.keys), values: take(&self.0.values) }
    }
}
