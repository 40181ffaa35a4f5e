//! [`SparseAttentionBackend`] for `Fusion<B>` (what `burn::backend::Cuda` and `Wgpu` are with
//! the `fusion` feature): each call is registered as a custom operation on the fusion stream,
//! which runs the inner backend's op when the stream executes. Burn's own fusion does not look
//! inside it; the elementwise work around it still fuses.

use std::marker::PhantomData;

use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{DType, Shape};
use burn_fusion::stream::{Operation, OperationStreams};
use burn_fusion::{Fusion, FusionBackend, FusionRuntime};
use burn_ir::{CustomOpIr, HandleContainer, OperationIr, OperationOutput, TensorIr};

use crate::sparse::api::{Selection, SparseAttentionBackend, SparseAttentionGrads};
use crate::sparse::keys::{BlockIndex, Keys};
use crate::stats_dtype;

/// The key set without its tensors: the document starts, or the block list and its inverted
/// index, when there are any, travel as the op's last inputs.
#[derive(Clone, Copy, Debug)]
enum KeySpec {
    Window { w: usize, documents: bool },
    Compressed { length: usize, stride: usize, documents: bool },
    Selected { block_size: usize, indexed: bool },
}

impl KeySpec {
    fn of<B: burn::tensor::backend::Backend>(keys: &Keys<B>) -> (Self, Vec<IntTensor<B>>) {
        match keys {
            Keys::Window { w, documents } => {
                (KeySpec::Window { w: *w, documents: documents.is_some() }, documents.iter().cloned().collect())
            }
            Keys::Compressed { length, stride, documents } => {
                let spec = KeySpec::Compressed { length: *length, stride: *stride, documents: documents.is_some() };
                (spec, documents.iter().cloned().collect())
            }
            Keys::Selected { blocks, block_size, index } => {
                let mut tensors = vec![blocks.clone()];
                tensors.extend(index.iter().flat_map(|index| index.tensors.iter().cloned()));
                (KeySpec::Selected { block_size: *block_size, indexed: index.is_some() }, tensors)
            }
        }
    }

    /// The inner backend's key set, read from the op's key inputs (`key_inputs`: the document
    /// starts, or the block list, then the index's tensors).
    fn keys<B: FusionBackend>(
        self,
        key_inputs: &[TensorIr],
        handles: &mut HandleContainer<<B::FusionRuntime as FusionRuntime>::FusionHandle>,
    ) -> Keys<B> {
        match self {
            KeySpec::Window { w, documents } => {
                Keys::Window { w, documents: documents.then(|| handles.get_int_tensor::<B>(&key_inputs[0])) }
            }
            KeySpec::Compressed { length, stride, documents } => Keys::Compressed {
                length,
                stride,
                documents: documents.then(|| handles.get_int_tensor::<B>(&key_inputs[0])),
            },
            KeySpec::Selected { block_size, indexed } => {
                let (blocks, index) = key_inputs.split_first().expect("a selection passes its block list");
                let index = indexed.then(|| BlockIndex {
                    tensors: index.iter().map(|tensor| handles.get_int_tensor::<B>(tensor)).collect(),
                });
                Keys::Selected { blocks: handles.get_int_tensor::<B>(blocks), block_size, index }
            }
        }
    }
}

/// Builds the inner backend's inverted block index when the stream runs.
#[derive(Clone, Debug)]
struct BlockIndexOp<B> {
    desc: CustomOpIr,
    block_size: usize,
    _backend: PhantomData<B>,
}

impl<B: FusionBackend + SparseAttentionBackend> Operation<B::FusionRuntime> for BlockIndexOp<B> {
    fn execute(&self, handles: &mut HandleContainer<<B::FusionRuntime as FusionRuntime>::FusionHandle>) {
        let blocks = handles.get_int_tensor::<B>(&self.desc.inputs[0]);
        let index = B::block_index(&blocks, self.block_size).expect("the backend declared an index");
        for (output, tensor) in self.desc.outputs.iter().zip(index.tensors) {
            handles.register_int_tensor::<B>(&output.id, tensor);
        }
    }
}

#[derive(Clone, Debug)]
struct ForwardOp<B> {
    desc: CustomOpIr,
    kind: KeySpec,
    _backend: PhantomData<B>,
}

impl<B: FusionBackend + SparseAttentionBackend> Operation<B::FusionRuntime> for ForwardOp<B> {
    fn execute(&self, handles: &mut HandleContainer<<B::FusionRuntime as FusionRuntime>::FusionHandle>) {
        let inputs = &self.desc.inputs;
        let keys = self.kind.keys::<B>(&inputs[3..], handles);
        let [q, k, v] = [0, 1, 2].map(|i| handles.get_float_tensor::<B>(&inputs[i]));
        let (out, lse) = B::sparse_attention(q, k, v, &keys);
        handles.register_float_tensor::<B>(&self.desc.outputs[0].id, out);
        handles.register_float_tensor::<B>(&self.desc.outputs[1].id, lse);
    }
}

#[derive(Clone, Debug)]
struct BackwardOp<B> {
    desc: CustomOpIr,
    kind: KeySpec,
    _backend: PhantomData<B>,
}

impl<B: FusionBackend + SparseAttentionBackend> Operation<B::FusionRuntime> for BackwardOp<B> {
    fn execute(&self, handles: &mut HandleContainer<<B::FusionRuntime as FusionRuntime>::FusionHandle>) {
        let inputs = &self.desc.inputs;
        let keys = self.kind.keys::<B>(&inputs[6..], handles);
        let [q, k, v, out, lse, grad_out] = [0, 1, 2, 3, 4, 5].map(|i| handles.get_float_tensor::<B>(&inputs[i]));
        let grads = B::sparse_attention_backward(q, k, v, out, lse, grad_out, &keys);
        for (output, grad) in self.desc.outputs.iter().zip([grads.q, grads.k, grads.v]) {
            handles.register_float_tensor::<B>(&output.id, grad);
        }
    }
}

#[derive(Clone, Debug)]
struct SelectBlocksOp<B> {
    desc: CustomOpIr,
    selection: Selection,
    _backend: PhantomData<B>,
}

impl<B: FusionBackend + SparseAttentionBackend> Operation<B::FusionRuntime> for SelectBlocksOp<B> {
    fn execute(&self, handles: &mut HandleContainer<<B::FusionRuntime as FusionRuntime>::FusionHandle>) {
        let [q, k, lse] = [0, 1, 2].map(|i| handles.get_float_tensor::<B>(&self.desc.inputs[i]));
        let documents = self.desc.inputs.get(3).map(|starts| handles.get_int_tensor::<B>(starts));
        let list = B::select_blocks(q, k, lse, self.selection, documents).expect("the backend declared a kernel");
        handles.register_int_tensor::<B>(&self.desc.outputs[0].id, list);
    }
}

impl<B: FusionBackend + SparseAttentionBackend> SparseAttentionBackend for Fusion<B> {
    fn has_fused_sparse_attention() -> bool {
        B::has_fused_sparse_attention()
    }

    fn block_index(blocks: &IntTensor<Self>, block_size: usize) -> Option<BlockIndex<Self>> {
        let shapes = B::block_index_shapes(&blocks.shape, block_size)?;
        let client = blocks.client.clone();
        let streams = OperationStreams::with_inputs([blocks]);
        let outputs: Vec<TensorIr> =
            shapes.into_iter().map(|shape| TensorIr::uninit(client.create_empty_handle(), shape, DType::U32)).collect();
        let desc = CustomOpIr::new("nsa_block_index", &[blocks.clone().into_ir()], &outputs);
        let op = BlockIndexOp::<B> { desc: desc.clone(), block_size, _backend: PhantomData };
        Some(BlockIndex { tensors: client.register(streams, OperationIr::Custom(desc), op) })
    }

    fn block_index_shapes(blocks: &Shape, block_size: usize) -> Option<Vec<Shape>> {
        B::block_index_shapes(blocks, block_size)
    }

    fn select_blocks(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        lse: FloatTensor<Self>,
        selection: Selection,
        documents: Option<IntTensor<Self>>,
    ) -> Option<IntTensor<Self>> {
        if !B::has_fused_sparse_attention() {
            return None;
        }
        let client = q.client.clone();
        let (b, t) = (q.shape[0], q.shape[1]);
        let h_kv = k.shape[2];
        let int = <B::IntElem as burn::tensor::Element>::dtype();
        // The document starts, when given, are the last input.
        let inputs: Vec<_> = [q, k, lse].into_iter().chain(documents).collect();
        let streams = OperationStreams::with_inputs(inputs.iter());
        let list = TensorIr::uninit(client.create_empty_handle(), Shape::new([b, t, h_kv, selection.n]), int);
        let inputs: Vec<TensorIr> = inputs.into_iter().map(|x| x.into_ir()).collect();
        let desc = CustomOpIr::new("nsa_select_blocks", &inputs, &[list]);
        let op = SelectBlocksOp::<B> { desc: desc.clone(), selection, _backend: PhantomData };
        let [list] = client.register(streams, OperationIr::Custom(desc), op).outputs();
        Some(list)
    }

    fn sparse_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        keys: &Keys<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let client = q.client.clone();
        let (b, t, h_q) = (q.shape[0], q.shape[1], q.shape[2]);
        let d_v = v.shape[3];
        let dtype = q.dtype;
        let (kind, key_tensors) = KeySpec::of(keys);
        let mut inputs = vec![q, k, v];
        inputs.extend(key_tensors);
        let streams = OperationStreams::with_inputs(inputs.iter());
        let out = TensorIr::uninit(client.create_empty_handle(), Shape::new([b, t, h_q, d_v]), dtype);
        let lse = TensorIr::uninit(client.create_empty_handle(), Shape::new([b, t, h_q]), lse_dtype::<B>(dtype));
        let inputs: Vec<TensorIr> = inputs.into_iter().map(|x| x.into_ir()).collect();
        let desc = CustomOpIr::new("nsa_sparse_attention", &inputs, &[out, lse]);
        let op = ForwardOp::<B> { desc: desc.clone(), kind, _backend: PhantomData };
        let [out, lse] = client.register(streams, OperationIr::Custom(desc), op).outputs();
        (out, lse)
    }

    fn sparse_attention_backward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        out: FloatTensor<Self>,
        lse: FloatTensor<Self>,
        grad_out: FloatTensor<Self>,
        keys: &Keys<Self>,
    ) -> SparseAttentionGrads<Self> {
        let client = q.client.clone();
        let shapes = [q.shape.clone(), k.shape.clone(), v.shape.clone()];
        let dtype = q.dtype;
        let (kind, key_tensors) = KeySpec::of(keys);
        let mut inputs = vec![q, k, v, out, lse, grad_out];
        inputs.extend(key_tensors);
        let streams = OperationStreams::with_inputs(inputs.iter());
        let outputs = shapes.map(|shape| TensorIr::uninit(client.create_empty_handle(), shape, dtype));
        let inputs: Vec<TensorIr> = inputs.into_iter().map(|x| x.into_ir()).collect();
        let desc = CustomOpIr::new("nsa_sparse_attention_backward", &inputs, &outputs);
        let op = BackwardOp::<B> { desc: desc.clone(), kind, _backend: PhantomData };
        let [q, k, v] = client.register(streams, OperationIr::Custom(desc), op).outputs();
        SparseAttentionGrads { q, k, v }
    }
}

/// The log-sum-exp's dtype as the inner op returns it: f32 from the kernels, the statistics
/// dtype from the reference.
fn lse_dtype<B: SparseAttentionBackend>(storage: DType) -> DType {
    if B::has_fused_sparse_attention() {
        DType::F32
    } else {
        stats_dtype(storage)
    }
}
