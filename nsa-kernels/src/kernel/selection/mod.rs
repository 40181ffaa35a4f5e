//! A selection's kernels on CUDA's tensor cores, key-major over the inverted block index
//! ([`index`]): per-block partial results and their merge (the forward), dQ where the key kernel
//! does not fold it in, and the sum of each block's segment shares of dK/dV ([`segments`], also
//! used by the portable key kernel); and which blocks each query selects: [`top_n`] over
//! [`block_scores`] on every device, [`top_n_mma`] over [`probabilities`] on tensor cores, both
//! placed by [`selection_cube`] and forcing blocks with [`top_n::force_blocks`].

pub mod block_scores;
pub mod dq;
pub mod index;
pub mod merge;
pub mod partials;
pub mod plane_top_n;
pub mod probabilities;
pub mod segments;
pub mod selection_cube;
pub mod top_n;
pub mod top_n_mma;
