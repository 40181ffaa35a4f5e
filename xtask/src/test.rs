//! `cargo xtask test`: every test of the workspace, as CI runs them.
//!
//! A process compiles its WGPU kernels one at a time, on one core (CubeCL compiles on the
//! device's thread), and on lavapipe the kernels of a new head shape cost minutes, so one `cargo
//! test` leaves a core idle for most of a cold run. The whole suite is built first; then the
//! [`SIDE_TESTS`] run as processes of their own beside `cargo test` over the rest. (A second
//! `cargo test` would wait for the first: cargo holds the target directory while its tests run.)

use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, Stdio};

use nsa_backend_kind::BackendKind;

use crate::{cargo, exit_code, features, status, vulkan};

/// The tests that run beside `cargo test`, each in a process of its own started from its
/// package's `suite` binary: `(package, test-name filters)`. The cross-crate suite's compressed,
/// window and selection kernels' checks (the compressed branch runs on the window kernels), whose
/// key-side backward kernels are its longest compiles: one process each, so their compiles
/// share both cores with `cargo test`'s instead of queueing on one device thread.
const SIDE_TESTS: [(&str, &[&str]); 3] = [
    ("nsa-tests", &["compressed::compressed_kernels_match_the_reference"]),
    ("nsa-tests", &["kernels::wgpu_window_kernels_match_float64_loops"]),
    ("nsa-tests", &["kernels::wgpu_selected_kernels_match_float64_loops"]),
];

/// Runs the tests; with `args` (a filter, `cargo test`'s flags), one `cargo test` with them.
pub fn run(args: Vec<String>) -> ExitCode {
    let features: Vec<String> = features(BackendKind::Auto).iter().map(|f| format!("nsa-train/{f}")).collect();
    // The features of `cargo xtask train` on this machine, so the dependencies that command
    // built are reused and only the tests are compiled here.
    let cargo_test = |extra: &[&str]| {
        let mut cmd = Command::new(cargo());
        cmd.args(["test", "--workspace", "--features", &features.join(",")]).args(extra);
        vulkan::test_environment(&mut cmd);
        cmd
    };
    if !args.is_empty() {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        return status(&mut cargo_test(&args)).err().unwrap_or(ExitCode::SUCCESS);
    }
    let suites = match built_suites(cargo_test(&["--no-run", "--message-format=json-render-diagnostics"])) {
        Ok(suites) => suites,
        Err(code) => return code,
    };
    let mut sides = Vec::new();
    for (suite, (_, tests)) in suites.into_iter().zip(SIDE_TESTS) {
        match spawn_side(suite, tests) {
            Ok(child) => sides.push(child),
            Err(code) => return code,
        }
    }
    let skip = SIDE_TESTS.iter().flat_map(|(_, tests)| tests.iter()).flat_map(|test| ["--skip", test]);
    let rest = status(&mut cargo_test(&["--"].into_iter().chain(skip).collect::<Vec<_>>()));
    let sides = sides.into_iter().map(|mut side| side.wait().map_err(|_| ExitCode::FAILURE).and_then(exit_code));
    sides.fold(rest, Result::and).err().unwrap_or(ExitCode::SUCCESS)
}

/// A package's `suite` test binary and its package directory (`cargo test` runs a test there),
/// from the build's JSON messages.
struct Suite {
    binary: PathBuf,
    dir: PathBuf,
}

/// Builds every test (`build`: `cargo test --no-run` with JSON messages) and finds the suite of
/// each package of [`SIDE_TESTS`], in its order.
fn built_suites(mut build: Command) -> Result<Vec<Suite>, ExitCode> {
    eprintln!("+ {build:?}");
    let out = build.stderr(Stdio::inherit()).output().map_err(|e| {
        eprintln!("error: cannot run cargo: {e}");
        ExitCode::FAILURE
    })?;
    exit_code(out.status)?;
    let messages = String::from_utf8_lossy(&out.stdout);
    let built: Vec<(String, Suite)> = messages
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter_map(suite_of)
        .collect();
    SIDE_TESTS
        .iter()
        .map(|(package, _)| {
            let found = built.iter().position(|(name, _)| name == package);
            found.map(|i| Suite { binary: built[i].1.binary.clone(), dir: built[i].1.dir.clone() }).ok_or_else(|| {
                eprintln!("error: cargo built no `suite` test of the {package} package");
                ExitCode::FAILURE
            })
        })
        .collect()
}

/// The package and the suite, when `message` announces a `suite` test binary.
fn suite_of(message: serde_json::Value) -> Option<(String, Suite)> {
    let manifest = PathBuf::from(message["manifest_path"].as_str()?);
    let is_suite = message["reason"] == "compiler-artifact"
        && message["target"]["name"] == "suite"
        && message["profile"]["test"] == true;
    is_suite.then_some(())?;
    let package = package_name(message["package_id"].as_str()?)?;
    let suite = Suite { binary: PathBuf::from(message["executable"].as_str()?), dir: manifest.parent()?.to_path_buf() };
    Some((package, suite))
}

/// The package name in a cargo package id: `path+file:///…/tests#nsa-tests@0.1.0`, or
/// `path+file:///…/nsa-train#0.1.0` where the directory is named as the package.
fn package_name(id: &str) -> Option<String> {
    let (url, fragment) = id.split_once('#')?;
    let name = match fragment.split_once('@') {
        Some((name, _)) => name,
        None => url.rsplit('/').next()?,
    };
    Some(name.to_string())
}

/// Starts `tests` of `suite`, printing as they run.
fn spawn_side(suite: Suite, tests: &[&str]) -> Result<Child, ExitCode> {
    let mut side = Command::new(&suite.binary);
    side.args(tests).arg("--exact").current_dir(&suite.dir);
    vulkan::test_environment(&mut side);
    eprintln!("+ {side:?} (beside the next)");
    side.spawn().map_err(|e| {
        eprintln!("error: cannot run {}: {e}", suite.binary.display());
        ExitCode::FAILURE
    })
}

#[cfg(test)]
mod tests {
    use super::package_name;

    #[test]
    fn package_names_come_from_either_form_of_id() {
        assert_eq!(package_name("path+file:///w/tests#nsa-tests@0.1.0").as_deref(), Some("nsa-tests"));
        assert_eq!(package_name("path+file:///w/nsa-train#0.1.0").as_deref(), Some("nsa-train"));
    }
}
