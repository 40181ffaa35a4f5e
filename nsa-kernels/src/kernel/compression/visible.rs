//! Which compressed blocks a query sees.

use cubecl::prelude::*;

/// Compressed blocks complete at position `t` (`i * stride + length - 1 <= t`), at most `n`.
#[cube]
pub fn visible_blocks(t: usize, n: usize, length: usize, stride: usize) -> usize {
    let mut count = 0usize;
    if t + 1 >= length {
        count = min((t + 1 - length) / stride + 1, n);
    }
    count
}
