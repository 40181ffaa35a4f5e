//! Autodiff gradients of the layer against central finite differences, in float64.

use burn::module::{AutodiffModule, Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::tensor::{backend::Backend, Tensor, TensorData};
use nsa_core::{NsaAttention, NsaAttentionConfig, NsaConfig, Phi};
use nsa_tests::{fresh_rng, normal, random_input, randomized, to_vec, A64, B64};
use rand::Rng;

/// Every float parameter: its path, id, value and autodiff gradient.
struct Collect<'a> {
    grads: &'a <A64 as burn::tensor::backend::AutodiffBackend>::Gradients,
    path: Vec<String>,
    out: Vec<(String, ParamId, Vec<usize>, Vec<f64>)>,
}

impl ModuleVisitor<A64> for Collect<'_> {
    fn enter_module(&mut self, name: &str, _: &str) {
        self.path.push(name.to_string());
    }
    fn exit_module(&mut self, _: &str, _: &str) {
        self.path.pop();
    }
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<A64, D>>) {
        let grad = param.val().grad(self.grads).map(to_vec).unwrap_or_default();
        self.out.push((self.path.join("."), param.id, param.val().dims().to_vec(), grad));
    }
}

/// Adds `delta` to one element of one parameter.
struct Nudge {
    id: ParamId,
    index: usize,
    delta: f64,
}

impl<B: Backend> ModuleMapper<B> for Nudge {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        if param.id != self.id {
            return param;
        }
        let (id, tensor, mapper) = param.consume();
        let shape = tensor.shape();
        let mut values = to_vec(tensor.clone());
        values[self.index] += self.delta;
        Param::from_mapped_value(id, Tensor::from_data(TensorData::new(values, shape), &tensor.device()), mapper)
    }
}

fn loss<B: nsa_core::SparseAttentionBackend>(
    layer: &NsaAttention<B>,
    x: Tensor<B, 3>,
    weights: Tensor<B, 3>,
) -> Tensor<B, 1> {
    (layer.forward(x) * weights).sum()
}

#[test]
fn autodiff_matches_finite_differences_and_every_parameter_learns_phi_linear() {
    check_gradients(Phi::Linear);
}

#[test]
fn autodiff_matches_finite_differences_and_every_parameter_learns_phi_mlp() {
    check_gradients(Phi::Mlp);
}

fn check_gradients(phi: Phi) {
    let cfg = NsaConfig::new()
        .with_dim(8)
        .with_n_heads(4)
        .with_n_kv_heads(2)
        .with_d_k(4)
        .with_d_v(6)
        .with_l(4)
        .with_d(2)
        .with_l_sel(4)
        .with_n(3)
        .with_w(5)
        .with_phi(phi);
    cfg.validate().unwrap();
    let (t, b) = (19, 2);
    let device = Default::default();
    let mut rng = fresh_rng("gradients");
    let layer: NsaAttention<A64> = randomized(NsaAttentionConfig::new(cfg.clone(), t).init(&device), &mut rng, 0.5);
    let (x, _) = random_input::<A64>(&mut rng, b, t, cfg.dim, &device);
    let weights =
        Tensor::<A64, 3>::from_data(TensorData::new(normal(&mut rng, b * t * cfg.dim, 1.0), [b, t, cfg.dim]), &device);

    let grads = loss(&layer, x.clone(), weights.clone()).backward();
    let mut collect = Collect { grads: &grads, path: Vec::new(), out: Vec::new() };
    layer.visit(&mut collect);
    assert!(collect.out.iter().any(|(name, ..)| name.contains("kv.0.key")), "W^cmp_k not visited");

    let inner: NsaAttention<B64> = layer.valid();
    let (x, weights) = (x.inner(), weights.inner());
    let h = 1e-5;
    for (name, id, dims, grad) in &collect.out {
        let norm: f64 = grad.iter().map(|g| g * g).sum::<f64>().sqrt();
        assert!(norm > 0.0, "parameter {name} {dims:?} receives no gradient");
        for _ in 0..4 {
            let index = rng.random_range(0..grad.len());
            let at = |delta| {
                to_vec(loss(&inner.clone().map(&mut Nudge { id: *id, index, delta }), x.clone(), weights.clone()))[0]
            };
            let numeric = (at(h) - at(-h)) / (2.0 * h);
            let err = (numeric - grad[index]).abs();
            assert!(
                err <= 1e-6 * (1.0 + grad[index].abs()),
                "{name}[{index}]: autodiff {} vs finite differences {numeric} (error {err:e})",
                grad[index]
            );
        }
    }
}
