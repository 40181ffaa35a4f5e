//! `cargo xtask bench decode --kernels`: the device time of each kernel of a decode step (ours
//! through Nsight Compute's `ncu`, the anchor's through torch.profiler), so that the attention
//! part of a step compares alone: ours is `decode_attention`'s four kernels per layer, the
//! anchor's its SDPA kernels per layer. Wall-clock step times mix in the host, which queues a
//! small step slower than the device runs it.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, ExitCode};

use serde_json::Value;

use crate::bench_decode::flag_value;
use crate::bench_train::run_anchor_script;
use crate::{cargo_run_with, NsaArgs};

/// The kernels of `decode_attention` (`nsa_kernels::kernel::decode`).
const ATTENTION: [&str; 4] = ["decode_tiles", "decode_select", "decode_selected_tiles", "decode_merge"];

/// Profiles a few decode steps of the one context and batch in `args` under `ncu` (on the PATH),
/// writes `decode-kernels.csv` under `out`, prints each kernel's mean and the attention's per
/// layer, and with `anchor` the anchor's SDPA per layer beside it.
pub fn run(args: NsaArgs, anchor: bool, out: &Path) -> ExitCode {
    match profile(args, anchor, out) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn profile(mut args: NsaArgs, anchor: bool, out: &Path) -> Result<(), String> {
    let (context, batch) = (flag_value(&args.args, "--contexts"), flag_value(&args.args, "--batches"));
    let (Some(context), Some(batch)) = (context, batch) else {
        return Err("--kernels profiles one configuration: give one --contexts and one --batches after --".into());
    };
    if context.contains(',') || batch.contains(',') {
        return Err("--kernels profiles one configuration: one --contexts and one --batches".into());
    }
    std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let csv = out.join("decode-kernels.csv");
    // Two warm-up steps and two profiled ones: each kernel is replayed by `ncu`, so a few
    // steps suffice and a long run would take minutes.
    args.args = without_flags(&args.args, &["--tokens", "--warmup"]);
    args.args.extend(["--tokens", "2", "--warmup", "2"].map(String::from));
    let runner = format!(
        "ncu --csv --log-file {} --metrics gpu__time_duration.sum --cache-control none --clock-control none -k regex:decode_",
        csv.display()
    );
    let status = cargo_run_with(
        "bench-decode",
        NsaArgs { release: true, ..args },
        ("CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER", &runner),
    );
    if status != ExitCode::SUCCESS {
        return Err("the profiled run failed (is `ncu` on the PATH?)".into());
    }
    let text = std::fs::read_to_string(&csv).map_err(|e| format!("{}: {e}", csv.display()))?;
    let kernels = kernel_means(&text);
    let layers = kernels.get("decode_tiles").map(|k| k.launches).ok_or("no decode kernel was profiled")?;
    println!("kernel                  launches  mean us");
    for (name, k) in &kernels {
        println!("{name:<22}  {:>8}  {:>7.1}", k.launches, k.mean_us);
    }
    let attention: f64 = ATTENTION.iter().filter_map(|name| kernels.get(*name)).map(|k| k.mean_us).sum();
    let step: f64 = kernels.values().map(|k| k.mean_us * k.launches as f64).sum::<f64>() / layers as f64;
    println!("ours per layer: attention {attention:.1} us, every profiled kernel {step:.1} us");
    if anchor {
        let mut cmd = Command::new("python3");
        cmd.args(["bench/decode_anchor.py", "--contexts", &context, "--batches", &batch, "--tokens", "8", "--profile"]);
        let line = run_anchor_script(&mut cmd)?;
        let theirs: Value = serde_json::from_str(line.trim()).map_err(|e| format!("the anchor's line: {e}"))?;
        let sdpa = theirs["attention_us_per_layer"].as_f64().ok_or("the anchor reported no attention time")?;
        println!("anchor per layer: attention (SDPA) {sdpa:.1} us; ours / anchor: {:.2}x faster", sdpa / attention);
    }
    Ok(())
}

/// A kernel's profiled launches and their mean device time.
struct KernelTime {
    launches: usize,
    mean_us: f64,
}

/// `ncu --csv` rows by kernel, the name cut before its type suffix (`decode_tiles_f_bf16_..`).
fn kernel_means(csv: &str) -> BTreeMap<String, KernelTime> {
    let mut rows = csv.lines().filter(|l| l.starts_with('"')).map(fields);
    let Some(header) = rows.next() else { return BTreeMap::new() };
    let column = |name: &str| header.iter().position(|h| h == name);
    let (Some(name), Some(value), Some(unit)) = (column("Kernel Name"), column("Metric Value"), column("Metric Unit"))
    else {
        return BTreeMap::new();
    };
    let mut sums: BTreeMap<String, (usize, f64)> = BTreeMap::new();
    for row in rows {
        let (Some(kernel), Some(v), Some(u)) = (row.get(name), row.get(value), row.get(unit)) else { continue };
        let Ok(v) = v.replace(',', "").parse::<f64>() else { continue };
        let us = match u.as_str() {
            "nsecond" | "ns" => v / 1e3,
            "msecond" | "ms" => v * 1e3,
            _ => v,
        };
        let entry = sums.entry(stem(kernel).to_string()).or_default();
        entry.0 += 1;
        entry.1 += us;
    }
    sums.into_iter().map(|(k, (n, total))| (k, KernelTime { launches: n, mean_us: total / n as f64 })).collect()
}

/// A CubeCL kernel's name without its generic suffix (`_f_..`, `_i_..`) or argument list.
fn stem(kernel: &str) -> &str {
    let name = kernel.split('(').next().unwrap_or(kernel);
    [name.find("_f_"), name.find("_i_")].into_iter().flatten().min().map_or(name, |at| &name[..at])
}

/// One CSV line's quoted fields.
fn fields(line: &str) -> Vec<String> {
    line.trim().trim_matches('"').split("\",\"").map(String::from).collect()
}

/// `args` without the given flags and their values (`--flag V` or `--flag=V`).
fn without_flags(args: &[String], flags: &[&str]) -> Vec<String> {
    let mut kept = Vec::new();
    let mut skip = false;
    for a in args {
        if std::mem::take(&mut skip) {
            continue;
        }
        match flags.iter().find(|f| a.strip_prefix(**f).is_some_and(|rest| rest.is_empty() || rest.starts_with('='))) {
            Some(_) => skip = !a.contains('='),
            None => kept.push(a.clone()),
        }
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::{kernel_means, stem, without_flags};

    #[test]
    fn stems_drop_the_type_suffix() {
        assert_eq!(stem("decode_tiles_f_bf16_i_i32_n_8"), "decode_tiles");
        assert_eq!(stem("decode_select_i_i32"), "decode_select");
        assert_eq!(stem("decode_selected_tiles_f_bf16_i_i32_n_8(int, float)"), "decode_selected_tiles");
    }

    #[test]
    fn means_per_kernel_from_ncu_csv() {
        let csv = "==PROF== noise\n\"ID\",\"Kernel Name\",\"Metric Name\",\"Metric Unit\",\"Metric Value\"\n\
                   \"0\",\"decode_tiles_f_bf16\",\"gpu__time_duration.sum\",\"nsecond\",\"1,000\"\n\
                   \"1\",\"decode_tiles_f_bf16\",\"gpu__time_duration.sum\",\"usecond\",\"3\"\n";
        let means = kernel_means(csv);
        assert_eq!(means["decode_tiles"].launches, 2);
        assert!((means["decode_tiles"].mean_us - 2.0).abs() < 1e-9);
    }

    #[test]
    fn flags_and_their_values_are_dropped() {
        let args: Vec<String> = ["--tokens", "9", "--contexts", "2048", "--warmup=3"].map(String::from).into();
        assert_eq!(without_flags(&args, &["--tokens", "--warmup"]), ["--contexts", "2048"]);
    }
}
