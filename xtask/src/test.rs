//! `cargo xtask test`: every test of the workspace, as CI runs them.
//!
//! A process compiles its WGPU kernels one at a time, on one core, and on lavapipe the kernels of
//! a new head shape cost minutes, so one `cargo test` leaves a core idle for most of a cold run.
//! The whole suite is built first; then the cross-crate suite's [`SIDE_TESTS`] run as a second
//! process beside `cargo test` over the rest. (A second `cargo test` would wait for the first:
//! cargo holds the target directory while its tests run.)

use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, Stdio};

use nsa_backend_kind::BackendKind;

use crate::{cargo, exit_code, features, status, vulkan};

/// The tests of the cross-crate suite that run in the second process (test-name filters): the
/// window and selection kernels' checks (the compressed branch runs on the window kernels),
/// whose key-side backward kernels are the suite's longest compiles, about half of its
/// compile time. Burn's matrix products and everything else compile in the first.
const SIDE_TESTS: [&str; 3] = [
    "compressed::compressed_kernels_match_the_reference",
    "kernels::wgpu_window_kernels_match_float64_loops",
    "kernels::wgpu_selected_kernels_match_float64_loops",
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
    let suite = match built_suite(cargo_test(&["--no-run", "--message-format=json-render-diagnostics"])) {
        Ok(suite) => suite,
        Err(code) => return code,
    };
    let mut side = match spawn_side(suite) {
        Ok(child) => child,
        Err(code) => return code,
    };
    let skip = SIDE_TESTS.iter().flat_map(|test| ["--skip", test]);
    let rest = status(&mut cargo_test(&["--"].into_iter().chain(skip).collect::<Vec<_>>()));
    let side = side.wait().map_err(|_| ExitCode::FAILURE).and_then(exit_code);
    rest.and(side).err().unwrap_or(ExitCode::SUCCESS)
}

/// The cross-crate suite's binary and its package directory (`cargo test` runs a test there),
/// from the build's JSON messages.
struct Suite {
    binary: PathBuf,
    dir: PathBuf,
}

/// Builds every test (`build`: `cargo test --no-run` with JSON messages) and finds the suite.
fn built_suite(mut build: Command) -> Result<Suite, ExitCode> {
    eprintln!("+ {build:?}");
    let out = build.stderr(Stdio::inherit()).output().map_err(|e| {
        eprintln!("error: cannot run cargo: {e}");
        ExitCode::FAILURE
    })?;
    exit_code(out.status)?;
    let messages = String::from_utf8_lossy(&out.stdout);
    messages
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .find_map(suite_of)
        .ok_or_else(|| {
            eprintln!("error: cargo built no `suite` test of the nsa-tests package");
            ExitCode::FAILURE
        })
}

/// The suite, when `message` announces its test binary.
fn suite_of(message: serde_json::Value) -> Option<Suite> {
    let manifest = PathBuf::from(message["manifest_path"].as_str()?);
    let is_suite = message["reason"] == "compiler-artifact"
        && message["target"]["name"] == "suite"
        && message["profile"]["test"] == true
        && message["package_id"].as_str()?.contains("nsa-tests");
    is_suite.then_some(())?;
    Some(Suite { binary: PathBuf::from(message["executable"].as_str()?), dir: manifest.parent()?.to_path_buf() })
}

/// Starts the suite's [`SIDE_TESTS`], printing as they run.
fn spawn_side(suite: Suite) -> Result<Child, ExitCode> {
    let mut side = Command::new(&suite.binary);
    side.args(SIDE_TESTS).arg("--exact").current_dir(&suite.dir);
    vulkan::test_environment(&mut side);
    eprintln!("+ {side:?} (beside the next)");
    side.spawn().map_err(|e| {
        eprintln!("error: cannot run {}: {e}", suite.binary.display());
        ExitCode::FAILURE
    })
}
