//! SIGTERM and SIGINT (a cluster's preemption, Ctrl-C) as a request to stop a training run at a
//! step boundary: the loop sees the request before it queues its next step, finishes that step,
//! writes a checkpoint, and `nsa train` exits with [`PREEMPTED`], so a job script can tell a
//! preempted run (resume it with `--resume`) from a failed one. A second signal exits at once
//! with [`FORCED`] and writes nothing more.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use signal_hook::consts::{SIGINT, SIGTERM};

use crate::dashboard::Reporter;
use crate::metrics::StepMetrics;

/// Exit status of a run stopped by a signal after its checkpoint was written (sysexits'
/// `EX_TEMPFAIL`: try again later).
pub const PREEMPTED: u8 = 75;
/// Exit status after a second signal: stopped at once, no checkpoint of the current step.
pub const FORCED: i32 = 130;

/// Whether SIGTERM or SIGINT has arrived since [`StopSignals::install`].
#[derive(Clone)]
pub struct StopSignals {
    received: Arc<AtomicBool>,
}

impl StopSignals {
    /// Routes SIGTERM and SIGINT to the flag; a signal that finds it already set exits the
    /// process with [`FORCED`].
    pub fn install() -> Result<Self, String> {
        let received = Arc::new(AtomicBool::new(false));
        for signal in [SIGTERM, SIGINT] {
            // Registered first, so it runs first: it exits only when an earlier signal has
            // already set the flag that the next line's handler sets.
            signal_hook::flag::register_conditional_shutdown(signal, FORCED, received.clone())
                .and_then(|_| signal_hook::flag::register(signal, received.clone()))
                .map_err(|e| format!("cannot handle signal {signal}: {e}"))?;
        }
        Ok(Self { received })
    }

    pub fn received(&self) -> bool {
        self.received.load(Ordering::SeqCst)
    }
}

/// A [`Reporter`] whose stop request is also a received signal.
pub struct Preemptible {
    pub inner: Box<dyn Reporter>,
    pub signals: StopSignals,
}

impl Reporter for Preemptible {
    fn step(&mut self, metrics: &StepMetrics) {
        self.inner.step(metrics)
    }

    fn valid(&mut self, step: usize, loss: f64) {
        self.inner.valid(step, loss)
    }

    fn event(&mut self, message: &str) {
        self.inner.event(message)
    }

    fn stop_requested(&self) -> bool {
        self.signals.received() || self.inner.stop_requested()
    }
}
