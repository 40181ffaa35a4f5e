//! The portable kernels: any device CubeCL runs on (WGPU included) and any float storage type,
//! with f32 arithmetic in registers and shared memory and no tensor cores. One kernel per pass
//! serves windows and selections (a compile-time flag).

pub mod backward;
pub mod forward;
