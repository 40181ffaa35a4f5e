//! A decode step's linear layers with what surrounds them: `residual + f(x) w` over the step's
//! rows (one per sequence), `f` the norm before the layer or the MLP's activation. At one token
//! per sequence each op's host cost is what a step pays, and in tensor ops this is up to a
//! dozen of them (the norm, SiLU's parts, the product, the add); on `CubeBackend` it is one
//! kernel ([`crate::kernel::decode::linear`]).

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorPrimitive};

use super::DecodeAttentionBackend;
use crate::{linear_matmul, rms_norm, silu};

/// What a step's linear layer applies to its input first; `G` is the norm's gain `[K]`.
#[derive(Clone, Debug)]
pub enum StepInput<G> {
    /// The input itself.
    Plain,
    /// RMSNorm with the gain and epsilon.
    Norm(G, f64),
    /// SiLU.
    Silu,
    /// The gated mix of the attention's branches, `x` the compressed branch's outputs `[M, K]`:
    /// the selected and window branches' (`[M * K]`) and the gates (`[M * 3 H]`, per row the
    /// three branches' gate of each head, head `h` owning columns `h K / H..`).
    Mix { selected: G, window: G, gates: G },
}

impl<G> StepInput<G> {
    pub(super) fn map<H>(self, mut f: impl FnMut(G) -> H) -> StepInput<H> {
        match self {
            StepInput::Plain => StepInput::Plain,
            StepInput::Norm(gamma, epsilon) => StepInput::Norm(f(gamma), epsilon),
            StepInput::Silu => StepInput::Silu,
            StepInput::Mix { selected, window, gates } => {
                StepInput::Mix { selected: f(selected), window: f(window), gates: f(gates) }
            }
        }
    }
}

/// `residual + f(x) w`: `x [M, K]`, `weight [K, N]`, `residual [M, N]`; the gain in `x`'s dtype.
pub struct StepLinear<B: Backend> {
    pub x: FloatTensor<B>,
    pub input: StepInput<FloatTensor<B>>,
    pub weight: FloatTensor<B>,
    pub residual: Option<FloatTensor<B>>,
}

impl<B: Backend> StepLinear<B> {
    fn new(
        x: Tensor<B, 2>,
        input: StepInput<Tensor<B, 1>>,
        weight: Tensor<B, 2>,
        residual: Option<Tensor<B, 2>>,
    ) -> Self {
        let dtype = x.dtype();
        StepLinear {
            input: input.map(|gamma| gamma.cast(dtype).into_primitive().tensor()),
            x: x.into_primitive().tensor(),
            weight: weight.into_primitive().tensor(),
            residual: residual.map(|r| r.into_primitive().tensor()),
        }
    }
}

/// `residual + f(x) weight` for `x [M, K]`, `weight [K, N]`, `residual [M, N]`, as the backend
/// runs it ([`DecodeAttentionBackend::decode_linear`]).
pub fn decode_linear<B: DecodeAttentionBackend>(
    x: Tensor<B, 2>,
    input: StepInput<Tensor<B, 1>>,
    weight: Tensor<B, 2>,
    residual: Option<Tensor<B, 2>>,
) -> Tensor<B, 2> {
    float(B::decode_linear(StepLinear::new(x, input, weight, residual)))
}

/// [`decode_linear`] in tensor ops: the norm, SiLU, product and add, each rounded to `x`'s
/// dtype (the default of [`DecodeAttentionBackend::decode_linear`]).
pub(super) fn reference<B: DecodeAttentionBackend>(step: StepLinear<B>) -> FloatTensor<B> {
    let StepLinear { x, input, weight, residual } = step;
    let x = float::<B, 2>(x);
    let x = match input.map(float::<B, 1>) {
        StepInput::Plain => x,
        StepInput::Norm(gamma, epsilon) => rms_norm(x, gamma, epsilon),
        StepInput::Silu => silu(x),
        StepInput::Mix { selected, window, gates } => {
            let [m, k] = x.dims();
            let heads = gates.dims()[0] / (3 * m);
            let gates = gates.reshape([m, 3, heads, 1]).expand([m, 3, heads, k / heads]);
            let gate = |i: usize| gates.clone().narrow(1, i, 1).reshape([m, k]);
            x * gate(0) + selected.reshape([m, k]) * gate(1) + window.reshape([m, k]) * gate(2)
        }
    };
    let out = linear_matmul(x, float(weight));
    match residual {
        Some(residual) => (float::<B, 2>(residual) + out).into_primitive().tensor(),
        None => out.into_primitive().tensor(),
    }
}

fn float<B: Backend, const D: usize>(x: FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(x))
}
