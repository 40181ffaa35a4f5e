//! Axis ticks at round values (1, 2 or 5 times a power of ten) and their labels.

/// Ticks covering `[lo, hi]`: about six round values from the first at or below `lo` to the
/// first at or above `hi`.
pub fn ticks(lo: f64, hi: f64) -> Vec<f64> {
    if !(lo.is_finite() && hi.is_finite()) || hi <= lo {
        return if lo.is_finite() { vec![lo] } else { vec![] };
    }
    let step = round_step((hi - lo) / 6.0);
    let first = (lo / step).floor() as i64;
    let last = (hi / step).ceil() as i64;
    (first..=last).map(|i| i as f64 * step).collect()
}

/// The round value (1, 2 or 5 times a power of ten) nearest above `raw`.
fn round_step(raw: f64) -> f64 {
    let power = 10f64.powf(raw.log10().floor());
    let mantissa = raw / power;
    let round = [1.0, 2.0, 5.0, 10.0].into_iter().find(|&m| m >= mantissa - 1e-9).unwrap_or(10.0);
    round * power
}

/// A tick's label: thousands as `k`, millions as `M`, with as many decimals as the ticks'
/// spacing needs.
pub fn label(value: f64, ticks: &[f64]) -> String {
    let step = match ticks {
        [a, b, ..] => (b - a).abs(),
        _ => value.abs().max(1.0),
    };
    let (scaled, step, suffix) = match value.abs().max(step) {
        m if m >= 1e6 => (value / 1e6, step / 1e6, "M"),
        m if m >= 1e4 => (value / 1e3, step / 1e3, "k"),
        _ => (value, step, ""),
    };
    let decimals = if step >= 1.0 { 0 } else { (-step.log10() - 1e-9).ceil() as usize };
    let text = format!("{scaled:.decimals$}");
    // `-0` reads as a bug on an axis.
    let text = if text.trim_start_matches('-').chars().all(|c| c == '0' || c == '.') {
        text.trim_start_matches('-').to_string()
    } else {
        text
    };
    format!("{text}{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round_and_cover_the_range() {
        assert_eq!(ticks(0.0, 10.0), vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
        let t = ticks(2.37, 5.81);
        assert!(t[0] <= 2.37 && *t.last().unwrap() >= 5.81, "{t:?}");
        assert_eq!(t, vec![2.0, 3.0, 4.0, 5.0, 6.0], "steps of 1 (0.57 rounded up)");
        assert_eq!(ticks(3.0, 3.0), vec![3.0]);
        assert_eq!(label(1500.0, &[0.0, 500.0]), "1500");
        assert_eq!(label(250_000.0, &[0.0, 50_000.0]), "250k");
        assert_eq!(label(0.25, &[0.0, 0.05]), "0.25");
        assert_eq!(label(-0.0, &[0.0, 0.5]), "0.0");
    }
}
