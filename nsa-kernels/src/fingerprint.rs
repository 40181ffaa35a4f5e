//! A fingerprint of what the compiled GPU kernels are built from. CubeCL's persistent
//! compiled-kernel cache keys a kernel by its type and compile-time arguments only, not by its
//! source, so a cache filled by an older build would keep serving that build's kernels after
//! the code changed. Keeping each fingerprint's kernels apart rules that out.

/// FNV-1a over the kernels' sources, their launch code and the dependency lock (Burn's and
/// CubeCL's own kernels change with their versions).
/// Computed on first use: hashing the sources in a `const` runs past rustc's const-eval budget.
pub static KERNEL_FINGERPRINT: std::sync::LazyLock<u64> = std::sync::LazyLock::new(|| fnv1a_all(SOURCES));

/// What the kernels are built from: every file of `kernel/` and every op's `kernel.rs` (a test
/// holds the list to the tree), the launch code and tilings, and the lock file.
const SOURCES: &[(&str, &str)] = &[
    ("kernel/compression/interleave.rs", include_str!("kernel/compression/interleave.rs")),
    ("kernel/compression/mod.rs", include_str!("kernel/compression/mod.rs")),
    ("kernel/compression/visible.rs", include_str!("kernel/compression/visible.rs")),
    ("kernel/decode/linear.rs", include_str!("kernel/decode/linear.rs")),
    ("kernel/decode/merge.rs", include_str!("kernel/decode/merge.rs")),
    ("kernel/decode/mod.rs", include_str!("kernel/decode/mod.rs")),
    ("kernel/decode/select.rs", include_str!("kernel/decode/select.rs")),
    ("kernel/decode/states.rs", include_str!("kernel/decode/states.rs")),
    ("kernel/decode/tile.rs", include_str!("kernel/decode/tile.rs")),
    ("kernel/decode/tiles.rs", include_str!("kernel/decode/tiles.rs")),
    ("kernel/decode/top_n.rs", include_str!("kernel/decode/top_n.rs")),
    ("kernel/decode/write.rs", include_str!("kernel/decode/write.rs")),
    ("kernel/key_gradients/chunk.rs", include_str!("kernel/key_gradients/chunk.rs")),
    ("kernel/key_gradients/mod.rs", include_str!("kernel/key_gradients/mod.rs")),
    ("mix/kernel.rs", include_str!("mix/kernel.rs")),
    ("kernel/mod.rs", include_str!("kernel/mod.rs")),
    ("kernel/portable/backward.rs", include_str!("kernel/portable/backward.rs")),
    ("kernel/portable/forward.rs", include_str!("kernel/portable/forward.rs")),
    ("kernel/portable/mod.rs", include_str!("kernel/portable/mod.rs")),
    ("kernel/primitives/atomic_rows.rs", include_str!("kernel/primitives/atomic_rows.rs")),
    ("kernel/primitives/chunk_copies.rs", include_str!("kernel/primitives/chunk_copies.rs")),
    ("kernel/primitives/fragments.rs", include_str!("kernel/primitives/fragments.rs")),
    ("kernel/primitives/key_cube.rs", include_str!("kernel/primitives/key_cube.rs")),
    ("kernel/primitives/layout.rs", include_str!("kernel/primitives/layout.rs")),
    ("kernel/primitives/mod.rs", include_str!("kernel/primitives/mod.rs")),
    ("kernel/primitives/query_cube.rs", include_str!("kernel/primitives/query_cube.rs")),
    ("kernel/primitives/rows.rs", include_str!("kernel/primitives/rows.rs")),
    ("kernel/primitives/softmax.rs", include_str!("kernel/primitives/softmax.rs")),
    ("kernel/primitives/staging.rs", include_str!("kernel/primitives/staging.rs")),
    ("kernel/primitives/vectors.rs", include_str!("kernel/primitives/vectors.rs")),
    ("kernel/primitives/walk.rs", include_str!("kernel/primitives/walk.rs")),
    ("norm/kernel.rs", include_str!("norm/kernel.rs")),
    ("kernel/row_delta.rs", include_str!("kernel/row_delta.rs")),
    ("kernel/selection/block_scores.rs", include_str!("kernel/selection/block_scores.rs")),
    ("kernel/selection/dq.rs", include_str!("kernel/selection/dq.rs")),
    ("kernel/selection/index.rs", include_str!("kernel/selection/index.rs")),
    ("kernel/selection/merge.rs", include_str!("kernel/selection/merge.rs")),
    ("kernel/selection/mod.rs", include_str!("kernel/selection/mod.rs")),
    ("kernel/selection/partials.rs", include_str!("kernel/selection/partials.rs")),
    ("kernel/selection/plane_top_n.rs", include_str!("kernel/selection/plane_top_n.rs")),
    ("kernel/selection/probabilities.rs", include_str!("kernel/selection/probabilities.rs")),
    ("kernel/selection/segments.rs", include_str!("kernel/selection/segments.rs")),
    ("kernel/selection/selection_cube.rs", include_str!("kernel/selection/selection_cube.rs")),
    ("kernel/selection/top_n.rs", include_str!("kernel/selection/top_n.rs")),
    ("kernel/selection/top_n_mma.rs", include_str!("kernel/selection/top_n_mma.rs")),
    ("kernel/window/dq.rs", include_str!("kernel/window/dq.rs")),
    ("kernel/window/forward.rs", include_str!("kernel/window/forward.rs")),
    ("kernel/window/mod.rs", include_str!("kernel/window/mod.rs")),
    ("sparse/keys.rs", include_str!("sparse/keys.rs")),
    ("sparse/plan.rs", include_str!("sparse/plan.rs")),
    ("sparse/launch/mod.rs", include_str!("sparse/launch/mod.rs")),
    ("sparse/launch/forward.rs", include_str!("sparse/launch/forward.rs")),
    ("sparse/launch/backward.rs", include_str!("sparse/launch/backward.rs")),
    ("sparse/compressed/mod.rs", include_str!("sparse/compressed/mod.rs")),
    ("sparse/compressed/interleaved.rs", include_str!("sparse/compressed/interleaved.rs")),
    ("sparse/cube.rs", include_str!("sparse/cube.rs")),
    ("sparse/launch/index.rs", include_str!("sparse/launch/index.rs")),
    ("mix/cube.rs", include_str!("mix/cube.rs")),
    ("decode/cube.rs", include_str!("decode/cube.rs")),
    ("decode/linear_launch.rs", include_str!("decode/linear_launch.rs")),
    ("decode/write.rs", include_str!("decode/write.rs")),
    ("norm/cube.rs", include_str!("norm/cube.rs")),
    ("optim/kernel.rs", include_str!("optim/kernel.rs")),
    ("optim/cube.rs", include_str!("optim/cube.rs")),
    ("sparse/tiling/mod.rs", include_str!("sparse/tiling/mod.rs")),
    ("sparse/tiling/selection.rs", include_str!("sparse/tiling/selection.rs")),
    ("tile_sizes.rs", include_str!("tile_sizes.rs")),
    ("sparse/top_n.rs", include_str!("sparse/top_n.rs")),
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
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let listed: Vec<&str> = SOURCES.iter().map(|(name, _)| *name).collect();
        let mut dirs = vec![src.clone()];
        let mut seen = 0;
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                let name = path.strip_prefix(&src).unwrap().to_string_lossy().replace('\\', "/");
                let kernel = name.starts_with("kernel/") || name.ends_with("/kernel.rs");
                if path.is_dir() {
                    dirs.push(path);
                } else if kernel && path.extension().is_some_and(|e| e == "rs") {
                    assert!(listed.contains(&name.as_str()), "{name} is missing from the kernel fingerprint");
                    seen += 1;
                }
            }
        }
        assert!(seen > 30, "only {seen} kernel files found: has the kernel tree moved?");
    }
}
