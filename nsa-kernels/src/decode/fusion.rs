//! `Fusion<B>`: the step as one custom operation on the fusion stream, which runs the inner
//! backend's kernel when the stream executes.

use std::marker::PhantomData;

use burn::tensor::ops::FloatTensor;
use burn::tensor::Shape;
use burn_fusion::stream::{Operation, OperationStreams};
use burn_fusion::{Fusion, FusionBackend, FusionRuntime};
use burn_ir::{CustomOpIr, HandleContainer, OperationIr, OperationOutput, TensorIr};

use super::{
    DecodeAttentionBackend, DecodeBranches, DecodeStep, DecodeWrite, DecodeWritten, StepInput, StepLayout, StepLinear,
};
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

#[derive(Clone, Debug)]
struct WriteOp<B> {
    desc: CustomOpIr,
    layout: StepLayout,
    _backend: PhantomData<B>,
}

impl<B: FusionBackend + DecodeAttentionBackend> Operation<B::FusionRuntime> for WriteOp<B> {
    fn execute(&self, handles: &mut HandleContainer<<B::FusionRuntime as FusionRuntime>::FusionHandle>) {
        let inputs = &self.desc.inputs;
        let float = |i: usize, handles: &mut HandleContainer<_>| handles.get_float_tensor::<B>(&inputs[i]);
        let step = DecodeWrite {
            projected: float(0, handles),
            gate_bias: float(1, handles),
            rotation: [float(2, handles), float(3, handles)],
            positions: handles.get_int_tensor::<B>(&inputs[4]),
            caches: [5, 7, 9].map(|i| [float(i, handles), float(i + 1, handles)]),
            layout: self.layout,
        };
        let DecodeWritten { queries, gates, caches } = B::decode_write(step).expect("the backend declared a kernel");
        let outputs = &self.desc.outputs;
        for (output, tensor) in outputs.iter().zip([queries, gates].into_iter().chain(caches.into_iter().flatten())) {
            handles.register_float_tensor::<B>(&output.id, tensor);
        }
    }
}

#[derive(Clone, Debug)]
struct LinearOp<B> {
    desc: CustomOpIr,
    /// The input function; its tensors (a norm's gain, a mix's branches and gates) are the
    /// op's inputs after the weight.
    input: StepInput<()>,
    residual: bool,
    _backend: PhantomData<B>,
}

impl<B: FusionBackend + DecodeAttentionBackend> Operation<B::FusionRuntime> for LinearOp<B> {
    fn execute(&self, handles: &mut HandleContainer<<B::FusionRuntime as FusionRuntime>::FusionHandle>) {
        let mut inputs =
            self.desc.inputs.iter().map(|x| handles.get_float_tensor::<B>(x)).collect::<Vec<_>>().into_iter();
        let (x, weight) = (inputs.next().expect("an input"), inputs.next().expect("a weight"));
        let input = self.input.clone().map(|()| inputs.next().expect("the input function's tensors"));
        let residual = self.residual.then(|| inputs.next().expect("the residual"));
        let out = B::decode_linear(StepLinear { x, input, weight, residual });
        handles.register_float_tensor::<B>(&self.desc.outputs[0].id, out);
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

    fn decode_write(step: DecodeWrite<Self>) -> Option<DecodeWritten<Self>> {
        if !B::has_decode_kernel() {
            return None;
        }
        let DecodeWrite { projected, gate_bias, rotation, positions, caches, layout } = step;
        let client = projected.client.clone();
        let (b, dtype) = (projected.shape[0], projected.dtype);
        let [cos, sin] = rotation;
        let mut inputs = vec![projected, gate_bias, cos, sin, positions];
        inputs.extend(caches.into_iter().flatten());
        let streams = OperationStreams::with_inputs(inputs.iter());
        let new = |dims: [usize; 4]| TensorIr::uninit(client.create_empty_handle(), Shape::new(dims), dtype);
        let mut outputs = vec![new([b, 1, layout.heads, layout.d_k]), new([b, 1, 3, layout.heads])];
        outputs.extend(
            inputs[5..]
                .iter()
                .map(|cache| TensorIr::uninit(client.create_empty_handle(), cache.shape.clone(), cache.dtype)),
        );
        let inputs: Vec<TensorIr> = inputs.into_iter().map(|x| x.into_ir()).collect();
        let desc = CustomOpIr::new("nsa_decode_write", &inputs, &outputs);
        let op = WriteOp::<B> { desc: desc.clone(), layout, _backend: PhantomData };
        let [queries, gates, tail_k, tail_v, selected_k, selected_v, window_k, window_v] =
            client.register(streams, OperationIr::Custom(desc), op).outputs();
        let caches = [[tail_k, tail_v], [selected_k, selected_v], [window_k, window_v]];
        Some(DecodeWritten { queries, gates, caches })
    }

    fn decode_linear(step: StepLinear<Self>) -> FloatTensor<Self> {
        let StepLinear { x, input, weight, residual } = step;
        let client = x.client.clone();
        let shape = Shape::new([x.shape[0], weight.shape[1]]);
        let (dtype, has_residual) = (x.dtype, residual.is_some());
        let mut inputs = vec![x, weight];
        let input = input.map(|gamma| inputs.push(gamma));
        inputs.extend(residual);
        let streams = OperationStreams::with_inputs(inputs.iter());
        let output = TensorIr::uninit(client.create_empty_handle(), shape, dtype);
        let inputs: Vec<TensorIr> = inputs.into_iter().map(|x| x.into_ir()).collect();
        let desc = CustomOpIr::new("nsa_decode_linear", &inputs, &[output]);
        let op = LinearOp::<B> { desc: desc.clone(), input, residual: has_residual, _backend: PhantomData };
        let [out] = client.register(streams, OperationIr::Custom(desc), op).outputs();
        out
    }
}
