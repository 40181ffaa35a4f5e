//! Building blocks the kernels are composed from, written once: cube decoding
//! ([`query_cube`], [`key_cube`]), row ranges and slices ([`rows`]), staging into shared memory
//! ([`staging`]), the pipelined walk over double-buffered chunks ([`walk`]) and what it copies
//! ([`chunk_copies`]), the manual-MMA fragments ([`fragments`]), the online softmax over
//! register tiles ([`softmax`]), atomic row adds ([`atomic_rows`]) and short vector helpers
//! ([`vectors`]).

pub mod atomic_rows;
pub mod chunk_copies;
pub mod fragments;
pub mod key_cube;
pub mod layout;
pub mod query_cube;
pub mod rows;
pub mod softmax;
pub mod staging;
pub mod vectors;
pub mod walk;
