//! How the binaries (`nsa`, `nsa-bench`) pick and set up a backend: the kernel cache, the
//! backend a run resolves to and whether it works here, its devices and memory probes,
//! [`with_backend!`](crate::with_backend), which runs a generic body on the chosen training
//! backend type, and [`with_inference_backend!`](crate::with_inference_backend), its inference
//! counterpart.

use std::path::PathBuf;

use burn::tensor::backend::Backend;

pub use crate::config::BackendKind;
use crate::config::{Precision, RunConfig};
use crate::data::corpus::PackedSplit;
#[cfg(any(feature = "cuda", feature = "wgpu"))]
use crate::metrics::{DeviceMemory, MemoryProbe};
use crate::splits::load_splits;

/// Points CubeCL's kernel and autotune caches at `setting` (`train.kernel_cache`). Runs before
/// the first GPU operation, the backend probe included.
pub fn use_kernel_cache(setting: &str) -> Result<Option<PathBuf>, String> {
    #[cfg(any(feature = "cuda", feature = "wgpu"))]
    if let Some(dir) = crate::kernel_cache::resolve(setting) {
        crate::kernel_cache::install(&dir)?;
        return Ok(Some(dir));
    }
    let _ = setting;
    Ok(None)
}

/// Says where GPU kernels are cached, since a new machine's first steps are slow.
pub fn announce_kernel_cache(kind: BackendKind, dir: Option<PathBuf>) {
    if let (BackendKind::Cuda | BackendKind::Wgpu, Some(dir)) = (kind, dir) {
        eprintln!(
            "GPU kernels are cached in {}; on a new machine the first steps compile and autotune them (minutes)",
            dir.display()
        );
    }
}

/// The backend compiled in that `kind` resolves to on this machine; a named one that cannot
/// start here (no driver, no device) is a one-line error naming those that can.
pub fn resolve(kind: BackendKind) -> Result<BackendKind, String> {
    let compiled = |k: BackendKind| match k {
        BackendKind::Cuda => cfg!(feature = "cuda"),
        BackendKind::Wgpu => cfg!(feature = "wgpu"),
        BackendKind::Cpu => cfg!(feature = "cpu"),
        BackendKind::Auto => true,
    };
    match kind {
        BackendKind::Auto => [BackendKind::Cuda, BackendKind::Wgpu, BackendKind::Cpu]
            .into_iter()
            .find(|k| compiled(*k) && usable(*k))
            .ok_or_else(|| "no backend compiled in is usable here".to_string()),
        k if !compiled(k) => Err(format!(
            "this binary was built without the `{}` feature; run it through `cargo xtask train --backend {0}`",
            k.name()
        )),
        k if !usable(k) => {
            let here: Vec<&str> = [BackendKind::Cuda, BackendKind::Wgpu, BackendKind::Cpu]
                .into_iter()
                .filter(|&other| other != k && compiled(other) && usable(other))
                .map(BackendKind::name)
                .collect();
            let why = match k {
                BackendKind::Cuda => "no CUDA driver or NVIDIA GPU found",
                _ => "no device found",
            };
            Err(format!(
                "the `{}` backend cannot start on this machine ({why}); backends that can: {}",
                k.name(),
                if here.is_empty() { "none".to_string() } else { here.join(", ") }
            ))
        }
        k => Ok(k),
    }
}

/// Whether a backend can run a tiny op here (a missing driver panics inside Burn).
pub fn usable(kind: BackendKind) -> bool {
    fn probe<B: Backend>(device: B::Device) -> bool {
        crate::failures::catch(|| burn::tensor::Tensor::<B, 1>::ones([1], &device).into_data()).is_ok()
    }
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let ok = match kind {
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => probe::<burn::backend::Cuda>(Default::default()),
        #[cfg(feature = "wgpu")]
        BackendKind::Wgpu => probe::<burn::backend::Wgpu>(Default::default()),
        #[cfg(feature = "cpu")]
        BackendKind::Cpu => probe::<burn::backend::Flex>(Default::default()),
        _ => false,
    };
    std::panic::set_hook(previous);
    ok
}

/// A probe of the allocator of a CubeCL runtime's device, as seen from the calling thread.
#[cfg(any(feature = "cuda", feature = "wgpu"))]
pub fn cubecl_memory<R: burn::cubecl::Runtime>(device: &R::Device) -> Option<MemoryProbe> {
    let device = device.clone();
    Some(Box::new(move || {
        let usage = R::client(&device).memory_usage().ok()?;
        Some(DeviceMemory { in_use: usage.bytes_in_use, reserved: usage.bytes_reserved })
    }))
}

/// The backend generation runs on CUDA: CubeCL's without Burn's fusion. A decode step is many
/// small ops whose host cost is the step's time, and the fusion stream adds work to each of
/// them while finding little to fuse at one token (`docs/benchmarks.md`, "Decode", has both);
/// training keeps fusion.
#[cfg(feature = "cuda")]
pub type CudaDecode = nsa_kernels::CubeBackend<burn::cubecl::cuda::CudaRuntime, f32, i32, u8>;

/// The CUDA devices of the given indices.
#[cfg(feature = "cuda")]
pub fn cuda_devices(indices: &[usize]) -> Vec<burn::backend::cuda::CudaDevice> {
    indices.iter().map(|&i| burn::backend::cuda::CudaDevice::new(i)).collect()
}

/// The WGPU devices of the given indices: the default adapter alone, or discrete GPUs by index.
#[cfg(feature = "wgpu")]
pub fn wgpu_devices(indices: &[usize]) -> Vec<burn::backend::wgpu::WgpuDevice> {
    use burn::backend::wgpu::WgpuDevice;
    match indices {
        [0] => vec![WgpuDevice::DefaultDevice],
        _ => indices.iter().map(|&i| WgpuDevice::DiscreteGpu(i)).collect(),
    }
}

/// Runs `$body` with `$B` bound to the autodiff backend of `$kind`, `$devices` to its devices of
/// the indices `$indices`, and `$memory` to the maker of a device's memory probe. A backend this
/// crate was built without is an error: the feature checks expand here, in `nsa-train`, so a
/// binary of another crate needs no features of its own for them.
#[macro_export]
macro_rules! with_backend {
    ($kind:expr, $checkpointing:expr, $indices:expr, |$B:ident, $devices:ident, $memory:ident| $body:expr) => {{
        #[allow(unused_imports)]
        use $crate::backends::__private::{burn, Autodiff, Balanced, MemoryOf};
        #[allow(unused_imports)]
        use $crate::backends::*;
        match ($kind, $checkpointing) {
            (BackendKind::Cuda, false) => $crate::__if_cuda!({
                let memory = cubecl_memory::<burn::cubecl::cuda::CudaRuntime>;
                $crate::__on!(Autodiff<burn::backend::Cuda>, cuda_devices($indices), memory, |$B, $devices, $memory| {
                    $body
                })
            }),
            (BackendKind::Cuda, true) => $crate::__if_cuda!({
                let memory = cubecl_memory::<burn::cubecl::cuda::CudaRuntime>;
                type Ad = Autodiff<burn::backend::Cuda, Balanced>;
                $crate::__on!(Ad, cuda_devices($indices), memory, |$B, $devices, $memory| $body)
            }),
            (BackendKind::Wgpu, false) => $crate::__if_wgpu!({
                let memory = cubecl_memory::<burn::cubecl::wgpu::WgpuRuntime>;
                $crate::__on!(Autodiff<burn::backend::Wgpu>, wgpu_devices($indices), memory, |$B, $devices, $memory| {
                    $body
                })
            }),
            (BackendKind::Wgpu, true) => $crate::__if_wgpu!({
                let memory = cubecl_memory::<burn::cubecl::wgpu::WgpuRuntime>;
                type Ad = Autodiff<burn::backend::Wgpu, Balanced>;
                $crate::__on!(Ad, wgpu_devices($indices), memory, |$B, $devices, $memory| $body)
            }),
            // The CPU backend has one device: every replica runs on it.
            (BackendKind::Cpu, false) => $crate::__if_cpu!({
                let devices = vec![Default::default(); $indices.len()];
                $crate::__on!(Autodiff<burn::backend::Flex>, devices, |_| None, |$B, $devices, $memory| $body)
            }),
            (BackendKind::Cpu, true) => $crate::__if_cpu!({
                let devices = vec![Default::default(); $indices.len()];
                type Ad = Autodiff<burn::backend::Flex, Balanced>;
                $crate::__on!(Ad, devices, |_| None, |$B, $devices, $memory| $body)
            }),
            (BackendKind::Auto, _) => Err(not_compiled(BackendKind::Auto)),
        }
    }};
}

/// Runs `$body` with `$B` bound to the backend inference runs on for `$kind` (no autodiff),
/// `$device` to its first device and `$memory` to that device's memory probe (`None` on the
/// CPU). On CUDA that is [`CudaDecode`], CubeCL's backend without Burn's fusion, unless
/// `$fusion` asks for the fused one training runs on; WGPU and the CPU have one each.
#[macro_export]
macro_rules! with_inference_backend {
    ($kind:expr, $fusion:expr, |$B:ident, $device:ident, $memory:ident| $body:expr) => {{
        #[allow(unused_imports)]
        use $crate::backends::__private::burn;
        #[allow(unused_imports)]
        use $crate::backends::*;
        match ($kind, $fusion) {
            (BackendKind::Cuda, false) => $crate::__if_cuda!({
                type $B = CudaDecode;
                let $device = cuda_devices(&[0]).remove(0);
                let $memory = cubecl_memory::<burn::cubecl::cuda::CudaRuntime>(&$device);
                $body
            }),
            (BackendKind::Cuda, true) => $crate::__if_cuda!({
                type $B = burn::backend::Cuda;
                let $device = cuda_devices(&[0]).remove(0);
                let $memory = cubecl_memory::<burn::cubecl::cuda::CudaRuntime>(&$device);
                $body
            }),
            (BackendKind::Wgpu, _) => $crate::__if_wgpu!({
                type $B = burn::backend::Wgpu;
                let $device = wgpu_devices(&[0]).remove(0);
                let $memory = cubecl_memory::<burn::cubecl::wgpu::WgpuRuntime>(&$device);
                $body
            }),
            (BackendKind::Cpu, _) => $crate::__if_cpu!({
                type $B = burn::backend::Flex;
                let $device: burn::backend::flex::FlexDevice = Default::default();
                let $memory: Option<$crate::metrics::MemoryProbe> = None;
                $body
            }),
            (BackendKind::Auto, _) => Err(not_compiled(BackendKind::Auto)),
        }
    }};
}

/// `__on!(Backend, devices, memory, |B, devices, memory| body)`: the body with `B` the backend
/// type, `devices` its devices and `memory` its memory-probe maker.
#[doc(hidden)]
#[macro_export]
macro_rules! __on {
    ($ty:ty, $devices_value:expr, $memory_value:expr, |$B:ident, $devices:ident, $memory:ident| $body:expr) => {{
        type $B = $ty;
        let $devices: Vec<burn::tensor::Device<$B>> = $devices_value;
        let $memory: MemoryOf<$B> = $memory_value;
        $body
    }};
}

/// `__if_cuda!({ body })`: the body where this crate has the `cuda` feature, else the error that
/// it has not; `__if_wgpu!` and `__if_cpu!` likewise.
#[cfg(feature = "cuda")]
#[doc(hidden)]
#[macro_export]
macro_rules! __if_cuda {
    ($body:block) => {
        $body
    };
}
#[cfg(not(feature = "cuda"))]
#[doc(hidden)]
#[macro_export]
macro_rules! __if_cuda {
    ($body:block) => {
        Err($crate::backends::not_compiled($crate::backends::BackendKind::Cuda))
    };
}
#[cfg(feature = "wgpu")]
#[doc(hidden)]
#[macro_export]
macro_rules! __if_wgpu {
    ($body:block) => {
        $body
    };
}
#[cfg(not(feature = "wgpu"))]
#[doc(hidden)]
#[macro_export]
macro_rules! __if_wgpu {
    ($body:block) => {
        Err($crate::backends::not_compiled($crate::backends::BackendKind::Wgpu))
    };
}
#[cfg(feature = "cpu")]
#[doc(hidden)]
#[macro_export]
macro_rules! __if_cpu {
    ($body:block) => {
        $body
    };
}
#[cfg(not(feature = "cpu"))]
#[doc(hidden)]
#[macro_export]
macro_rules! __if_cpu {
    ($body:block) => {
        Err($crate::backends::not_compiled($crate::backends::BackendKind::Cpu))
    };
}

/// The error of [`with_backend!`](crate::with_backend) for a backend not compiled in.
pub fn not_compiled(kind: BackendKind) -> String {
    format!("backend `{}` is not compiled in", kind.name())
}

/// What [`with_backend!`](crate::with_backend) expands to names, for crates without Burn's
/// features of their own.
#[doc(hidden)]
pub mod __private {
    pub use crate::metrics::MemoryOf;
    pub use burn;
    pub use burn::backend::autodiff::checkpoint::strategy::BalancedCheckpointing as Balanced;
    pub use burn::backend::Autodiff;
}

/// The backend a validated run config resolves to here (kernel cache set first, as CubeCL reads
/// its configuration once) and its training and validation splits.
pub fn backend_and_data(cfg: &RunConfig) -> Result<(BackendKind, PackedSplit, PackedSplit), String> {
    let cache = use_kernel_cache(&cfg.train.kernel_cache)?;
    let kind = resolve(cfg.train.backend)?;
    check_devices(cfg, kind)?;
    announce_kernel_cache(kind, cache);
    check_precision(cfg, kind)?;
    let paths: Vec<PathBuf> = cfg.data.paths.iter().map(PathBuf::from).collect();
    let (train, valid, _) = load_splits(cfg, &paths).map_err(|e| e.to_string())?;
    Ok((kind, train, valid))
}

/// `train.devices` exist here, and a data-parallel CUDA run can load NCCL.
pub fn check_devices(cfg: &RunConfig, kind: BackendKind) -> Result<(), String> {
    let devices = &cfg.train.devices;
    #[cfg(feature = "cuda")]
    if kind == BackendKind::Cuda {
        let count = nsa_kernels::devices::cuda_device_count().unwrap_or(0);
        if let Some(d) = devices.iter().find(|&&d| d >= count) {
            return Err(format!("train.devices names CUDA device {d}, but this machine has {count}"));
        }
        if devices.len() > 1 && !nsa_kernels::devices::nccl_available() {
            return Err("data-parallel training on CUDA needs NCCL, and libnccl.so is not on the library path: \
                        install NCCL, or link an existing libnccl.so.2 (e.g. PyTorch's nvidia/nccl/lib) as libnccl.so \
                        in a directory on LD_LIBRARY_PATH"
                .into());
        }
    }
    if kind == BackendKind::Cpu && devices.len() > 1 {
        eprintln!("note: the cpu backend runs all {} replicas on the host's one device", devices.len());
    }
    Ok(())
}

/// bf16 compute runs on CUDA only (the CPU backend has no bf16; WGPU devices rarely do).
pub fn check_precision(cfg: &RunConfig, kind: BackendKind) -> Result<(), String> {
    if cfg.train.precision == Precision::Bf16 && kind != BackendKind::Cuda {
        return Err(format!(
            "train.precision = \"bf16\" needs the cuda backend (this run resolved to {}); use \"f32\"",
            kind.name()
        ));
    }
    Ok(())
}
