//! `Fusion<B>`: each product is a custom operation on the fusion stream, run by the inner
//! backend when the stream executes (Burn's fusion ends its fused block there, as at any
//! matmul it does not fuse into).

use std::marker::PhantomData;

use burn::tensor::ops::FloatTensor;
use burn::tensor::Shape;
use burn_fusion::stream::{Operation, OperationStreams};
use burn_fusion::{Fusion, FusionBackend, FusionRuntime};
use burn_ir::{CustomOpIr, HandleContainer, OperationIr, OperationOutput, TensorIr};

use super::GemmBackend;

#[derive(Clone, Debug)]
struct GemmOp<B> {
    desc: CustomOpIr,
    transpose_a: bool,
    transpose_b: bool,
    _backend: PhantomData<B>,
}

impl<B: FusionBackend + GemmBackend> Operation<B::FusionRuntime> for GemmOp<B> {
    fn execute(&self, handles: &mut HandleContainer<<B::FusionRuntime as FusionRuntime>::FusionHandle>) {
        let [a, b] = [0, 1].map(|i| handles.get_float_tensor::<B>(&self.desc.inputs[i]));
        let out = B::gemm(a, b, self.transpose_a, self.transpose_b);
        handles.register_float_tensor::<B>(&self.desc.outputs[0].id, out);
    }
}

impl<B: FusionBackend + GemmBackend> GemmBackend for Fusion<B> {
    fn gemm(a: FloatTensor<Self>, b: FloatTensor<Self>, transpose_a: bool, transpose_b: bool) -> FloatTensor<Self> {
        let client = a.client.clone();
        let m = if transpose_a { a.shape[1] } else { a.shape[0] };
        let n = if transpose_b { b.shape[0] } else { b.shape[1] };
        let streams = OperationStreams::with_inputs([&a, &b]);
        let out = TensorIr::uninit(client.create_empty_handle(), Shape::new([m, n]), a.dtype);
        let desc = CustomOpIr::new("nsa_gemm", &[a.into_ir(), b.into_ir()], &[out]);
        let op = GemmOp::<B> { desc: desc.clone(), transpose_a, transpose_b, _backend: PhantomData };
        client.register(streams, OperationIr::Custom(desc), op).output()
    }
}
