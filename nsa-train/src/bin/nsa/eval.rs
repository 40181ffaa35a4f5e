//! `nsa eval`: a checkpoint's held-out loss, perplexity and bits per byte over text files;
//! `nsa eval needle`: its passkey retrieval per context length and depth.

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use nsa_core::SparseAttentionBackend;
use nsa_train::evaluate::{evaluate, EvalText, Evaluation};
use nsa_train::files;
use nsa_train::needle::{
    digit_share, heat_map, needle_in_a_haystack, table, NeedleCell, NeedleOptions, NeedleReport, ANSWER_TOKENS,
};
use nsa_train::plot::write_png;
use nsa_train::signals::{StopSignals, PREEMPTED};
use nsa_train::with_inference_backend;

use crate::trained::{Loaded, RunOn};

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub(crate) struct EvalArgs {
    #[command(subcommand)]
    task: Option<EvalTask>,
    /// A run directory (its newest checkpoint) or one checkpoint directory.
    #[arg(long, required = true)]
    checkpoint: Option<PathBuf>,
    /// Held-out text: `.txt`, `.jsonl` or `.parquet` files, or directories of them.
    #[arg(long, required = true, num_args = 1..)]
    data: Vec<PathBuf>,
    /// Windows of the model's length per forward (default: the run's `train.batch_size`).
    #[arg(long)]
    batch_size: Option<usize>,
    /// Evaluate only the first N windows.
    #[arg(long)]
    max_windows: Option<usize>,
    #[command(flatten)]
    run_on: RunOn,
    /// Also write the result as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(clap::Subcommand)]
enum EvalTask {
    /// Passkey retrieval: a random five-digit key hidden at each depth of filler text of each
    /// length, the model asked for it; accuracy per (length, depth) over `--trials` keys.
    Needle(NeedleArgs),
}

#[derive(clap::Args)]
pub(crate) struct NeedleArgs {
    /// A run directory (its newest checkpoint) or one checkpoint directory.
    #[arg(long)]
    checkpoint: PathBuf,
    /// Haystack lengths in tokens (`k` = 1024), question included (default: those of 1k, 4k, 16k
    /// and 64k shorter than the longest that fits the model's seq_len with the answer, and that
    /// longest).
    #[arg(long, value_delimiter = ',', value_parser = parse_length)]
    lengths: Vec<usize>,
    /// The context the model runs at, in tokens (default: the seq_len it trained at): a longer
    /// one asks how retrieval holds past the trained length, at positions it never saw.
    #[arg(long, value_parser = parse_length)]
    context: Option<usize>,
    /// Needle depths, percent of the filler before it.
    #[arg(long, value_delimiter = ',', default_value = "0,10,20,30,40,50,60,70,80,90,100")]
    depths: Vec<u32>,
    /// Keys per (length, depth).
    #[arg(long, default_value_t = 8)]
    trials: usize,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[command(flatten)]
    run_on: RunOn,
    /// Also write the cells as JSON here, rewritten after each cell: a run stopped early (a
    /// signal, an error) keeps the cells it ran.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Also draw the accuracy per length and depth as a PNG heat map here.
    #[arg(long)]
    heat_map: Option<PathBuf>,
    /// Go on from the `--json` of an earlier run stopped early: its cells are kept where this
    /// run asks the same keys of the same checkpoint, and only the rest are run.
    #[arg(long, requires = "json")]
    resume: bool,
}

/// `4k` as 4096, `1000` as 1000.
fn parse_length(text: &str) -> Result<usize, String> {
    let (digits, scale) = match text.strip_suffix(['k', 'K']) {
        Some(digits) => (digits, 1024),
        None => (text, 1),
    };
    match digits.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n * scale),
        _ => Err(format!("`{text}` is not a length (e.g. 4096 or 4k)")),
    }
}

pub(crate) fn eval(args: EvalArgs) -> Result<ExitCode, String> {
    if let Some(EvalTask::Needle(args)) = args.task {
        return needle(args);
    }
    if args.batch_size == Some(0) || args.max_windows == Some(0) {
        return Err("--batch-size and --max-windows take numbers of at least 1".into());
    }
    let loaded = Loaded::open(args.checkpoint.as_deref().expect("clap requires it"), &args.run_on)?;
    let cfg = &loaded.cfg;
    let text = EvalText::read(
        &args.data,
        &loaded.tokenizer()?,
        cfg.model.seq_len,
        cfg.data.pack,
        cfg.model.document_alignment(),
    )
    .map_err(|e| e.to_string())?;
    let job = Job {
        loaded: &loaded,
        text: &text,
        batch_size: args.batch_size.unwrap_or(cfg.train.batch_size),
        max_windows: args.max_windows,
    };
    let result = with_inference_backend!(loaded.kind, true, |B, device, _memory| job.run::<B>(&device))?;
    println!(
        "loss {:.4} nats/token, perplexity {:.3}, {:.4} bits/byte over {} tokens ({} windows of {})",
        result.loss, result.perplexity, result.bits_per_byte, result.tokens, result.windows, cfg.model.seq_len
    );
    if let Some(path) = args.json {
        let text = serde_json::to_string_pretty(&result).expect("the result serialises");
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// What one `nsa eval` scores.
struct Job<'a> {
    loaded: &'a Loaded,
    text: &'a EvalText,
    batch_size: usize,
    max_windows: Option<usize>,
}

impl Job<'_> {
    fn run<B: SparseAttentionBackend>(&self, device: &B::Device) -> Result<Evaluation, String> {
        let model = self.loaded.model::<B>(device)?;
        // A line every few seconds and a last one: a large file takes minutes on the CPU.
        let mut last = Instant::now();
        let progress = |done: usize, total: usize, loss: f64| {
            if done == total || last.elapsed() >= Duration::from_secs(5) {
                eprintln!("eval: {done}/{total} windows, loss so far {loss:.4}");
                last = Instant::now();
            }
        };
        Ok(evaluate(&model, self.text, self.batch_size, self.max_windows, device, progress))
    }
}

fn needle(args: NeedleArgs) -> Result<ExitCode, String> {
    if args.trials == 0 || args.depths.iter().any(|&d| d > 100) || args.depths.is_empty() {
        return Err("--trials takes a number of at least 1 and --depths percentages from 0 to 100".into());
    }
    let mut loaded = Loaded::open(&args.checkpoint, &args.run_on)?;
    if let Some(context) = args.context {
        // The RoPE table is the only part sized by seq_len, and it is built, not loaded.
        loaded.cfg.model.seq_len = context;
    }
    let tokenizer = loaded.tokenizer()?;
    let lengths = match args.lengths.is_empty() {
        true => default_lengths(loaded.cfg.model.seq_len),
        false => args.lengths,
    };
    let opts = NeedleOptions { lengths, depths: args.depths, trials: args.trials, seed: args.seed };
    let mut report = NeedleReport {
        // Absolute, so that `--resume` from another directory finds the same checkpoint.
        checkpoint: loaded.ckpt.canonicalize().unwrap_or_else(|_| loaded.ckpt.clone()).display().to_string(),
        context: loaded.cfg.model.seq_len,
        runs_on: loaded.runs_on(),
        complete: false,
        cells: Vec::new(),
    };
    let kept = match (&args.json, args.resume) {
        (Some(path), true) => kept_cells(path, &report)?,
        _ => Vec::new(),
    };
    let signals = StopSignals::install()?;
    let total = opts.lengths.len() * opts.depths.len();
    let cells = with_inference_backend!(loaded.kind, false, |B, device, _memory| {
        let model = loaded.model::<B>(&device)?;
        needle_in_a_haystack(&model, &tokenizer, &opts, &kept, &device, |cells, was_kept| {
            let cell = cells.last().expect("called after a cell");
            eprintln!(
                "needle: {}/{total}: length {} depth {}%: {}/{} keys, {:.0}% of their digits{}",
                cells.len(),
                cell.length,
                cell.depth,
                cell.correct,
                cell.trials,
                100.0 * cell.digit_accuracy(),
                if was_kept { " (kept)" } else { "" }
            );
            if let Some(path) = &args.json {
                let so_far = NeedleReport { cells: cells.to_vec(), ..report.clone() };
                if let Err(e) = write_report(path, &so_far) {
                    eprintln!("warning: {e}");
                }
            }
            match signals.received() {
                true => ControlFlow::Break(()),
                false => ControlFlow::Continue(()),
            }
        })
    })?;
    report.complete = cells.len() == total;
    report.cells = cells;
    print!("{}", table(&report.cells, &opts.lengths, &opts.depths));
    println!("key digits given back in place: {:.1}% (chance 10%)", 100.0 * digit_share(&report.cells));
    if let Some(path) = args.heat_map {
        write_png(&heat_map(&report.cells, &opts.lengths, &opts.depths).draw(), &path)?;
    }
    if let Some(path) = &args.json {
        write_report(path, &report)?;
    }
    if report.complete {
        return Ok(ExitCode::SUCCESS);
    }
    let kept_where = match &args.json {
        Some(path) => format!("{} holds them; run again with --resume to go on", path.display()),
        None => "give --json FILE to keep them".to_string(),
    };
    eprintln!("stopped on a signal after {} of {total} cells: {kept_where}", report.cells.len());
    Ok(ExitCode::from(PREEMPTED))
}

/// The cells of the report at `path` that a run described by `this` may keep: an error where the
/// file cannot be read, or holds another checkpoint's or context's cells.
fn kept_cells(path: &Path, this: &NeedleReport) -> Result<Vec<NeedleCell>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("--resume: {}: {e}", path.display()))?;
    let earlier: NeedleReport = serde_json::from_str(&text)
        .map_err(|e| format!("--resume: {} is not a report of nsa eval needle: {e}", path.display()))?;
    let same_checkpoint =
        match (Path::new(&earlier.checkpoint).canonicalize(), Path::new(&this.checkpoint).canonicalize()) {
            (Ok(a), Ok(b)) => a == b,
            _ => false,
        };
    if !same_checkpoint || earlier.context != this.context || earlier.runs_on != this.runs_on {
        return Err(format!(
            "--resume: {} holds cells of {} at a context of {} on {}, this run is {} at {} on {}: give another --json",
            path.display(),
            earlier.checkpoint,
            earlier.context,
            earlier.runs_on,
            this.checkpoint,
            this.context,
            this.runs_on
        ));
    }
    Ok(earlier.cells)
}

/// Writes `report` to `path` whole or not at all: a stop while writing leaves the last one.
fn write_report(path: &Path, report: &NeedleReport) -> Result<(), String> {
    let text = serde_json::to_string_pretty(report).expect("the report serialises");
    files::replace(path, &text).map_err(|e| format!("{}: {e}", path.display()))
}

/// 1k, 4k, 16k and 64k where they fit `seq_len` with the answer, and the longest that does (the
/// length the model trained at).
fn default_lengths(seq_len: usize) -> Vec<usize> {
    let longest = seq_len.saturating_sub(ANSWER_TOKENS);
    let mut lengths: Vec<usize> = [1, 4, 16, 64].map(|k| k * 1024).into_iter().filter(|&l| l < longest).collect();
    lengths.push(longest);
    lengths
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_lengths_end_at_the_longest_haystack_the_model_takes() {
        assert_eq!(default_lengths(16384), [1024, 4096, 16376]);
        assert_eq!(default_lengths(4096 + ANSWER_TOKENS), [1024, 4096]);
        assert_eq!(default_lengths(128), [120]);
    }
}
