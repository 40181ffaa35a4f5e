//! The compressed branch's row kernels around its dense products (probabilities, score
//! gradients, the selection's block scores).

pub mod rows;
pub mod scores;
