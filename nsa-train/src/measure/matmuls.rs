//! The linear layers' dense matmuls alone (forward, and backward's two), all layers and the
//! head: what the projections, MLPs and head would cost at the GEMM's own speed.

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;
use nsa_core::NsaLm;

use super::stopwatch::Stopwatch;
use crate::TrainBackend;

/// Shapes `[in, out]` of the linear layers' weights (a `Linear`'s `weight` field).
struct LinearShapes(Vec<[usize; 2]>, Vec<String>);

impl<B: Backend> ModuleVisitor<B> for LinearShapes {
    fn enter_module(&mut self, _: &str, container: &str) {
        self.1.push(container.to_string());
    }
    fn exit_module(&mut self, _: &str, _: &str) {
        self.1.pop();
    }
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        // Burn's derive enters each field with its struct's name as the container: a Linear's
        // `weight` is visited with `Struct:Linear` on top of the stack (its bias is 1-D).
        let in_linear = self.1.last().is_some_and(|c| c == "Struct:Linear");
        if D == 2 && in_linear {
            let dims = param.val().dims();
            self.0.push([dims[0], dims[1]]);
        }
    }
}

fn linear_shapes<B: Backend, M: Module<B>>(module: &M) -> Vec<[usize; 2]> {
    let mut visitor = LinearShapes(Vec::new(), Vec::new());
    module.visit(&mut visitor);
    visitor.0
}

/// Milliseconds and FLOPs of one micro-batch's linear-layer matmuls (`rows` tokens, `layers`
/// blocks like the first, and the head), each distinct shape timed once.
pub(crate) fn linear_matmuls_ms<B: TrainBackend>(
    sw: &Stopwatch<B>,
    model: &NsaLm<B>,
    rows: usize,
    layers: usize,
) -> (f64, f64) {
    let mut unique: Vec<([usize; 2], usize)> = Vec::new();
    let shapes = linear_shapes::<B, _>(&model.blocks[0]).into_iter().map(|s| (s, layers));
    for (s, n) in shapes.chain(linear_shapes::<B, _>(&model.lm_head).into_iter().map(|s| (s, 1))) {
        match unique.iter_mut().find(|(u, _)| *u == s) {
            Some((_, count)) => *count += n,
            None => unique.push((s, n)),
        }
    }
    let (mut ms, mut flops) = (0.0, 0.0);
    for ([d_in, d_out], count) in unique {
        let w = sw.random([d_in, d_out], 0.02);
        let one = sw.time_with(
            || sw.random([rows, d_in], 1.0),
            |a| {
                let _ = nsa_kernels::linear_matmul(a, w.clone()).sum().backward();
            },
        );
        ms += one * count as f64;
        flops += 6.0 * (rows * d_in * d_out) as f64 * count as f64;
    }
    (ms, flops)
}
