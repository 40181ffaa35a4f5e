//! The dtypes every op's statistics share.

use burn::tensor::DType;

/// The dtype softmax statistics are kept in: f32 for 16-bit storage, else the storage dtype.
pub fn stats_dtype(storage: DType) -> DType {
    match storage {
        DType::F16 | DType::BF16 => DType::F32,
        other => other,
    }
}
