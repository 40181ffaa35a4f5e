//! The host's time to queue each part of a training step (`Replica::host`, read by
//! `nsa bench-train`).

use std::time::Instant;

/// The host's time to queue (record, not run) each part of a step, ms summed over steps: Burn
/// records every op for autodiff and fusion and launches its kernels, and CubeCL's server waits
/// for the device every 64 uploads, so this is the host's own work plus those waits.
#[derive(Debug, Clone, Default)]
pub struct HostTimes {
    /// Data, forward pass and loss.
    pub forward_ms: f64,
    /// The backward pass and gradient accumulation.
    pub backward_ms: f64,
    /// Clipping, weight decay and the optimiser's update.
    pub optimiser_ms: f64,
}

/// Laps of the host's clock.
pub(crate) struct HostClock(Instant);

impl HostClock {
    pub(crate) fn start() -> Self {
        Self(Instant::now())
    }

    /// Adds the time since the last lap to `total`.
    pub(crate) fn lap(&mut self, total: &mut f64) {
        let now = Instant::now();
        *total += (now - self.0).as_secs_f64() * 1e3;
        self.0 = now;
    }
}

impl HostTimes {
    /// The time added since `before`: forward and loss, backward, optimiser.
    pub fn since(&self, before: &HostTimes) -> [f64; 3] {
        [
            self.forward_ms - before.forward_ms,
            self.backward_ms - before.backward_ms,
            self.optimiser_ms - before.optimiser_ms,
        ]
    }
}
