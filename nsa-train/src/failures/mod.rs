//! How runs fail and say so: panics caught at the few places a device failure surfaces
//! ([`catch`]), their text ([`failure_text`]), running out of device memory as one error
//! ([`oom`]), a device failure as a [`Stop`] ([`device_failure`]), a binary's whole command
//! ([`catch_command`]), and how a run ends ([`stop`]).

pub mod oom;
pub mod stop;

use std::path::PathBuf;

pub use oom::{failed_allocation, install};
pub use stop::{Finish, Stop};

/// A caught panic's payload.
pub type Panic = Box<dyn std::any::Any + Send>;

/// Bytes in a GiB.
pub const GIB: f64 = (1u64 << 30) as f64;

/// `bytes` in GiB.
pub fn gib(bytes: u64) -> f64 {
    bytes as f64 / GIB
}

/// Runs `f`, turning a panic inside it into an error. Device failures (CubeCL's, Burn's) panic
/// on the thread that meets them; callers catch where they can still say which step failed.
pub fn catch<T>(f: impl FnOnce() -> T) -> Result<T, Panic> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
}

/// A panic's message, when it carries one.
pub fn panic_message(panic: &Panic) -> Option<String> {
    panic.downcast_ref::<String>().cloned().or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
}

/// A panic as an error line: out of memory when an allocation failed (the panic is then only a
/// consequence of it), else its message.
pub fn failure_text(panic: &Panic) -> String {
    match failed_allocation() {
        Some(bytes) => out_of_memory(bytes),
        None => panic_message(panic).unwrap_or_else(|| "panicked".into()),
    }
}

/// The line for a failed allocation of `bytes` (0: size unknown).
pub fn out_of_memory(bytes: u64) -> String {
    match bytes {
        0 => "out of device memory".into(),
        b => format!("out of device memory: an allocation of {:.2} GiB failed", gib(b)),
    }
}

/// What a device failure at `step` means for the run: out of memory when an allocation failed,
/// with what to lower, else the device's error as one line.
pub fn device_failure(
    step: usize,
    batch: usize,
    seq_len: usize,
    last_good: impl FnOnce() -> Option<PathBuf>,
    error: impl std::fmt::Debug,
) -> Stop {
    match failed_allocation() {
        Some(requested) => Stop::OutOfMemory {
            step,
            batch,
            seq_len,
            requested: (requested > 0).then_some(requested),
            last_good: last_good(),
        },
        None => Stop::Error(format!("device error at step {step}: {error:?}")),
    }
}

/// Runs a binary's command so that a panic outside the trainer's own catches still ends in one
/// line: `out of memory; {hint}` when an allocation failed, else that `what` panicked (its
/// message was printed by the panic hook).
pub fn catch_command<T>(run: impl FnOnce() -> Result<T, String>, hint: &str, what: &str) -> Result<T, String> {
    catch(run).unwrap_or_else(|_| {
        Err(match failed_allocation() {
            Some(bytes) => format!("{}; {hint}", out_of_memory(bytes)),
            None => format!("{what} panicked (see above)"),
        })
    })
}
