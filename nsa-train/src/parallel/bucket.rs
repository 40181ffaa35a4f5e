//! The step's gradients and loss as one flat tensor, so a data-parallel step makes one all-reduce
//! (one rendezvous of the replicas, one transfer each way) instead of one per parameter.
//! Parameters are visited in the module's order, which every replica shares.

use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{FloatDType, Tensor};

/// Gathers the gradients, flattened, in module order.
struct Gather<'a, B: AutodiffBackend> {
    grads: &'a mut GradientsParams,
    parts: Vec<Tensor<B::InnerBackend, 1>>,
    /// The master weights' dtype (the first gathered parameter's), which the sum runs in.
    dtype: Option<FloatDType>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Gather<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(g) = self.grads.remove::<B::InnerBackend, D>(param.id) {
            let n = g.shape().num_elements();
            self.parts.push(g.reshape([n]));
            self.dtype.get_or_insert_with(|| param.val().dtype().into());
        }
    }
}

/// Cuts the flat tensor back into the gradients, in the order [`Gather`] laid them out.
struct Scatter<'a, B: AutodiffBackend> {
    has_grad: &'a [bool],
    flat: Tensor<B::InnerBackend, 1>,
    offset: usize,
    index: usize,
    grads: GradientsParams,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Scatter<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let has_grad = self.has_grad[self.index];
        self.index += 1;
        if !has_grad {
            return;
        }
        let shape = param.shape();
        let n = shape.num_elements();
        let g = self.flat.clone().slice(self.offset..self.offset + n).reshape(shape);
        self.offset += n;
        self.grads.register::<B::InnerBackend, D>(param.id, g);
    }
}

/// Which parameters have a gradient, in module order.
struct HasGrad<'a> {
    grads: &'a GradientsParams,
    has: Vec<bool>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for HasGrad<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        self.has.push(self.grads.get::<B::InnerBackend, D>(param.id).is_some());
    }
}

/// The layout of one flattened step: which parameters it holds.
pub(crate) struct Layout {
    has_grad: Vec<bool>,
}

/// `[every gradient, flattened in module order; the loss]`, in the master weights' dtype.
pub(crate) fn flatten<B: AutodiffBackend, M: Module<B>>(
    model: &M,
    mut grads: GradientsParams,
    loss: Tensor<B::InnerBackend, 1>,
) -> (Layout, Tensor<B::InnerBackend, 1>) {
    let mut has = HasGrad { grads: &grads, has: Vec::new() };
    model.visit(&mut has);
    let layout = Layout { has_grad: has.has };
    let mut gather = Gather::<B> { grads: &mut grads, parts: Vec::new(), dtype: None };
    model.visit(&mut gather);
    let (parts, dtype) = (gather.parts, gather.dtype);
    // Summed in the master dtype whatever the gradients' (bf16 ones from a mixed-precision
    // forward): one cast of the concatenation, not one per parameter, when they share a dtype.
    let same = parts.windows(2).all(|w| w[0].dtype() == w[1].dtype());
    let grads = match (dtype, same) {
        (None, _) => None,
        (Some(d), true) => Some(Tensor::cat(parts, 0).cast(d)),
        (Some(d), false) => Some(Tensor::cat(parts.into_iter().map(|p| p.cast(d)).collect(), 0)),
    };
    match grads {
        Some(g) => {
            let loss = loss.cast(g.dtype());
            (layout, Tensor::cat(vec![g, loss], 0))
        }
        None => (layout, loss),
    }
}

/// The inverse of [`flatten`]: the gradients and the loss.
pub(crate) fn unflatten<B: AutodiffBackend, M: Module<B>>(
    model: &M,
    layout: &Layout,
    flat: Tensor<B::InnerBackend, 1>,
) -> (GradientsParams, Tensor<B::InnerBackend, 1>) {
    let total = flat.dims()[0];
    let loss = flat.clone().slice(total - 1..total);
    let mut scatter =
        Scatter::<B> { has_grad: &layout.has_grad, flat, offset: 0, index: 0, grads: GradientsParams::new() };
    model.visit(&mut scatter);
    (scatter.grads, loss)
}
