//! A fingerprint of what the compiled GPU kernels are built from. CubeCL's persistent
//! compiled-kernel cache keys a kernel by its type and compile-time arguments only, not by its
//! source, so a cache filled by an older build would keep serving that build's kernels after
//! the code changed. Keeping each fingerprint's kernels apart rules that out.

/// FNV-1a over the kernels' sources, their launch code and the dependency lock (Burn's and
/// CubeCL's own kernels change with their versions).
pub const KERNEL_FINGERPRINT: u64 = fnv1a(
    concat!(
        include_str!("kernel/mod.rs"),
        include_str!("kernel/forward.rs"),
        include_str!("kernel/backward.rs"),
        include_str!("kernel/inverse.rs"),
        include_str!("kernel/key.rs"),
        include_str!("kernel/mma_backward.rs"),
        include_str!("kernel/mma_dq.rs"),
        include_str!("kernel/mma_forward.rs"),
        include_str!("kernel/mma_select.rs"),
        include_str!("kernel/query.rs"),
        include_str!("kernel/rows.rs"),
        include_str!("cube.rs"),
        include_str!("tiling.rs"),
        include_str!("../../Cargo.lock"),
    )
    .as_bytes(),
);

/// 64-bit FNV-1a: small, `const`, and stable across Rust versions (unlike `std`'s hashers).
pub const fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut i = 0;
    while i < bytes.len() {
        hash ^= bytes[i] as u64;
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        i += 1;
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_matches_the_reference_values_and_sees_one_byte() {
        // Published FNV-1a 64 test vectors.
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_ne!(fnv1a(b"kernel v1"), fnv1a(b"kernel v2"));
    }
}
