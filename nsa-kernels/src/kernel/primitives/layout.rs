//! Constants of the tensor-core kernels' layout.

/// `max` usable in comptime expressions.
pub const fn max_usize(a: usize, b: usize) -> usize {
    if a > b {
        a
    } else {
        b
    }
}

/// Elements per vector of the staged inputs: 16 bytes of a 16-bit type. The launch passes it
/// as the inputs' vector size; `storage_stride` rows are whole vectors.
pub const VECTOR: usize = 8;

/// Scores at or below this are masked keys.
pub const MASKED: f32 = -1.0e29;
