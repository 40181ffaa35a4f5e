//! The decode step of an NSA layer: the new token's projections written where the step reads
//! them ([`write`]), then one new query per sequence against its cache, the three branches and
//! the block selection in one kernel ([`step`]), one cube per `(sequence, KV head)` whose `g`
//! query heads share every key row it reads.

pub mod attend;
pub mod step;
pub mod write;
