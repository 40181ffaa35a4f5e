//! `nsa plot`: the loss, tokens/s and gate shares of one or more runs as PNG charts, runs side
//! by side on each chart.

use std::path::PathBuf;

use nsa_train::plot::runs::{charts, RunMetrics};
use nsa_train::plot::write_png;

#[derive(clap::Args)]
pub(crate) struct PlotArgs {
    /// Run directories (each with its `metrics.jsonl`).
    #[arg(required = true, num_args = 1..)]
    runs: Vec<PathBuf>,
    /// Directory the charts are written to (made if missing).
    #[arg(long, default_value = "plots")]
    out: PathBuf,
}

pub(crate) fn plot(args: PlotArgs) -> Result<(), String> {
    let runs = args.runs.iter().map(|dir| RunMetrics::read(dir)).collect::<Result<Vec<_>, _>>()?;
    std::fs::create_dir_all(&args.out).map_err(|e| format!("cannot create {}: {e}", args.out.display()))?;
    for (file, chart) in charts(&runs) {
        let path = args.out.join(file);
        write_png(&chart.draw(), &path)?;
        println!("{}", path.display());
    }
    Ok(())
}
