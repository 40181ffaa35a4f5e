//! The decode step of an NSA layer: one new query per sequence against its cache, the three
//! branches and the block selection in one kernel ([`step`]), one cube per `(sequence, KV
//! head)` whose `g` query heads share every key row it reads.

pub mod attend;
pub mod step;
