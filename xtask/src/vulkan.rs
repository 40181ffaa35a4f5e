//! The WGPU kernel tests need a Vulkan driver. A machine without a GPU uses Mesa's software one
//! (lavapipe); `cargo xtask test` installs it where it can (root with apt-get) and otherwise
//! stops with the package names, instead of letting the tests fail on a missing adapter.

use std::path::Path;
use std::process::{Command, Stdio};

/// Where Vulkan loaders look for installable client drivers (ICDs).
const ICD_DIRS: [&str; 2] = ["/usr/share/vulkan/icd.d", "/etc/vulkan/icd.d"];
const PACKAGES: [&str; 2] = ["mesa-vulkan-drivers", "libvulkan1"];

/// Makes sure a Vulkan loader and at least one driver are installed (Linux only; other systems
/// ship theirs with the GPU driver).
pub fn ensure_driver() -> Result<(), String> {
    if !cfg!(target_os = "linux") || driver_present() {
        return Ok(());
    }
    let root = Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout.starts_with(b"0"));
    let apt = Command::new("apt-get").arg("--version").stdout(Stdio::null()).status().is_ok_and(|s| s.success());
    if root && apt {
        eprintln!(
            "no Vulkan driver: installing Mesa's software driver for the WGPU kernel tests ({})",
            PACKAGES.join(" ")
        );
        let install =
            || Command::new("apt-get").args(["install", "-y", "-q"]).args(PACKAGES).stdout(Stdio::null()).status();
        if !install().is_ok_and(|s| s.success()) {
            let _ = Command::new("apt-get").args(["update", "-qq"]).status();
            let _ = install();
        }
    }
    if driver_present() {
        Ok(())
    } else {
        Err(format!(
            "the WGPU kernel tests need a Vulkan driver and none is installed: install {} (Debian/Ubuntu \
             package names; or your GPU's Vulkan driver), then rerun",
            PACKAGES.join(" and ")
        ))
    }
}

/// Library directories checked for the loader besides the `ldconfig` cache (which a non-root
/// user may not have on `PATH`).
const LIB_DIRS: [&str; 5] =
    ["/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/lib"];

fn driver_present() -> bool {
    let listed = ["ldconfig", "/sbin/ldconfig"].iter().any(|ldconfig| {
        Command::new(ldconfig)
            .arg("-p")
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("libvulkan.so.1"))
    });
    let loader = listed || LIB_DIRS.iter().any(|dir| Path::new(dir).join("libvulkan.so.1").exists());
    let icd = ICD_DIRS.iter().any(|dir| {
        std::fs::read_dir(Path::new(dir))
            .map(|entries| entries.flatten().any(|e| e.path().extension().is_some_and(|x| x == "json")))
            .unwrap_or(false)
    });
    loader && icd
}

/// The environment the WGPU tests run in: a usable `XDG_RUNTIME_DIR` ([`private_runtime_dir`])
/// and, unless the caller chose otherwise, `GALLIVM_PERF=nopt`.
///
/// Without a GPU the tests' time is lavapipe compiling each kernel with LLVM (coroutine lowering
/// at every barrier, then code generation). `nopt` skips LLVM's optimisation passes over the
/// kernels, about 30% of that time; the tests' kernels run on small shapes, where slower code
/// costs nothing that shows. Other Vulkan drivers ignore the variable.
pub fn test_environment(cmd: &mut Command) {
    private_runtime_dir(cmd);
    if std::env::var_os("GALLIVM_PERF").is_none() {
        cmd.env("GALLIVM_PERF", "nopt");
    }
}

/// Gives the tests a private `XDG_RUNTIME_DIR` when the environment has none usable: Mesa's
/// Vulkan drivers print "error: XDG_RUNTIME_DIR is invalid" otherwise, which reads like a test
/// failure and is not one.
fn private_runtime_dir(cmd: &mut Command) {
    let usable = std::env::var_os("XDG_RUNTIME_DIR").is_some_and(|dir| Path::new(&dir).is_dir());
    if usable || !cfg!(unix) {
        return;
    }
    let dir = std::env::temp_dir().join(format!("nsa-xdg-runtime-{}", std::process::id()));
    if std::fs::create_dir_all(&dir).is_ok() {
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700));
        }
        cmd.env("XDG_RUNTIME_DIR", dir);
    }
}
