//! SIGTERM and SIGINT (a cluster's preemption, Ctrl-C) as a request to stop a training run at a
//! step boundary: the loop sees the request before it queues its next step, finishes that step,
//! writes a checkpoint, and `nsa train` exits with [`PREEMPTED`], so a job script can tell a
//! preempted run (resume it with `--resume`) from a failed one. A second signal exits at once
//! with [`FORCED`] and writes nothing more, unless it comes within [`SAME_REQUEST`] of the first:
//! `timeout` sends its SIGTERM to the process and again to its process group, and a scheduler may
//! signal a job's processes and their group alike, so one request often arrives twice.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

use crate::dashboard::Reporter;
use crate::metrics::StepMetrics;

/// Exit status of a run stopped by a signal after its checkpoint was written (sysexits'
/// `EX_TEMPFAIL`: try again later).
pub const PREEMPTED: u8 = 75;
/// Exit status after a second signal: stopped at once, no checkpoint of the current step.
pub const FORCED: i32 = 130;
/// Signals this soon after the first are the same request delivered again, not a second one.
pub const SAME_REQUEST: Duration = Duration::from_secs(1);

/// Whether SIGTERM or SIGINT has arrived since [`StopSignals::install`].
#[derive(Clone)]
pub struct StopSignals {
    received: Arc<AtomicBool>,
}

/// What a signal arriving at `now` asks, given when the first one came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Request {
    /// The first: stop after the step in flight, with a checkpoint.
    Stop,
    /// The first again (within [`SAME_REQUEST`]).
    Repeated,
    /// A second, later signal: exit now.
    Force,
}

/// The request of a signal at `now`, recording it in `first` when it is the first.
fn request(first: &mut Option<Instant>, now: Instant) -> Request {
    match *first {
        None => {
            *first = Some(now);
            Request::Stop
        }
        Some(at) if now.saturating_duration_since(at) < SAME_REQUEST => Request::Repeated,
        Some(_) => Request::Force,
    }
}

impl StopSignals {
    /// Routes SIGTERM and SIGINT to the flag through a thread of their own (the handlers only
    /// wake it), which exits the process with [`FORCED`] on a second request.
    pub fn install() -> Result<Self, String> {
        let received = Arc::new(AtomicBool::new(false));
        let mut signals = Signals::new([SIGTERM, SIGINT]).map_err(|e| format!("cannot handle signals: {e}"))?;
        let flag = received.clone();
        std::thread::Builder::new()
            .name("stop-signals".into())
            .spawn(move || {
                let mut first = None;
                for _ in signals.forever() {
                    match request(&mut first, Instant::now()) {
                        Request::Stop => flag.store(true, Ordering::SeqCst),
                        Request::Repeated => {}
                        // `_exit`: no exit handlers, which could wait on the device threads.
                        Request::Force => signal_hook::low_level::exit(FORCED),
                    }
                }
            })
            .map_err(|e| format!("cannot start the signal thread: {e}"))?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signal_repeated_at_once_is_one_request_and_a_later_one_forces() {
        let t0 = Instant::now();
        let mut first = None;
        assert_eq!(request(&mut first, t0), Request::Stop);
        assert_eq!(request(&mut first, t0 + Duration::from_millis(5)), Request::Repeated);
        assert_eq!(request(&mut first, t0 + SAME_REQUEST / 2), Request::Repeated);
        assert_eq!(request(&mut first, t0 + SAME_REQUEST), Request::Force);
        assert_eq!(request(&mut first, t0 + 10 * SAME_REQUEST), Request::Force);
    }
}
