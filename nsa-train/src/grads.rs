//! Gradient utilities over a whole module: global L2 norm and clipping (on the device, no host
//! read), and which parameters take weight decay.

use std::collections::HashSet;

use burn::module::{AutodiffModule, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::Tensor;

/// Sum of squares of every gradient, as a one-element tensor on the device.
struct SquaredNorm<'a, B: AutodiffBackend> {
    grads: &'a GradientsParams,
    total: Option<Tensor<B::InnerBackend, 1>>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for SquaredNorm<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(g) = self.grads.get::<B::InnerBackend, D>(param.id) {
            let sq = g.square().sum();
            self.total = Some(match self.total.take() {
                Some(t) => t + sq,
                None => sq,
            });
        }
    }
}

/// Multiplies every gradient by a one-element tensor.
struct Scale<'a, B: AutodiffBackend> {
    grads: &'a mut GradientsParams,
    factor: Tensor<B::InnerBackend, 1>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Scale<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(g) = self.grads.remove::<B::InnerBackend, D>(param.id) {
            let factor = self.factor.clone().reshape([1; D]);
            self.grads.register(param.id, g * factor);
        }
    }
}

/// Clips the gradients to a global L2 norm of `max_norm` (0 disables) and returns the norm before
/// clipping. Everything stays on the device.
pub fn clip_global_norm<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: &M,
    grads: &mut GradientsParams,
    max_norm: f64,
    device: &burn::tensor::Device<B::InnerBackend>,
) -> Tensor<B::InnerBackend, 1> {
    let mut visitor = SquaredNorm::<B> { grads, total: None };
    module.visit(&mut visitor);
    let norm = visitor.total.unwrap_or_else(|| Tensor::zeros([1], device)).sqrt();
    if max_norm > 0.0 {
        let factor = norm.clone().add_scalar(1e-6).recip().mul_scalar(max_norm).clamp_max(1.0);
        module.visit(&mut Scale::<B> { grads, factor });
    }
    norm
}

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

/// Decoupled weight decay, `p <- p * (1 - lr * wd)`, on the given parameters (AdamW's decay,
/// applied by us so that norms, biases and embeddings can be left out).
pub struct DecayWeights<'a> {
    pub ids: &'a HashSet<ParamId>,
    pub factor: f64,
}

impl<B: AutodiffBackend> ModuleMapper<B> for DecayWeights<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        if !self.ids.contains(&param.id) {
            return param;
        }
        let factor = self.factor;
        // Outside the graph: the decayed value is a fresh leaf, like the optimiser's update.
        param.map(|t| {
            let require_grad = t.is_require_grad();
            Tensor::from_inner(t.inner().mul_scalar(factor)).set_require_grad(require_grad)
        })
    }
}
