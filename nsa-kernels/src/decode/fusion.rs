//! `Fusion<B>`: the step as one custom operation on the fusion stream, which runs the inner
//! backend's kernel when the stream executes.

use std::marker::PhantomData;

use burn::tensor::Shape;
use burn_fusion::stream::{Operation, OperationStreams};
use burn_fusion::{Fusion, FusionBackend, FusionRuntime};
use burn_ir::{CustomOpIr, HandleContainer, OperationIr, OperationOutput, TensorIr};

use super::{DecodeAttentionBackend, DecodeBranches, DecodeStep};
use crate::sparse::Selection;

#[derive(Clone, Debug)]
struct DecodeOp<B> {
    desc: CustomOpIr,
    selection: Selection,
    _backend: PhantomData<B>,
}

impl<B: FusionBackend + DecodeAttentionBackend> Operation<B::FusionRuntime> for DecodeOp<B> {
    fn execute(&self, handles: &mut HandleContainer<<B::FusionRuntime as FusionRuntime>::FusionHandle>) {
        let inputs = &self.desc.inputs;
        let floats: Vec<_> = inputs[..7].iter().map(|x| handles.get_float_tensor::<B>(x)).collect();
        let [q, compressed_k, compressed_v, selected_k, selected_v, window_k, window_v] =
            <[_; 7]>::try_from(floats).expect("the op registers seven float inputs");
        let step = DecodeStep {
            q,
            compressed: [compressed_k, compressed_v],
            selected: [selected_k, selected_v],
            window: [window_k, window_v],
            positions: handles.get_int_tensor::<B>(&inputs[7]),
            selection: self.selection,
        };
        let DecodeBranches { outputs, blocks } = B::decode_attention(step).expect("the backend declared a kernel");
        for (output, tensor) in self.desc.outputs.iter().zip(outputs) {
            handles.register_float_tensor::<B>(&output.id, tensor);
        }
        handles.register_int_tensor::<B>(&self.desc.outputs[3].id, blocks);
    }
}

impl<B: FusionBackend + DecodeAttentionBackend> DecodeAttentionBackend for Fusion<B> {
    fn has_decode_kernel() -> bool {
        B::has_decode_kernel()
    }

    fn decode_attention(step: DecodeStep<Self>) -> Option<DecodeBranches<Self>> {
        if !B::has_decode_kernel() {
            return None;
        }
        let DecodeStep { q, compressed, selected, window, positions, selection } = step;
        let client = q.client.clone();
        let (b, h_q, dtype) = (q.shape[0], q.shape[2], q.dtype);
        let (h_kv, d_v) = (selected[1].shape[1], selected[1].shape[3]);
        let int = positions.dtype;
        let mut inputs = vec![q];
        inputs.extend(compressed.into_iter().chain(selected).chain(window));
        inputs.push(positions);
        let streams = OperationStreams::with_inputs(inputs.iter());
        let output = || TensorIr::uninit(client.create_empty_handle(), Shape::new([b, 1, h_q, d_v]), dtype);
        let blocks = TensorIr::uninit(client.create_empty_handle(), Shape::new([b, 1, h_kv, selection.n]), int);
        let inputs: Vec<TensorIr> = inputs.into_iter().map(|x| x.into_ir()).collect();
        let desc = CustomOpIr::new("nsa_decode_step", &inputs, &[output(), output(), output(), blocks]);
        let op = DecodeOp::<B> { desc: desc.clone(), selection, _backend: PhantomData };
        let [o_compressed, o_selected, o_window, blocks] =
            client.register(streams, OperationIr::Custom(desc), op).outputs();
        Some(DecodeBranches { outputs: [o_compressed, o_selected, o_window], blocks })
    }
}
