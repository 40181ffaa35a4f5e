//! Burn's CPU backends (`Flex`, which training and inference run on, and `NdArray`, which the
//! tests' float64 reference runs on) take every extension's tensor-op defaults: the reference
//! attention, Burn's matmul, the tensor-op SiLU, mix, RMSNorm and AdamW.

macro_rules! with_defaults {
    ($($extension:path),* $(,)?) => {$(
        #[cfg(feature = "flex")]
        impl $extension for burn::backend::Flex {}

        #[cfg(feature = "ndarray")]
        impl<E, I, Q> $extension for burn::backend::NdArray<E, I, Q>
        where
            E: burn::backend::ndarray::FloatNdArrayElement,
            I: burn::backend::ndarray::IntNdArrayElement,
            Q: burn::backend::ndarray::QuantElement,
            burn::backend::ndarray::NdArrayTensor:
                From<burn::backend::ndarray::SharedArray<E>> + From<burn::backend::ndarray::SharedArray<I>>,
        {
        }
    )*};
}

with_defaults!(
    crate::activation::ActivationBackend,
    crate::decode::DecodeAttentionBackend,
    crate::sparse::SparseAttentionBackend,
    crate::gemm::GemmBackend,
    crate::mix::GatedMixBackend,
    crate::norm::RmsNormBackend,
    crate::optim::FusedAdamWBackend,
);
