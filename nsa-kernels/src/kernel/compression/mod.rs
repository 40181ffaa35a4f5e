//! The compressed branch's kernels: the layout moves that make it a causal attention
//! ([`interleave`]), and which compressed blocks a query sees.

pub mod interleave;
pub mod visible;
