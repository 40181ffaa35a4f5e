//! The cross-crate tests, as one binary: each test file is a module, so Burn's generic code is
//! compiled once for all of them instead of once per file (most of a cold test build). Every
//! CPU test here runs in f64: Burn keys a device's default float dtype by device type, so the
//! first of `NdArray<f32>` and `NdArray<f64>` to touch the CPU in a process fixes it for both.
//! `tensor_core_expand` installs a process-wide panic hook, so its check runs in a process of its
//! own that this binary starts ([`nsa_tests::in_own_process`]).

mod activation;
mod compressed;
mod config;
mod constants;
mod decode;
mod decode_kernel;
mod decode_linear;
mod decode_write;
mod documents;
mod embedding;
mod gemm;
mod gradients;
mod kernel_parts;
mod kernels;
mod limits;
/// On a CUDA device only (`--features cuda`).
#[cfg(feature = "cuda")]
mod manual_mma;
mod masked_scores;
mod mix;
mod model;
mod norm;
mod optimizer;
mod parity;
mod phi;
mod precision;
mod select_kernel;
mod selection;
mod tensor_core_expand;
