//! Training an NSA model with burn-train's stock `SupervisedTraining` and `Learner`: `NsaLm` is
//! a `TrainStep` and an `InferenceStep` on `LmBatch`es, so a Burn training setup takes it as it
//! takes any model. (`nsa train` keeps its own loop, for exact mid-epoch resume.)
//!
//! `cargo run --release -p nsa-train --example learner` trains `configs/tiny.toml`'s model on the
//! copy task for a few epochs on the CPU, with burn-train's dashboard on a terminal.

use std::path::Path;

use burn::backend::{Autodiff, Flex};
use burn::data::dataloader::DataLoaderBuilder;
use burn::data::dataset::InMemDataset;
use burn::optim::AdamWConfig;
use burn::train::logger::InMemoryMetricLogger;
use burn::train::metric::{LossMetric, PerplexityMetric};
use burn::train::renderer::{CliMetricsRenderer, MetricsRenderer};
use burn::train::{Learner, SupervisedTraining};
use nsa_core::learner::LmBatcher;
use nsa_core::NsaLm;
use nsa_train::config::RunConfig;
use nsa_train::data::corpus::PackedSplit;
use nsa_train::data::synthetic::{splits, SyntheticTask};

type B = Autodiff<Flex>;

/// `configs/tiny.toml`'s model config, freshly initialised.
fn tiny_model() -> (NsaLm<B>, usize) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/tiny.toml");
    let cfg = RunConfig::load(&path).expect("configs/tiny.toml loads");
    (cfg.model.init::<B>(&Default::default()), cfg.model.seq_len)
}

/// The copy task's windows of `seq_len + 1` tokens: training and validation.
fn windows(seq_len: usize) -> (Vec<Vec<u32>>, Vec<Vec<u32>>) {
    let (train, valid) = splits(SyntheticTask::Copy, seq_len, 1, 64, 42);
    let all = |s: &PackedSplit| (0..s.num_windows()).map(|w| s.window(w).to_vec()).collect();
    (all(&train), all(&valid))
}

/// Trains `model` for `epochs` with a stock `SupervisedTraining` (files under `dir`); `renderer`
/// replaces burn-train's default (its dashboard on a terminal).
fn train<R: MetricsRenderer + 'static>(
    model: NsaLm<B>,
    seq_len: usize,
    epochs: usize,
    dir: &Path,
    renderer: Option<R>,
) -> NsaLm<Flex> {
    let (train, valid) = windows(seq_len);
    let train = DataLoaderBuilder::new(LmBatcher).batch_size(8).shuffle(42).build(InMemDataset::new(train));
    let valid = DataLoaderBuilder::new(LmBatcher).batch_size(8).build(InMemDataset::new(valid));
    let mut training = SupervisedTraining::new(dir, train, valid)
        .metrics((LossMetric::new(), PerplexityMetric::new()))
        .num_epochs(epochs)
        .with_application_logger(None)
        .with_metric_logger(InMemoryMetricLogger::new());
    if let Some(renderer) = renderer {
        training = training.renderer(renderer);
    }
    let learner = Learner::new(model, AdamWConfig::new().init(), 2e-3);
    training.launch(learner).model
}

fn main() {
    let (model, seq_len) = tiny_model();
    let dir = std::env::temp_dir().join("nsa-learner-example");
    let trained = train(model, seq_len, 4, &dir, None::<CliMetricsRenderer>);
    println!("trained {} parameters", burn::module::Module::num_params(&trained));
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::module::AutodiffModule;
    use burn::train::metric::MetricDefinition;
    use burn::train::renderer::{
        EvaluationName, EvaluationProgress, MetricState, MetricsRendererEvaluation, MetricsRendererTraining,
        ProgressType, TrainingProgress,
    };
    use nsa_core::learner::LmBatch;

    /// Shows nothing: tests run headless.
    struct Silent;
    impl MetricsRendererTraining for Silent {
        fn update_train(&mut self, _: MetricState) {}
        fn update_valid(&mut self, _: MetricState) {}
        fn render_train(&mut self, _: TrainingProgress, _: Vec<ProgressType>) {}
        fn render_valid(&mut self, _: TrainingProgress, _: Vec<ProgressType>) {}
    }
    impl MetricsRendererEvaluation for Silent {
        fn update_test(&mut self, _: EvaluationName, _: MetricState) {}
        fn render_test(&mut self, _: EvaluationProgress, _: Vec<ProgressType>) {}
    }
    impl MetricsRenderer for Silent {
        fn manual_close(&mut self) {}
        fn register_metric(&mut self, _: MetricDefinition) {}
    }

    /// The model's loss on the validation windows.
    fn valid_loss(model: &NsaLm<Flex>, seq_len: usize) -> f32 {
        let (_, valid) = windows(seq_len);
        let batch: LmBatch<Flex> =
            burn::data::dataloader::batcher::Batcher::batch(&LmBatcher, valid, &Default::default());
        model.forward_sequence(batch).loss.into_scalar()
    }

    #[test]
    fn the_stock_learner_trains_nsa_lm() {
        let (model, seq_len) = tiny_model();
        let before = valid_loss(&model.valid(), seq_len);
        let dir = std::env::temp_dir().join(format!("nsa-learner-test-{}", std::process::id()));
        let trained = train(model, seq_len, 3, &dir, Some(Silent));
        let after = valid_loss(&trained, seq_len);
        let _ = std::fs::remove_dir_all(&dir);
        assert!(after < 0.8 * before, "validation loss {before:.3} -> {after:.3}: the Learner did not train it");
    }
}
