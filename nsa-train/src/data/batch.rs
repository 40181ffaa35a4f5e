//! Batches: windows of a packed split as inputs and next-token targets (and, for packed
//! documents, each position's document start), assembled on the host and uploaded in one write
//! each.

use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use nsa_core::Documents;

use super::corpus::PackedSplit;

/// One micro-batch as the host assembled it: inputs and next-token targets, `[B, T]` row-major
/// (a target of `-1` is left out of the loss), and with packed documents each position's
/// document start.
#[derive(Debug, Clone)]
pub struct HostBatch {
    pub inputs: Vec<i64>,
    pub targets: Vec<i64>,
    pub starts: Option<Vec<i64>>,
    pub shape: [usize; 2],
}

/// A batch on the device: inputs and targets `[B, T]`, and the rows' documents when packed as
/// documents.
pub struct DeviceBatch<B: Backend> {
    pub inputs: Tensor<B, 2, Int>,
    pub targets: Tensor<B, 2, Int>,
    pub documents: Option<Documents<B>>,
}

impl HostBatch {
    /// The given windows of `split`.
    pub fn of_windows(split: &PackedSplit, windows: &[usize]) -> Self {
        let t = split.seq_len();
        let mut inputs = Vec::with_capacity(windows.len() * t);
        let mut targets = Vec::with_capacity(windows.len() * t);
        let mut starts = split.documents().map(|_| Vec::with_capacity(windows.len() * t));
        for &w in windows {
            let tokens = split.window(w);
            inputs.extend(tokens[..t].iter().map(|&x| i64::from(x)));
            let row = targets.len();
            targets.extend(tokens[1..].iter().map(|&x| i64::from(x)));
            if let (Some(spans), Some(starts)) = (split.documents(), starts.as_mut()) {
                spans.mark(w * t, t, starts, &mut targets[row..]);
            }
        }
        Self { inputs, targets, starts, shape: [windows.len(), t] }
    }

    /// Uploads the batch (one write each for inputs, targets and document starts).
    pub fn to_device<B: Backend>(self, device: &B::Device) -> DeviceBatch<B> {
        DeviceBatch {
            inputs: Tensor::from_data(TensorData::new(self.inputs, self.shape), device),
            targets: Tensor::from_data(TensorData::new(self.targets, self.shape), device),
            documents: self
                .starts
                .map(|starts| Documents::new(Tensor::from_data(TensorData::new(starts, self.shape), device))),
        }
    }

    /// Rows `from..to` of the batch: one data-parallel replica's share.
    pub fn rows(&self, from: usize, to: usize) -> Self {
        let t = self.shape[1];
        Self {
            inputs: self.inputs[from * t..to * t].to_vec(),
            targets: self.targets[from * t..to * t].to_vec(),
            starts: self.starts.as_ref().map(|starts| starts[from * t..to * t].to_vec()),
            shape: [to - from, t],
        }
    }
}

/// The given windows of a split as a batch on `device`.
pub fn batch<B: Backend>(split: &PackedSplit, windows: &[usize], device: &B::Device) -> DeviceBatch<B> {
    HostBatch::of_windows(split, windows).to_device::<B>(device)
}
