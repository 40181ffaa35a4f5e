//! Running out of device memory as one error.
//!
//! CubeCL reports an allocation the device cannot make by panicking on its device thread
//! (`BufferTooBig`, "can't allocate buffer of size: N"); it catches that panic and carries on,
//! and every later kernel that meets the missing buffer panics again: thousands of messages
//! before the next read fails. [`install`] keeps the size of the first failed allocation and
//! silences the panics that follow it, so the trainer can stop with one line
//! ([`super::Stop::OutOfMemory`]).

use std::sync::atomic::{AtomicU64, Ordering};

/// The size of the first allocation that failed, plus one (0: none failed).
static FAILED: AtomicU64 = AtomicU64::new(0);

/// Installs the panic hook. Other panics go to the hook installed before, until an allocation
/// has failed; from then on every panic is a consequence of it and is not printed.
pub fn install() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if let Some(size) = allocation_failure(message) {
            let _ = FAILED.compare_exchange(0, size.saturating_add(1), Ordering::SeqCst, Ordering::SeqCst);
            return;
        }
        if failed_allocation().is_none() {
            previous(info);
        }
    }));
}

/// The size in bytes of the first allocation that failed, if one did.
pub fn failed_allocation() -> Option<u64> {
    match FAILED.load(Ordering::SeqCst) {
        0 => None,
        n => Some(n - 1),
    }
}

/// The requested size when `message` is CubeCL's failed allocation (its `Display` or `Debug`
/// form; 0 when the message gives no size).
pub fn allocation_failure(message: &str) -> Option<u64> {
    if !(message.contains("BufferTooBig") || message.contains("can't allocate buffer")) {
        return None;
    }
    let size = message.split("size: ").nth(1).map(|rest| {
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        digits.parse().unwrap_or(0)
    });
    Some(size.unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cubecl_allocation_failures_are_recognised_with_their_size() {
        let debug =
            "called `Result::unwrap()` on an `Err` value: BufferTooBig { size: 4294967296, backtrace: <disabled> }";
        assert_eq!(allocation_failure(debug), Some(4294967296));
        assert_eq!(allocation_failure("can't allocate buffer of size: 1024\n"), Some(1024));
        assert_eq!(allocation_failure("BufferTooBig"), Some(0));
        assert_eq!(allocation_failure("index out of bounds: the len is 3 but the index is 7"), None);
        assert_eq!(allocation_failure("Resource to exist."), None);
    }
}
