//! What the CUDA driver offers this process, asked before a run is set up so that a bad device
//! index or a missing NCCL is one clear error instead of a panic deep inside CubeCL.

/// The number of CUDA devices, or `None` when the driver cannot be loaded or initialised.
#[cfg(feature = "cuda")]
pub fn cuda_device_count() -> Option<usize> {
    cudarc::driver::result::init().ok()?;
    cudarc::driver::result::device::get_count().ok().map(|n| n as usize)
}

/// Whether NCCL can be loaded: CUDA data-parallel training copies between devices through it
/// (cubecl-cuda loads `libnccl.so` at run time and panics when it is missing).
#[cfg(feature = "cuda")]
pub fn nccl_available() -> bool {
    // SAFETY: only tries to open the library.
    unsafe { cudarc::nccl::sys::is_culib_present() }
}
