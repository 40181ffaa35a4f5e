//! The sparse-attention op's CubeCL kernels, one family per folder, and the primitives they
//! (and the other ops' kernels) are composed from. Query-side cubes (forward, dQ) hold the `g` query heads of one KV head
//! for one or more positions; key-side cubes (dK, dV) hold consecutive keys of one KV head.
//! Keys, values and query rows are staged in shared memory once per cube and read by all of
//! its units, which is NSA's group sharing: a K/V row is fetched once for the whole group.
//! Softmax statistics are f32 whatever the storage dtype.
//!
//! Kernel code is CubeCL's frontend language, a subset of Rust that `#[cube]` expands: clippy's
//! rewrites into methods the frontend may not know (`is_multiple_of`, `div_ceil`), `Default`
//! impls for cube types and compound assignment on vector lanes are not applied here.
#![allow(
    clippy::manual_is_multiple_of,
    clippy::manual_div_ceil,
    clippy::new_without_default,
    clippy::assign_op_pattern,
    clippy::needless_borrow
)]

pub mod compression;
pub mod decode;
pub mod key_gradients;
pub mod portable;
pub mod primitives;
pub mod row_delta;
pub mod selection;
pub mod window;
