//! The CubeCL kernels. One unit per query row (forward, dQ) or per key row (dK, dV), softmax
//! statistics in f32 whatever the storage dtype.
//!
//! Unit order puts the `g` query heads of one KV head next to each other, so the heads of a
//! group read the same key and value rows at the same time and each row is fetched from memory
//! once per group (NSA's group-sharing, at the cache level for now).

pub mod backward;
pub mod forward;
pub mod inverse;
pub mod rows;
