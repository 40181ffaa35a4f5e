//! `cargo xtask bench needle`: the long-context recipe's benchmark in one invocation. The recipe
//! (the arguments after `--`, for `nsa train`) is trained with NSA and then with dense attention,
//! each run asked for keys by `nsa eval needle` with the same seed, and the two printed side by
//! side per length: the keys given back and the keys' digits given back in place.

use std::path::Path;
use std::process::ExitCode;

use serde_json::Value;

use crate::bench_train::read_json;
use crate::{nsa, NsaArgs};

/// What `nsa eval needle` asks each run (passed on as given; it checks them), and where the runs
/// start from.
pub struct NeedleAsk {
    pub lengths: Option<String>,
    pub context: Option<String>,
    pub trials: usize,
    /// An earlier `bench needle`'s `--out`: each run starts from its run of the same attention
    /// (`nsa train --init DIR/nsa`, `DIR/dense`), e.g. the 16k recipe's, to go on at 64k.
    pub init_from: Option<std::path::PathBuf>,
}

/// The two attentions compared, NSA first.
const ATTENTIONS: [&str; 2] = ["nsa", "dense"];

pub fn run(args: NsaArgs, ask: NeedleAsk, out: &Path) -> ExitCode {
    if let Err(e) = std::fs::create_dir_all(out) {
        eprintln!("error: {}: {e}", out.display());
        return ExitCode::FAILURE;
    }
    for attention in ATTENTIONS {
        let run_dir = out.join(attention).display().to_string();
        let train = train_args(&args.args, attention, &run_dir, ask.init_from.as_deref());
        let status = nsa("train", NsaArgs { args: train, ..args.clone() });
        if status != ExitCode::SUCCESS {
            return status;
        }
        let status = nsa("eval", NsaArgs { args: needle_args(&ask, &run_dir, out, attention), ..args.clone() });
        if status != ExitCode::SUCCESS {
            return status;
        }
    }
    let cells = ATTENTIONS.map(|a| read_cells(&out.join(format!("needle-{a}.json"))));
    match cells {
        [Ok(nsa), Ok(dense)] => {
            print!("{}", side_by_side(&nsa, &dense));
            ExitCode::SUCCESS
        }
        [Err(e), _] | [_, Err(e)] => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `nsa train`'s arguments for the recipe `recipe` with `attention` into `run_dir`, starting
/// from `init_from`'s run of the same attention where given. A `run_dir` that already holds
/// checkpoints (an earlier `bench needle` stopped, or finished) goes on with `--resume`: what was
/// trained is kept, a finished run ends at once, and another recipe is refused in one line.
fn train_args(recipe: &[String], attention: &str, run_dir: &str, init_from: Option<&Path>) -> Vec<String> {
    let mut args = recipe.to_vec();
    args.extend(["--attention", attention, "--out", run_dir].map(String::from));
    if let Some(dir) = init_from {
        args.extend(["--init".to_string(), dir.join(attention).display().to_string()]);
    }
    if Path::new(run_dir).join("checkpoints").is_dir() {
        args.push("--resume".to_string());
    }
    args
}

/// `nsa eval needle`'s arguments for the run in `run_dir`: its JSON and heat map under `out`. A
/// JSON of an eval stopped early (an earlier `bench needle` stopped there, after its run had
/// finished training) is gone on from with `--resume`: its cells are kept.
fn needle_args(ask: &NeedleAsk, run_dir: &str, out: &Path, attention: &str) -> Vec<String> {
    let file = |ext: &str| out.join(format!("needle-{attention}.{ext}")).display().to_string();
    let mut args = ["needle", "--checkpoint", run_dir, "--seed", "0", "--json", &file("json")]
        .into_iter()
        .map(String::from)
        .collect::<Vec<_>>();
    args.extend(["--heat-map".into(), file("png"), "--trials".into(), ask.trials.to_string()]);
    for (flag, value) in [("--lengths", &ask.lengths), ("--context", &ask.context)] {
        if let Some(value) = value {
            args.extend([flag.to_string(), value.clone()]);
        }
    }
    if read_json(Path::new(&file("json"))).is_ok_and(|report| report["complete"] == false) {
        args.push("--resume".to_string());
    }
    args
}

/// One (length, depth) of a run: the trials, the keys given back, their digits in place and the
/// digits the keys hold.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Cell {
    length: u64,
    trials: u64,
    correct: u64,
    digits: u64,
    key_digits: u64,
}

/// The cells of the report `nsa eval needle --json` wrote at `path`, which must have run them all.
fn read_cells(path: &Path) -> Result<Vec<Cell>, String> {
    let json = read_json(path)?;
    if json["complete"] != true {
        return Err(format!("{}: not the report of a needle eval that ran every cell", path.display()));
    }
    let cells = json["cells"].as_array().ok_or_else(|| format!("{}: no list of cells", path.display()))?;
    let field =
        |c: &Value, name: &str| c[name].as_u64().ok_or_else(|| format!("{}: a cell has no `{name}`", path.display()));
    cells
        .iter()
        .map(|c| {
            let (length, trials) = (field(c, "length")?, field(c, "trials")?);
            let no_keys = || format!("{}: a cell has no `keys`", path.display());
            let keys = c["keys"].as_array().ok_or_else(no_keys)?;
            let key_digits = keys.iter().map(|k| k.as_u64().map(|k| k.to_string().len() as u64)).sum::<Option<u64>>();
            let key_digits = key_digits.ok_or_else(no_keys)?;
            Ok(Cell { length, trials, correct: field(c, "correct")?, digits: field(c, "digits")?, key_digits })
        })
        .collect()
}

/// Per length (in the order NSA's cells give them): each run's share of keys given back and of
/// the keys' digits given back in place, over all depths.
fn side_by_side(nsa: &[Cell], dense: &[Cell]) -> String {
    let mut lengths: Vec<u64> = nsa.iter().map(|c| c.length).collect();
    lengths.dedup();
    let shares = |cells: &[Cell], length: u64| {
        let row = cells.iter().filter(|c| c.length == length);
        let (trials, correct, digits, key_digits) =
            row.fold((0, 0, 0, 0), |(t, k, d, n), c| (t + c.trials, k + c.correct, d + c.digits, n + c.key_digits));
        let of = |n: u64, d: u64| if d == 0 { f64::NAN } else { 100.0 * n as f64 / d as f64 };
        format!("{:>9.1}% {:>9.1}%", of(correct, trials), of(digits, key_digits))
    };
    let mut text =
        format!("{:>8} {:>10} {:>10} {:>10} {:>10}\n", "length", "NSA keys", "digits", "dense keys", "digits");
    for length in lengths {
        text += &format!("{length:>8} {} {}\n", shares(nsa, length), shares(dense, length));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(length: u64, correct: u64, digits: u64) -> Cell {
        Cell { length, trials: 4, correct, digits, key_digits: 20 }
    }

    #[test]
    fn each_length_gives_both_runs_keys_and_digits() {
        let nsa = [cell(1024, 4, 20), cell(1024, 2, 14), cell(4096, 0, 2)];
        let dense = [cell(1024, 1, 10), cell(1024, 0, 0), cell(4096, 0, 0)];
        let table = side_by_side(&nsa, &dense);
        let rows: Vec<Vec<&str>> = table.lines().map(|l| l.split_whitespace().collect()).collect();
        assert_eq!(rows[1], ["1024", "75.0%", "85.0%", "12.5%", "25.0%"]);
        assert_eq!(rows[2], ["4096", "0.0%", "10.0%", "0.0%", "0.0%"]);
        assert_eq!(rows.len(), 3);
    }

    #[test]
    fn a_cells_digits_are_counted_against_its_keys() {
        let path = std::env::temp_dir().join(format!("xtask-needle-cells-{}.json", std::process::id()));
        let cells = r#"[{"length": 1024, "depth": 0, "correct": 1, "trials": 2, "keys": [12345, 67890],
            "answers": ["12345", "6"], "digits": 6}]"#;
        let report = |complete: bool| format!(r#"{{"complete": {complete}, "cells": {cells}}}"#);
        std::fs::write(&path, report(false)).unwrap();
        let stopped = read_cells(&path);
        std::fs::write(&path, report(true)).unwrap();
        let cells = read_cells(&path);
        std::fs::remove_file(&path).unwrap();
        assert!(stopped.unwrap_err().contains("ran every cell"), "a stopped eval's cells are not a result");
        let cells = cells.unwrap();
        assert_eq!(cells, [Cell { length: 1024, trials: 2, correct: 1, digits: 6, key_digits: 10 }]);
        let rows = side_by_side(&cells, &cells);
        assert_eq!(
            rows.lines().nth(1).unwrap().split_whitespace().collect::<Vec<_>>(),
            ["1024", "50.0%", "60.0%", "50.0%", "60.0%"]
        );
    }

    #[test]
    fn eval_asks_with_the_seed_and_what_was_given() {
        let ask = NeedleAsk { lengths: Some("1k,4k".into()), context: None, trials: 4, init_from: None };
        let args = needle_args(&ask, "out/nsa", Path::new("out"), "nsa").join(" ");
        assert_eq!(
            args,
            "needle --checkpoint out/nsa --seed 0 --json out/needle-nsa.json --heat-map out/needle-nsa.png \
             --trials 4 --lengths 1k,4k"
        );
    }

    #[test]
    fn an_eval_stopped_early_goes_on() {
        let out = std::env::temp_dir().join(format!("xtask-needle-eval-{}", std::process::id()));
        std::fs::create_dir_all(&out).unwrap();
        let ask = NeedleAsk { lengths: None, context: None, trials: 4, init_from: None };
        let resumes = |complete: Option<bool>| {
            if let Some(complete) = complete {
                std::fs::write(out.join("needle-dense.json"), format!(r#"{{"complete": {complete}}}"#)).unwrap();
            }
            needle_args(&ask, "out/dense", &out, "dense").contains(&"--resume".to_string())
        };
        let seen = [resumes(None), resumes(Some(false)), resumes(Some(true))];
        std::fs::remove_dir_all(&out).unwrap();
        assert_eq!(seen, [false, true, false], "no report, a stopped one, a whole one");
    }

    #[test]
    fn each_run_starts_from_the_earlier_run_of_its_attention() {
        let recipe = ["--config".to_string(), "64k.toml".to_string()];
        let plain = train_args(&recipe, "dense", "out/dense", None).join(" ");
        assert_eq!(plain, "--config 64k.toml --attention dense --out out/dense");
        let init = train_args(&recipe, "dense", "out/dense", Some(Path::new("runs/16k"))).join(" ");
        assert_eq!(init, "--config 64k.toml --attention dense --out out/dense --init runs/16k/dense");
    }

    #[test]
    fn a_run_with_checkpoints_goes_on() {
        let out = std::env::temp_dir().join(format!("xtask-needle-{}", std::process::id()));
        let run = out.join("nsa").display().to_string();
        let recipe = ["--config".to_string(), "16k.toml".to_string()];
        assert!(!train_args(&recipe, "nsa", &run, None).contains(&"--resume".to_string()));
        std::fs::create_dir_all(out.join("nsa/checkpoints")).unwrap();
        let args = train_args(&recipe, "nsa", &run, None);
        std::fs::remove_dir_all(&out).unwrap();
        assert_eq!(args.last().map(String::as_str), Some("--resume"));
    }
}
