//! A fingerprint of what the compiled GPU kernels are built from. CubeCL's persistent
//! compiled-kernel cache keys a kernel by its type and compile-time arguments only, not by its
//! source, so a cache filled by an older build would keep serving that build's kernels after
//! the code changed. Keeping each fingerprint's kernels apart rules that out.

/// FNV-1a over the kernels' sources, their launch code and the dependency lock (Burn's and
/// CubeCL's own kernels change with their versions).
/// Computed on first use: hashing the sources in a `const` runs past rustc's const-eval budget.
pub static KERNEL_FINGERPRINT: std::sync::LazyLock<u64> = std::sync::LazyLock::new(|| fnv1a_all(SOURCES));

/// What the kernels are built from: every file of `kernel/` (a test holds the list to the
/// directory), the launch code and tilings, and the lock file.
const SOURCES: &[(&str, &str)] = &[
    ("kernel/mod.rs", include_str!("kernel/mod.rs")),
    ("kernel/backward.rs", include_str!("kernel/backward.rs")),
    ("kernel/compressed.rs", include_str!("kernel/compressed.rs")),
    ("kernel/compressed_rows.rs", include_str!("kernel/compressed_rows.rs")),
    ("kernel/flash_dq.rs", include_str!("kernel/flash_dq.rs")),
    ("kernel/flash_forward.rs", include_str!("kernel/flash_forward.rs")),
    ("kernel/flash_key.rs", include_str!("kernel/flash_key.rs")),
    ("kernel/flash_select.rs", include_str!("kernel/flash_select.rs")),
    ("kernel/forward.rs", include_str!("kernel/forward.rs")),
    ("kernel/fragments.rs", include_str!("kernel/fragments.rs")),
    ("kernel/inverse.rs", include_str!("kernel/inverse.rs")),
    ("kernel/key.rs", include_str!("kernel/key.rs")),
    ("kernel/mix.rs", include_str!("kernel/mix.rs")),
    ("kernel/mma_backward.rs", include_str!("kernel/mma_backward.rs")),
    ("kernel/mma_dq.rs", include_str!("kernel/mma_dq.rs")),
    ("kernel/mma_forward.rs", include_str!("kernel/mma_forward.rs")),
    ("kernel/mma_select.rs", include_str!("kernel/mma_select.rs")),
    ("kernel/query.rs", include_str!("kernel/query.rs")),
    ("kernel/rms_norm.rs", include_str!("kernel/rms_norm.rs")),
    ("kernel/rows.rs", include_str!("kernel/rows.rs")),
    ("kernel/top_n.rs", include_str!("kernel/top_n.rs")),
    ("kernel/vectors.rs", include_str!("kernel/vectors.rs")),
    ("kernel/walk.rs", include_str!("kernel/walk.rs")),
    ("compressed.rs", include_str!("compressed.rs")),
    ("cube.rs", include_str!("cube.rs")),
    ("inverted.rs", include_str!("inverted.rs")),
    ("mix/cube.rs", include_str!("mix/cube.rs")),
    ("norm/cube.rs", include_str!("norm/cube.rs")),
    ("optim/kernel.rs", include_str!("optim/kernel.rs")),
    ("optim/cube.rs", include_str!("optim/cube.rs")),
    ("tiling.rs", include_str!("tiling.rs")),
    ("top_n.rs", include_str!("top_n.rs")),
    ("Cargo.lock", include_str!("../../Cargo.lock")),
];

/// [`fnv1a`] over the sources' bytes one after another.
const fn fnv1a_all(sources: &[(&str, &str)]) -> u64 {
    let mut hash: u64 = FNV_OFFSET;
    let mut s = 0;
    while s < sources.len() {
        hash = fnv1a_from(hash, sources[s].1.as_bytes());
        s += 1;
    }
    hash
}

/// 64-bit FNV-1a: small, `const`, and stable across Rust versions (unlike `std`'s hashers).
#[cfg(test)]
const fn fnv1a(bytes: &[u8]) -> u64 {
    fnv1a_from(FNV_OFFSET, bytes)
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// FNV-1a continued from `hash` over `bytes`.
const fn fnv1a_from(mut hash: u64, bytes: &[u8]) -> u64 {
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
        // Hashing sources one after another is hashing them joined.
        assert_eq!(fnv1a_all(&[("a", "ker"), ("b", "nel")]), fnv1a(b"kernel"));
    }

    #[test]
    fn every_kernel_file_is_in_the_fingerprint() {
        // A kernel file left out would let a cache filled by an older build serve its kernels.
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/kernel");
        let listed: Vec<&str> = SOURCES.iter().map(|(name, _)| *name).collect();
        for entry in std::fs::read_dir(&dir).unwrap() {
            let name = format!("kernel/{}", entry.unwrap().file_name().to_string_lossy());
            if name.ends_with(".rs") {
                assert!(listed.contains(&name.as_str()), "{name} is missing from the kernel fingerprint");
            }
        }
    }
}
