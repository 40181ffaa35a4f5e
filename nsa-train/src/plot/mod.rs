//! Charts as PNG files, drawn without a plotting crate: a run's (or several runs') loss,
//! tokens/s and gate shares from `metrics.jsonl` ([`runs`]), and the needle evaluation's heat
//! map ([`heat_map`]).

pub mod canvas;
mod font;
pub mod heat_map;
pub mod line_chart;
pub mod runs;
mod ticks;

pub use canvas::Canvas;
pub use heat_map::HeatMap;
pub use line_chart::{LineChart, Series, Style};

use std::path::Path;

/// Writes `canvas` to `path` as a PNG file.
pub fn write_png(canvas: &Canvas, path: &Path) -> Result<(), String> {
    std::fs::write(path, canvas.png()).map_err(|e| format!("cannot write {}: {e}", path.display()))
}
