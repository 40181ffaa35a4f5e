//! The model as burn-train's [`TrainStep`] and [`InferenceStep`], so a stock
//! `SupervisedTraining` + `Learner` trains it (`nsa-train/examples/learner.rs`). `nsa train`
//! keeps its own loop: exact mid-epoch resume needs a data cursor that the 0.21 Learner lacks.

use burn::data::dataloader::batcher::Batcher;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Device, Int, Tensor, TensorData};
use burn::train::{InferenceStep, SequenceOutput, TrainOutput, TrainStep};

use crate::{lm_loss, NsaLm, SparseAttentionBackend};

/// Inputs and next-token targets, `[B, T]`.
#[derive(Clone, Debug)]
pub struct LmBatch<B: Backend> {
    pub inputs: Tensor<B, 2, Int>,
    pub targets: Tensor<B, 2, Int>,
}

/// Batches windows of `T + 1` tokens: inputs are each window's first `T` tokens, targets its
/// last `T`. Every window of a batch has the same length.
#[derive(Clone, Debug, Default)]
pub struct LmBatcher;

impl<B: Backend> Batcher<B, Vec<u32>, LmBatch<B>> for LmBatcher {
    fn batch(&self, windows: Vec<Vec<u32>>, device: &Device<B>) -> LmBatch<B> {
        let t = windows.first().map_or(0, |w| w.len().saturating_sub(1));
        let (mut inputs, mut targets) = (Vec::new(), Vec::new());
        for w in &windows {
            assert_eq!(w.len(), t + 1, "every window of a batch must hold {} tokens", t + 1);
            inputs.extend(w[..t].iter().map(|&x| i64::from(x)));
            targets.extend(w[1..].iter().map(|&x| i64::from(x)));
        }
        let shape = [windows.len(), t];
        LmBatch {
            inputs: Tensor::from_data(TensorData::new(inputs, shape), device),
            targets: Tensor::from_data(TensorData::new(targets, shape), device),
        }
    }
}

impl<B: SparseAttentionBackend> NsaLm<B> {
    /// Logits, loss and targets of a batch, as burn-train's metrics (loss, perplexity,
    /// accuracy) take them.
    pub fn forward_sequence(&self, batch: LmBatch<B>) -> SequenceOutput<B> {
        let logits = self.forward(batch.inputs);
        let loss = lm_loss(logits.clone(), batch.targets.clone());
        SequenceOutput::new(loss, logits, None, batch.targets)
    }
}

impl<B: AutodiffBackend + SparseAttentionBackend> TrainStep for NsaLm<B> {
    type Input = LmBatch<B>;
    type Output = SequenceOutput<B>;

    fn step(&self, batch: LmBatch<B>) -> TrainOutput<SequenceOutput<B>> {
        let item = self.forward_sequence(batch);
        TrainOutput::new(self, item.loss.backward(), item)
    }
}

impl<B: SparseAttentionBackend> InferenceStep for NsaLm<B> {
    type Input = LmBatch<B>;
    type Output = SequenceOutput<B>;

    fn step(&self, batch: LmBatch<B>) -> SequenceOutput<B> {
        self.forward_sequence(batch)
    }
}
