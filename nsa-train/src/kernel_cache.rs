//! A persistent home for CubeCL's compiled kernels and autotune results.
//!
//! On a GPU backend the first steps of a run compile every kernel through NVRTC (CUDA) or the
//! shader compiler (WGPU) and autotune each matmul and reduction shape by compiling and timing a
//! dozen or more candidates, so without a cache every fresh process's first steps wait on
//! compilation, not training. CubeCL can keep both results on disk; pointing them at one
//! directory shared by all runs makes that cost a once-per-machine one.

use std::path::PathBuf;

/// The directory `setting` (`train.kernel_cache`) names: `~` expands to the home directory, an
/// empty setting means no cache. `None` also when `~` is used and no home directory is known.
pub fn resolve(setting: &str) -> Option<PathBuf> {
    let setting = setting.trim();
    if setting.is_empty() {
        return None;
    }
    match setting.strip_prefix('~') {
        Some(rest) if rest.is_empty() || rest.starts_with('/') => {
            let home = std::env::var_os("HOME").filter(|h| !h.is_empty())?;
            Some(PathBuf::from(home).join(rest.trim_start_matches('/')))
        }
        _ => Some(PathBuf::from(setting)),
    }
}

/// Makes CubeCL keep compiled kernels and autotune results under `dir`. Must run before the
/// first GPU operation of the process (CubeCL reads its configuration once); a `cubecl.toml`
/// in the working directory is still honoured for everything else.
#[cfg(any(feature = "cuda", feature = "wgpu"))]
pub fn install(dir: &std::path::Path) -> Result<(), String> {
    use burn::cubecl::config::cache::CacheConfig;
    use burn::cubecl::config::{CubeClRuntimeConfig, RuntimeConfig};

    std::fs::create_dir_all(dir).map_err(|e| format!("train.kernel_cache {}: {e}", dir.display()))?;
    let mut config = CubeClRuntimeConfig::from_current_dir().override_from_env();
    config.autotune.cache = CacheConfig::File(dir.join("autotune"));
    config.compilation.cache = Some(CacheConfig::File(compiled_dir(dir)));
    // `set` panics if CubeCL has already read its configuration; the caller runs this first.
    CubeClRuntimeConfig::set(config);
    Ok(())
}

/// Where this build's compiled kernels live: one directory per kernel fingerprint, since CubeCL
/// finds a cached kernel by its type and compile-time arguments, not its source (see
/// [`nsa_kernels::KERNEL_FINGERPRINT`]). Autotune results stay shared: they only choose among
/// candidates, each of which is compiled from this build.
pub fn compiled_dir(dir: &std::path::Path) -> PathBuf {
    dir.join("compiled").join(format!("{:016x}", *nsa_kernels::KERNEL_FINGERPRINT))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_setting_means_no_cache_and_a_plain_path_is_kept() {
        assert_eq!(resolve(""), None);
        assert_eq!(resolve("  "), None);
        assert_eq!(resolve("runs/kernels"), Some(PathBuf::from("runs/kernels")));
        assert_eq!(resolve("~user/x"), Some(PathBuf::from("~user/x")));
    }

    #[test]
    fn compiled_kernels_are_kept_per_kernel_fingerprint() {
        let dir = compiled_dir(std::path::Path::new("cache"));
        let name = dir.file_name().unwrap().to_str().unwrap().to_string();
        assert_eq!(dir.parent(), Some(std::path::Path::new("cache/compiled")));
        assert_eq!(name, format!("{:016x}", *nsa_kernels::KERNEL_FINGERPRINT));
    }

    #[test]
    fn a_leading_tilde_is_the_home_directory() {
        let home = PathBuf::from(std::env::var_os("HOME").expect("HOME is set for tests"));
        assert_eq!(resolve("~/.cache/nsa/kernels"), Some(home.join(".cache/nsa/kernels")));
        assert_eq!(resolve("~"), Some(home));
    }
}
