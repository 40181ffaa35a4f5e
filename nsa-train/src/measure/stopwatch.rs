//! Timing one phase of a step on its own: each run followed by a device sync, the median of
//! several runs after a warm-up (which also absorbs kernel compilation and autotuning), and the
//! device memory a phase's result holds.

use std::time::Instant;

use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, FloatDType, Tensor};

use crate::metrics::MemoryProbe;

/// Times phases on one device.
pub(crate) struct Stopwatch<B: Backend> {
    pub device: B::Device,
    pub probe: Option<MemoryProbe>,
    pub warmup: usize,
    pub iters: usize,
    /// The dtype forward passes run in (`None`: f32), for the random inputs of [`Self::random`].
    pub dtype: Option<FloatDType>,
}

impl<B: Backend> Stopwatch<B> {
    /// Waits for the device.
    pub fn sync(&self) {
        B::sync(&self.device).expect("device sync");
    }

    /// Median of `run`'s results (ms) after the warm-up runs.
    pub fn median_of(&self, mut run: impl FnMut() -> f64) -> f64 {
        for _ in 0..self.warmup {
            run();
        }
        let mut samples: Vec<f64> = (0..self.iters).map(|_| run()).collect();
        samples.sort_by(f64::total_cmp);
        samples[samples.len() / 2]
    }

    /// Median wall time in ms of `f`.
    pub fn time(&self, mut f: impl FnMut()) -> f64 {
        self.time_with(|| (), |()| f())
    }

    /// Median time of `f` on a fresh input from `prepare` each run; making the input is not timed
    /// (random tensors are slow to draw on the CPU backend and would otherwise dominate a phase).
    pub fn time_with<I>(&self, mut prepare: impl FnMut() -> I, mut f: impl FnMut(I)) -> f64 {
        self.median_of(|| {
            let input = prepare();
            self.sync();
            let start = Instant::now();
            f(input);
            self.sync();
            start.elapsed().as_secs_f64() * 1e3
        })
    }

    /// GiB that `make`'s result holds on the device while it lives, where the backend reports
    /// memory.
    pub fn held<T>(&self, make: impl FnOnce() -> T) -> Option<f64> {
        let before = self.in_use()?;
        let kept = make();
        let after = self.in_use()?;
        drop(kept);
        Some((after as f64 - before as f64) / crate::failures::GIB)
    }

    /// Device memory in use (bytes) after a sync.
    fn in_use(&self) -> Option<u64> {
        self.sync();
        self.probe.as_ref().and_then(|p| p()).map(|m| m.in_use)
    }

    /// A random input of `shape` (normal, deviation `std`) in the compute dtype, tracked for
    /// gradients.
    pub fn random<const D: usize>(&self, shape: [usize; D], std: f64) -> Tensor<B, D> {
        let x = Tensor::<B, D>::random(shape, Distribution::Normal(0.0, std), &self.device);
        match self.dtype {
            Some(d) => x.cast(d),
            None => x,
        }
        .require_grad()
    }
}
