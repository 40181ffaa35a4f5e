//! Packed documents (varlen): where each row's documents start, so that no query attends a key
//! of another document.

use burn::tensor::ops::IntTensor;
use burn::tensor::{backend::Backend, Int, Tensor, TensorData};

/// The document of every position of a batch: `starts: [B, T]` holds, for each position, the
/// first position of its document in the same row (so `t - starts[b, t]` is the position within
/// the document, where RoPE, the blocks and the window restart).
///
/// Starts never decrease along a row and are multiples of the layer's `lcm(d, l_sel)`: then the
/// compression and selection blocks of a document are the row's blocks that start inside it,
/// and one block grid serves every document ([`Documents::check`]).
#[derive(Clone, Debug)]
pub struct Documents<B: Backend> {
    starts: Tensor<B, 2, Int>,
    /// `t - starts[b, t]`, made once: every layer's RoPE reads it for its queries and keys.
    positions: Tensor<B, 2, Int>,
}

impl<B: Backend> Documents<B> {
    /// The documents of per-position starts `[B, T]` on the device (unchecked: see
    /// [`Documents::from_starts`]).
    pub fn new(starts: Tensor<B, 2, Int>) -> Self {
        let [b, t] = starts.dims();
        let index = Tensor::<B, 1, Int>::arange(0..t as i64, &starts.device()).reshape([1, t]).expand([b, t]);
        let positions = index - starts.clone();
        Self { starts, positions }
    }

    /// Per-position starts `[B, T]` from the host, row-major, checked by [`Documents::check`].
    pub fn from_starts(starts: Vec<i64>, shape: [usize; 2], align: usize, device: &B::Device) -> Result<Self, String> {
        Self::check(&starts, shape, align)?;
        Ok(Self::new(Tensor::from_data(TensorData::new(starts, shape), device)))
    }

    /// Whether `starts` (`[B, T]`, row-major) are valid: each `starts[b, t] <= t`, a multiple of
    /// `align`, non-decreasing along the row, and a new value only at its own position (a
    /// document is one contiguous run).
    pub fn check(starts: &[i64], [b, t]: [usize; 2], align: usize) -> Result<(), String> {
        let align = align.max(1);
        if starts.len() != b * t {
            return Err(format!("document starts hold {} positions, expected {b} x {t}", starts.len()));
        }
        for (row, chunk) in starts.chunks(t.max(1)).enumerate() {
            for (pos, &start) in chunk.iter().enumerate() {
                let previous = if pos == 0 { start } else { chunk[pos - 1] };
                let ok = (0..=pos as i64).contains(&start)
                    && start % align as i64 == 0
                    && (start == previous || start == pos as i64);
                if !ok {
                    return Err(format!(
                        "row {row}, position {pos}: document start {start} must be a multiple of {align}, at most \
                         the position, and either the previous position's start or the position itself"
                    ));
                }
            }
        }
        Ok(())
    }

    /// The starts as the backend's int primitive (what [`crate::Keys`] carries).
    pub fn primitive(&self) -> IntTensor<B> {
        self.starts.clone().into_primitive()
    }

    /// Each position's document start, `[B, T]`.
    pub fn starts(&self) -> Tensor<B, 2, Int> {
        self.starts.clone()
    }

    /// Each position's place within its document, `[B, T]`.
    pub fn positions(&self) -> Tensor<B, 2, Int> {
        self.positions.clone()
    }
}
