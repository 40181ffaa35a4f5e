//! `Fusion<B>`: the mix and its backward as custom operations on the fusion stream (Burn's
//! fusion does not look inside them; the element-wise work around them still fuses).

use std::marker::PhantomData;

use burn::tensor::ops::FloatTensor;
use burn_fusion::stream::{Operation, OperationStreams};
use burn_fusion::{Fusion, FusionBackend, FusionRuntime};
use burn_ir::{CustomOpIr, HandleContainer, OperationIr, TensorIr};

use super::GatedMixBackend;

#[derive(Clone, Debug)]
struct MixOp<B> {
    desc: CustomOpIr,
    backward: bool,
    _backend: PhantomData<B>,
}

impl<B: FusionBackend + GatedMixBackend> Operation<B::FusionRuntime> for MixOp<B> {
    fn execute(&self, handles: &mut HandleContainer<<B::FusionRuntime as FusionRuntime>::FusionHandle>) {
        let inputs: Vec<FloatTensor<B>> = self.desc.inputs.iter().map(|x| handles.get_float_tensor::<B>(x)).collect();
        let [o_0, o_1, o_2, gates] = [0, 1, 2, 3].map(|i| inputs[i].clone());
        let outputs = match self.backward {
            false => vec![B::gated_mix([o_0, o_1, o_2], gates)],
            true => {
                let ([d_0, d_1, d_2], d_gates) = B::gated_mix_backward([o_0, o_1, o_2], gates, inputs[4].clone());
                vec![d_0, d_1, d_2, d_gates]
            }
        };
        for (output, tensor) in self.desc.outputs.iter().zip(outputs) {
            handles.register_float_tensor::<B>(&output.id, tensor);
        }
    }
}

/// Registers the op over `inputs` with outputs shaped like `like` (their indices into `inputs`).
fn register<B: FusionBackend + GatedMixBackend>(
    name: &'static str,
    inputs: Vec<FloatTensor<Fusion<B>>>,
    like: &[usize],
) -> Vec<FloatTensor<Fusion<B>>> {
    let client = inputs[0].client.clone();
    let streams = OperationStreams::with_inputs(inputs.iter());
    let outputs: Vec<TensorIr> = like
        .iter()
        .map(|&i| TensorIr::uninit(client.create_empty_handle(), inputs[i].shape.clone(), inputs[i].dtype))
        .collect();
    let inputs: Vec<TensorIr> = inputs.into_iter().map(|x| x.into_ir()).collect();
    let desc = CustomOpIr::new(name, &inputs, &outputs);
    let op = MixOp::<B> { desc: desc.clone(), backward: like.len() > 1, _backend: PhantomData };
    client.register(streams, OperationIr::Custom(desc), op)
}

impl<B: FusionBackend + GatedMixBackend> GatedMixBackend for Fusion<B> {
    fn gated_mix(branches: [FloatTensor<Self>; 3], gates: FloatTensor<Self>) -> FloatTensor<Self> {
        let [o_0, o_1, o_2] = branches;
        let mut out = register::<B>("nsa_gated_mix", vec![o_0, o_1, o_2, gates], &[0]);
        out.remove(0)
    }

    fn gated_mix_backward(
        branches: [FloatTensor<Self>; 3],
        gates: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> ([FloatTensor<Self>; 3], FloatTensor<Self>) {
        let [o_0, o_1, o_2] = branches;
        let mut out =
            register::<B>("nsa_gated_mix_backward", vec![o_0, o_1, o_2, gates, grad], &[0, 1, 2, 3]).into_iter();
        let mut next = || out.next().expect("the backward registers four outputs");
        ([next(), next(), next()], next())
    }
}
