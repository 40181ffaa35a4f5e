//! Mixed precision: parameters stay in their storage dtype (the f32 master weights the optimiser
//! updates); a forward pass runs on a copy cast to a narrower compute dtype.
//!
//! The cast is an autodiff op, so the backward pass casts each gradient back to its master
//! parameter's dtype: gradients, optimiser moments and updates stay in f32 while matmuls and
//! activations run in bf16.

use burn::module::{Module, ModuleMapper, Param};
use burn::tensor::{backend::Backend, FloatDType, Tensor};

struct CastParams(FloatDType);

impl<B: Backend> ModuleMapper<B> for CastParams {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let dtype = self.0;
        param.map(|t| if t.dtype() == dtype.into() { t } else { t.cast(dtype) })
    }
}

/// `module` with every float parameter cast to `dtype` (kept as it is when already `dtype`).
/// Parameter ids are kept, and under autodiff the cast copies stay attached to the originals.
pub fn cast_params<B: Backend, M: Module<B>>(module: M, dtype: FloatDType) -> M {
    module.map(&mut CastParams(dtype))
}
