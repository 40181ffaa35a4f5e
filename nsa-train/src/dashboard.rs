//! Where a run's progress goes: burn-train's terminal dashboard when stdout is a terminal,
//! plain log lines otherwise (CI logs, `| tee`, files).
//!
//! The training loop is ours (mid-epoch checkpoints with the data cursor, a stop on the first
//! non-finite step), so it drives burn-train's renderer directly with the metric states its
//! Learner would send.

use std::collections::HashMap;
use std::io::IsTerminal;
use std::sync::Arc;

use burn::data::dataloader::Progress;
use burn::train::metric::{
    MetricAttributes, MetricDefinition, MetricEntry, MetricId, NumericAttributes, NumericEntry, SerializedEntry,
};
use burn::train::renderer::tui::TuiMetricsRendererWrapper;
use burn::train::renderer::{MetricState, MetricsRenderer, MetricsRendererTraining, TrainingProgress};
use burn::train::Interrupter;

use crate::metrics::StepMetrics;

/// Receives a run's progress.
pub trait Reporter {
    /// A logged training step.
    fn step(&mut self, metrics: &StepMetrics);
    /// A validation result.
    fn valid(&mut self, step: usize, loss: f64);
    /// A one-line event (checkpoint written, resumed, ...).
    fn event(&mut self, message: &str);
    /// Whether the user asked to stop (the dashboard's `q`, `s`).
    fn stop_requested(&self) -> bool {
        false
    }
}

/// Plain lines: steps on stdout, events on stderr.
pub struct Lines {
    pub total_steps: usize,
}

impl Reporter for Lines {
    fn step(&mut self, m: &StepMetrics) {
        println!("{}", m.line(self.total_steps));
    }
    fn valid(&mut self, step: usize, loss: f64) {
        eprintln!("step {step}: valid loss {loss:.4} ppl {:.2}", loss.exp());
    }
    fn event(&mut self, message: &str) {
        eprintln!("{message}");
    }
}

/// Collects what it is given (tests, programmatic use).
#[derive(Default)]
pub struct Collect {
    pub steps: Vec<StepMetrics>,
    pub valid: Vec<(usize, f64)>,
    pub events: Vec<String>,
}

impl Reporter for Collect {
    fn step(&mut self, m: &StepMetrics) {
        self.steps.push(m.clone());
    }
    fn valid(&mut self, step: usize, loss: f64) {
        self.valid.push((step, loss));
    }
    fn event(&mut self, message: &str) {
        self.events.push(message.to_string());
    }
}

/// burn-train's TUI: metric plots, progress, and `q`, `s` to stop (a checkpoint is written first).
pub struct Dashboard {
    /// Taken on drop, which closes the dashboard and restores the terminal.
    renderer: Option<TuiMetricsRendererWrapper>,
    interrupter: Interrupter,
    ids: HashMap<&'static str, MetricId>,
    total_steps: usize,
    /// Shown again after the dashboard closes: the terminal returns to its previous screen.
    last_line: Option<String>,
    events: Vec<String>,
}

impl Dashboard {
    pub fn new(total_steps: usize) -> Self {
        let interrupter = Interrupter::new();
        Self {
            renderer: Some(TuiMetricsRendererWrapper::new(interrupter.clone(), None)),
            interrupter,
            ids: HashMap::new(),
            total_steps,
            last_line: None,
            events: Vec::new(),
        }
    }

    fn id(&mut self, name: &'static str, unit: Option<&str>, higher_is_better: bool) -> MetricId {
        if let Some(id) = self.ids.get(name) {
            return id.clone();
        }
        let id = MetricId::new(Arc::new(name.to_string()));
        self.renderer().register_metric(MetricDefinition {
            metric_id: id.clone(),
            name: name.to_string(),
            description: None,
            attributes: MetricAttributes::Numeric(NumericAttributes {
                unit: unit.map(str::to_string),
                higher_is_better,
            }),
        });
        self.ids.insert(name, id.clone());
        id
    }

    fn renderer(&mut self) -> &mut TuiMetricsRendererWrapper {
        self.renderer.as_mut().expect("the dashboard is open until dropped")
    }

    fn state(&mut self, metric: &Metric) -> MetricState {
        let id = self.id(metric.name, metric.unit, metric.higher_is_better);
        let formatted = format!("{}: {}", metric.name, metric.formatted);
        let entry = MetricEntry::new(id, SerializedEntry::new(formatted, metric.value.to_string()));
        MetricState::Numeric(entry, NumericEntry::Value(metric.value))
    }

    fn progress(&self, step: usize) -> TrainingProgress {
        TrainingProgress {
            progress: Some(Progress { items_processed: step, items_total: self.total_steps }),
            global_progress: Progress { items_processed: 1, items_total: 1 },
            iteration: Some(step),
        }
    }
}

impl Reporter for Dashboard {
    fn step(&mut self, m: &StepMetrics) {
        for metric in metrics_of(m) {
            let state = self.state(&metric);
            self.renderer().update_train(state);
        }
        let progress = self.progress(m.step);
        self.renderer().render_train(progress, vec![]);
        self.last_line = Some(m.line(self.total_steps));
    }
    fn valid(&mut self, step: usize, loss: f64) {
        let metric =
            Metric { name: "loss", value: loss, formatted: format!("{loss:.4}"), unit: None, higher_is_better: false };
        let state = self.state(&metric);
        self.renderer().update_valid(state);
        let progress = self.progress(step);
        self.renderer().render_valid(progress, vec![]);
        self.events.push(format!("step {step}: valid loss {loss:.4} ppl {:.2}", loss.exp()));
    }
    fn event(&mut self, message: &str) {
        self.events.push(message.to_string());
    }
    fn stop_requested(&self) -> bool {
        self.interrupter.should_stop()
    }
}

impl Drop for Dashboard {
    fn drop(&mut self) {
        // The renderer restores the terminal when dropped; then reprint what the run ended with.
        if let Some(mut renderer) = self.renderer.take() {
            let _ = renderer.on_train_end(None);
        }
        for event in self.events.iter().rev().take(5).rev() {
            eprintln!("{event}");
        }
        if let Some(line) = &self.last_line {
            println!("{line}");
        }
    }
}

/// The dashboard when stdout is a terminal and `dashboard` is on, plain lines otherwise.
pub fn reporter(dashboard: bool, total_steps: usize) -> Box<dyn Reporter> {
    if dashboard && std::io::stdout().is_terminal() {
        Box::new(Dashboard::new(total_steps))
    } else {
        Box::new(Lines { total_steps })
    }
}

/// One numeric metric as the dashboard shows it. Names are valid file names.
struct Metric {
    name: &'static str,
    value: f64,
    formatted: String,
    unit: Option<&'static str>,
    higher_is_better: bool,
}

fn metrics_of(m: &StepMetrics) -> Vec<Metric> {
    let metric = |name, value: f64, precision: usize, unit, higher_is_better| Metric {
        name,
        value,
        formatted: format!("{value:.precision$}"),
        unit,
        higher_is_better,
    };
    let mut out = vec![
        metric("loss", m.loss, 4, None, false),
        metric("perplexity", m.perplexity, 2, None, false),
        metric("tokens_per_s", m.tokens_per_s, 0, Some("tok/s"), true),
        Metric {
            name: "learning_rate",
            value: m.lr,
            formatted: format!("{:.2e}", m.lr),
            unit: None,
            higher_is_better: true,
        },
        metric("grad_norm", m.grad_norm, 3, None, false),
    ];
    let optional = [
        ("gate_cmp", m.gate_cmp, 3, None),
        ("gate_slc", m.gate_slc, 3, None),
        ("gate_win", m.gate_win, 3, None),
        ("gate_entropy", m.gate_entropy, 3, None),
        ("sel_blocks_per_query", m.sel_blocks_per_query, 2, None),
        ("sel_forced_share", m.sel_forced_share, 3, None),
        ("memory_in_use_gib", m.memory_in_use_gib, 2, Some("GiB")),
        ("memory_reserved_gib", m.memory_reserved_gib, 2, Some("GiB")),
    ];
    for (name, value, precision, unit) in optional {
        if let Some(v) = value {
            out.push(metric(name, v, precision, unit, true));
        }
    }
    for (i, &gib) in m.peer_memory_reserved_gib.iter().enumerate() {
        out.push(metric(
            PEER_MEMORY.get(i).copied().unwrap_or("memory_reserved_gib_rank_n"),
            gib,
            2,
            Some("GiB"),
            true,
        ));
    }
    out
}

/// The dashboard's names of the other replicas' memory (its metric names are static).
const PEER_MEMORY: [&str; 7] = [
    "memory_reserved_gib_rank_1",
    "memory_reserved_gib_rank_2",
    "memory_reserved_gib_rank_3",
    "memory_reserved_gib_rank_4",
    "memory_reserved_gib_rank_5",
    "memory_reserved_gib_rank_6",
    "memory_reserved_gib_rank_7",
];
