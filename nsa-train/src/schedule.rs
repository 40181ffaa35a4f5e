//! Learning rate: linear warm-up to the peak, then cosine decay to `peak * min_lr_ratio`.
//! A pure function of the step, so resuming needs no scheduler state.

use crate::config::TrainConfig;

/// Learning rate for optimiser step `step` (0-based).
pub fn learning_rate(cfg: &TrainConfig, step: usize) -> f64 {
    let peak = cfg.lr;
    if step < cfg.warmup_steps {
        return peak * (step + 1) as f64 / cfg.warmup_steps as f64;
    }
    let decay_steps = cfg.steps.saturating_sub(cfg.warmup_steps).max(1);
    let progress = ((step - cfg.warmup_steps) as f64 / decay_steps as f64).min(1.0);
    let floor = peak * cfg.min_lr_ratio;
    floor + (peak - floor) * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warmup_then_cosine_to_the_floor() {
        let cfg = TrainConfig::new().with_lr(1.0).with_warmup_steps(10).with_steps(110).with_min_lr_ratio(0.1);
        assert!((learning_rate(&cfg, 0) - 0.1).abs() < 1e-12);
        assert!((learning_rate(&cfg, 9) - 1.0).abs() < 1e-12);
        assert!((learning_rate(&cfg, 10) - 1.0).abs() < 1e-12);
        assert!((learning_rate(&cfg, 60) - 0.55).abs() < 1e-12);
        assert!((learning_rate(&cfg, 110) - 0.1).abs() < 1e-12);
        assert!((learning_rate(&cfg, 500) - 0.1).abs() < 1e-12);
    }
}
