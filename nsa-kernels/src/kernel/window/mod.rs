//! A window's query-side passes on CUDA's tensor cores (manual MMA, f16/bf16): the forward and,
//! where the key kernel does not fold it in, dQ. Its dK/dV are [`super::key_gradients`]'.

pub mod dq;
pub mod forward;
