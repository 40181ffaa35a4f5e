//! A run's `metrics.jsonl` as series, and the charts `nsa plot` draws from one or more runs.

use std::path::Path;

use serde_json::Value;

use super::line_chart::{LineChart, Series, Style, PALETTE};

/// What a run logged: per training step its loss, tokens/s and gate shares; per validation
/// its loss.
#[derive(Clone, Debug, Default)]
pub struct RunMetrics {
    pub name: String,
    pub loss: Vec<(f64, f64)>,
    pub tokens_per_s: Vec<(f64, f64)>,
    /// Mean gate shares `[compressed, selected, window]` per step (NSA runs only).
    pub gates: Vec<(f64, [f64; 3])>,
    pub valid_loss: Vec<(f64, f64)>,
}

impl RunMetrics {
    /// Reads `dir/metrics.jsonl`; the run is named by its directory. A line that is not a JSON
    /// object (a write cut short by a crash) is skipped.
    pub fn read(dir: &Path) -> Result<Self, String> {
        let path = dir.join("metrics.jsonl");
        let text = std::fs::read_to_string(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let name = dir.file_name().map_or_else(|| dir.display().to_string(), |n| n.to_string_lossy().into_owned());
        let mut run = RunMetrics { name, ..Default::default() };
        for entry in text.lines().filter_map(|line| serde_json::from_str::<Value>(line).ok()) {
            run.add(&entry);
        }
        if run.loss.is_empty() && run.valid_loss.is_empty() {
            return Err(format!("{} holds no logged step", path.display()));
        }
        Ok(run)
    }

    fn add(&mut self, entry: &Value) {
        let number = |key: &str| entry.get(key).and_then(Value::as_f64);
        let Some(step) = number("step") else { return };
        if let Some(loss) = number("valid_loss") {
            self.valid_loss.push((step, loss));
            return;
        }
        if let Some(loss) = number("loss") {
            self.loss.push((step, loss));
        }
        if let Some(rate) = number("tokens_per_s") {
            self.tokens_per_s.push((step, rate));
        }
        if let (Some(c), Some(s), Some(w)) = (number("gate_cmp"), number("gate_slc"), number("gate_win")) {
            self.gates.push((step, [c, s, w]));
        }
    }
}

/// The charts of `runs`, each with its file name: the loss (training lines, validation marks),
/// tokens/s, and the gate shares where any run has them.
pub fn charts(runs: &[RunMetrics]) -> Vec<(&'static str, LineChart)> {
    let color = |i: usize| PALETTE[i % PALETTE.len()];
    let series = |label: String, points: &[(f64, f64)], i: usize, style: Style| Series {
        label,
        points: points.to_vec(),
        color: color(i),
        style,
    };
    let mut loss = Vec::new();
    for (i, run) in runs.iter().enumerate() {
        loss.push(series(format!("{} train", run.name), &run.loss, i, Style::Line));
        if !run.valid_loss.is_empty() {
            loss.push(series(format!("{} valid", run.name), &run.valid_loss, i, Style::Marks));
        }
    }
    let rates = runs.iter().enumerate().map(|(i, run)| series(run.name.clone(), &run.tokens_per_s, i, Style::Line));
    let chart = |title: &str, y_label: &str, series: Vec<Series>| LineChart {
        title: title.to_string(),
        x_label: "step".to_string(),
        y_label: y_label.to_string(),
        series,
    };
    let mut charts = vec![
        ("loss.png", chart("Loss", "nats/token", loss)),
        ("tokens_per_s.png", chart("Training speed", "tokens/s", rates.collect())),
    ];
    let gated: Vec<&RunMetrics> = runs.iter().filter(|run| !run.gates.is_empty()).collect();
    if !gated.is_empty() {
        let mut gates = Vec::new();
        for (r, run) in gated.iter().enumerate() {
            for (b, branch) in ["compressed", "selected", "window"].into_iter().enumerate() {
                let points: Vec<(f64, f64)> = run.gates.iter().map(|&(step, g)| (step, g[b])).collect();
                let label = if gated.len() == 1 { branch.to_string() } else { format!("{} {branch}", run.name) };
                gates.push(series(label, &points, 3 * r + b, Style::Line));
            }
        }
        charts.push(("gates.png", chart("Gate shares", "mean gate", gates)));
    }
    charts
}
