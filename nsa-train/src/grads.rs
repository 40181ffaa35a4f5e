//! Gradient utilities over a whole module: widening gradients to their parameters' dtype, and
//! which parameters take weight decay (the clip and decay themselves are the fused step's).

use std::collections::HashSet;

use burn::module::{AutodiffModule, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::Tensor;

/// Casts every gradient to its parameter's dtype.
struct ToParamDtype<'a> {
    grads: &'a mut GradientsParams,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for ToParamDtype<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(g) = self.grads.remove::<B::InnerBackend, D>(param.id) {
            let dtype = param.val().dtype();
            self.grads.register(param.id, if g.dtype() == dtype { g } else { g.cast(dtype) });
        }
    }
}

/// `grads` with each gradient in its parameter's dtype (compute-dtype gradients widened before
/// they are summed).
pub fn to_param_dtype<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: &M,
    mut grads: GradientsParams,
) -> GradientsParams {
    module.visit(&mut ToParamDtype { grads: &mut grads });
    grads
}

/// Parameters that take weight decay: every matrix except embeddings; never norms or biases.
struct DecayIds {
    path: Vec<String>,
    ids: HashSet<ParamId>,
}

impl<B: Backend> ModuleVisitor<B> for DecayIds {
    fn enter_module(&mut self, name: &str, _: &str) {
        self.path.push(name.to_string());
    }
    fn exit_module(&mut self, _: &str, _: &str) {
        self.path.pop();
    }
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let excluded = self.path.iter().any(|p| p.contains("norm") || p == "embedding")
            || self.path.last().is_some_and(|p| p == "bias");
        if D >= 2 && !excluded {
            self.ids.insert(param.id);
        }
    }
}

pub fn weight_decay_ids<B: Backend, M: burn::module::Module<B>>(module: &M) -> HashSet<ParamId> {
    let mut visitor = DecayIds { path: Vec::new(), ids: HashSet::new() };
    module.visit(&mut visitor);
    visitor.ids
}
