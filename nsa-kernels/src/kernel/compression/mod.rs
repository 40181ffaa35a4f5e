//! The compressed branch's row kernels around its dense products (probabilities, score
//! gradients), and which compressed blocks a query sees.

pub mod rows;
pub mod visible;
