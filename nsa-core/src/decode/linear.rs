//! A decode step's linear layers with the norm before them, the activation and the residual
//! add, through [`nsa_kernels::decode_linear`] (one kernel each on CubeCL's backend).

use burn::nn::{Linear, RmsNorm};
use burn::tensor::Tensor;
use nsa_kernels::{decode_linear, DecodeAttentionBackend, StepInput};

use crate::model::Mlp;

/// The norm `layer` as a step's input function.
pub fn normed<B: DecodeAttentionBackend>(layer: &RmsNorm<B>) -> StepInput<Tensor<B, 1>> {
    StepInput::Norm(layer.gamma.val(), layer.epsilon)
}

/// `residual + f(x) W (+ b)` over a step's rows, `x: [B, 1, K]` -> `[B, 1, N]`.
pub fn step_linear<B: DecodeAttentionBackend>(
    layer: &Linear<B>,
    x: Tensor<B, 3>,
    input: StepInput<Tensor<B, 1>>,
    residual: Option<Tensor<B, 3>>,
) -> Tensor<B, 3> {
    let [b, t, k] = x.dims();
    let rows = |x: Tensor<B, 3>| {
        let n = x.dims()[2];
        x.reshape([b * t, n])
    };
    let out = decode_linear(x.reshape([b * t, k]), input, layer.weight.val(), residual.map(rows));
    let n = out.dims()[1];
    let out = out.reshape([b, t, n]);
    match &layer.bias {
        Some(bias) => out + bias.val().unsqueeze(),
        None => out,
    }
}

impl<B: DecodeAttentionBackend> Mlp<B> {
    /// `x + mlp(norm(x))` for a step's rows `x: [B, 1, dim]`: with the SiLU MLP, two launches
    /// (the norm with the up projection, SiLU with the down projection and the add).
    pub fn decode(&self, x: Tensor<B, 3>, norm: &RmsNorm<B>) -> Tensor<B, 3> {
        match &self.gate {
            None => {
                let hidden = step_linear(&self.up, x.clone(), normed(norm), None);
                step_linear(&self.down, hidden, StepInput::Silu, Some(x))
            }
            Some(_) => x.clone() + self.forward(crate::model::norm(norm, x)),
        }
    }
}
