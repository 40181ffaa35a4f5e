//! `Fusion<B>`: RMSNorm and its backward as custom operations on the fusion stream.

use std::marker::PhantomData;

use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Shape};
use burn_fusion::stream::{Operation, OperationStreams};
use burn_fusion::{Fusion, FusionBackend, FusionRuntime};
use burn_ir::{CustomOpIr, HandleContainer, OperationIr, TensorIr};

use super::RmsNormBackend;
use crate::stats_dtype;

#[derive(Clone, Debug)]
struct NormOp<B> {
    desc: CustomOpIr,
    /// `None` for the backward.
    epsilon: Option<f64>,
    _backend: PhantomData<B>,
}

impl<B: FusionBackend + RmsNormBackend> Operation<B::FusionRuntime> for NormOp<B> {
    fn execute(&self, handles: &mut HandleContainer<<B::FusionRuntime as FusionRuntime>::FusionHandle>) {
        let inputs: Vec<FloatTensor<B>> = self.desc.inputs.iter().map(|x| handles.get_float_tensor::<B>(x)).collect();
        let (first, second) = match self.epsilon {
            Some(epsilon) => B::rms_norm(inputs[0].clone(), inputs[1].clone(), epsilon),
            None => B::rms_norm_backward(inputs[0].clone(), inputs[1].clone(), inputs[2].clone(), inputs[3].clone()),
        };
        handles.register_float_tensor::<B>(&self.desc.outputs[0].id, first);
        handles.register_float_tensor::<B>(&self.desc.outputs[1].id, second);
    }
}

/// Registers the op over `inputs` with two outputs of the given shapes and dtypes.
fn register<B: FusionBackend + RmsNormBackend>(
    name: &'static str,
    inputs: Vec<FloatTensor<Fusion<B>>>,
    outputs: [(Shape, DType); 2],
    epsilon: Option<f64>,
) -> (FloatTensor<Fusion<B>>, FloatTensor<Fusion<B>>) {
    let client = inputs[0].client.clone();
    let streams = OperationStreams::with_inputs(inputs.iter());
    let outputs = outputs.map(|(shape, dtype)| TensorIr::uninit(client.create_empty_handle(), shape, dtype));
    let inputs: Vec<TensorIr> = inputs.into_iter().map(|x| x.into_ir()).collect();
    let desc = CustomOpIr::new(name, &inputs, &outputs);
    let op = NormOp::<B> { desc: desc.clone(), epsilon, _backend: PhantomData };
    let [first, second] = client.register(streams, OperationIr::Custom(desc), op).try_into().expect("two outputs");
    (first, second)
}

impl<B: FusionBackend + RmsNormBackend> RmsNormBackend for Fusion<B> {
    fn rms_norm(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        epsilon: f64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let rows = x.shape[0];
        // The kernels' statistics are f32; the tensor-op default's follow the input.
        let stats = match B::has_rms_norm_kernels() {
            true => DType::F32,
            false => stats_dtype(x.dtype),
        };
        let outputs = [(x.shape.clone(), x.dtype), (Shape::new([rows]), stats)];
        register::<B>("nsa_rms_norm", vec![x, gamma], outputs, Some(epsilon))
    }

    fn rms_norm_backward(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        rstd: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let outputs = [(x.shape.clone(), x.dtype), (gamma.shape.clone(), gamma.dtype)];
        register::<B>("nsa_rms_norm_backward", vec![x, gamma, rstd, grad], outputs, None)
    }

    fn has_rms_norm_kernels() -> bool {
        B::has_rms_norm_kernels()
    }
}
