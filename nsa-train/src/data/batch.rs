//! Batches: windows of a packed split as inputs and next-token targets, assembled on the host and
//! uploaded in one write each.

use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};

use super::corpus::PackedSplit;

/// One micro-batch as the host assembled it: inputs and next-token targets, `[B, T]` row-major.
#[derive(Debug, Clone)]
pub struct HostBatch {
    pub inputs: Vec<i64>,
    pub targets: Vec<i64>,
    pub shape: [usize; 2],
}

impl HostBatch {
    /// The given windows of `split`.
    pub fn of_windows(split: &PackedSplit, windows: &[usize]) -> Self {
        let t = split.seq_len();
        let mut inputs = Vec::with_capacity(windows.len() * t);
        let mut targets = Vec::with_capacity(windows.len() * t);
        for &w in windows {
            let tokens = split.window(w);
            inputs.extend(tokens[..t].iter().map(|&x| i64::from(x)));
            targets.extend(tokens[1..].iter().map(|&x| i64::from(x)));
        }
        Self { inputs, targets, shape: [windows.len(), t] }
    }

    /// Uploads the batch (one write each for inputs and targets).
    pub fn to_device<B: Backend>(self, device: &B::Device) -> (Tensor<B, 2, Int>, Tensor<B, 2, Int>) {
        (
            Tensor::from_data(TensorData::new(self.inputs, self.shape), device),
            Tensor::from_data(TensorData::new(self.targets, self.shape), device),
        )
    }

    /// Rows `from..to` of the batch: one data-parallel replica's share.
    pub fn rows(&self, from: usize, to: usize) -> Self {
        let t = self.shape[1];
        Self {
            inputs: self.inputs[from * t..to * t].to_vec(),
            targets: self.targets[from * t..to * t].to_vec(),
            shape: [to - from, t],
        }
    }
}

/// Inputs and next-token targets `[B, T]` for the given windows of a split, on `device`.
pub fn batch<B: Backend>(
    split: &PackedSplit,
    windows: &[usize],
    device: &B::Device,
) -> (Tensor<B, 2, Int>, Tensor<B, 2, Int>) {
    HostBatch::of_windows(split, windows).to_device::<B>(device)
}
