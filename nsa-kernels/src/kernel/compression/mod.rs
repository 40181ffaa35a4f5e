//! The compressed branch's kernels: the layout moves that make it a causal attention
//! ([`interleave`]), the row kernels around its dense products where it cannot be one
//! ([`rows`]), and which compressed blocks a query sees.

pub mod interleave;
pub mod rows;
pub mod visible;
