//! Timing a benchmark case: synced runs, and runs queued back to back as a training step and
//! `do_bench` run them.

use std::time::Instant;

use burn::tensor::backend::Backend;

/// The median of `iters` synced runs of `f`, after one run that compiles and autotunes.
pub fn median_ms<B: Backend>(device: &B::Device, iters: usize, mut f: impl FnMut()) -> f64 {
    f(); // compile and autotune
    B::sync(device).expect("device sync");
    let mut times: Vec<f64> = (0..iters)
        .map(|_| {
            let start = Instant::now();
            f();
            B::sync(device).expect("device sync");
            start.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

/// Time per run of `f` queued without a sync between runs (after one synced warm-up run): a
/// queue of `2 * iters` runs less one of `iters`, over `iters`, so that what a queue pays once
/// (its start, its closing sync) cancels. Also the mean time per run of the queue of `iters`,
/// and the host's time to queue a run there (the time before the closing sync). Every run's
/// outputs are kept until the closing sync, so nothing queued can be skipped as unused; a
/// longer queue keeps more of them, so at long paper-shape sequences it would exhaust device
/// memory.
pub fn pipelined_ms<B: Backend, O>(device: &B::Device, iters: usize, mut f: impl FnMut() -> O) -> Pipelined {
    drop(f());
    B::sync(device).expect("device sync");
    let mut queue = |runs: usize| {
        let start = Instant::now();
        let kept: Vec<O> = (0..runs).map(|_| f()).collect();
        let queued = start.elapsed().as_secs_f64() * 1e3;
        B::sync(device).expect("device sync");
        let ms = start.elapsed().as_secs_f64() * 1e3;
        drop(kept);
        (ms, queued)
    };
    let (short, queued) = queue(iters);
    let (long, _) = queue(2 * iters);
    Pipelined { per_run: (long - short) / iters as f64, mean: short / iters as f64, host: queued / iters as f64 }
}

/// [`pipelined_ms`]'s times, in ms.
pub struct Pipelined {
    /// Per run, the queue's own costs cancelled.
    pub per_run: f64,
    /// The mean over a queue of `iters` runs, its own costs included.
    pub mean: f64,
    /// The host's time to queue a run.
    pub host: f64,
}
