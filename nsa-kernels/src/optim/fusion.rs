//! `Fusion<B>`: the whole optimiser step is one custom operation on the fusion stream, run by
//! the inner backend's kernels when the stream executes.

use std::marker::PhantomData;

use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Device, FloatDType, Shape};
use burn_fusion::stream::{Operation, OperationStreams};
use burn_fusion::{Fusion, FusionBackend, FusionRuntime};
use burn_ir::{CustomOpIr, HandleContainer, OperationIr, TensorIr};

use super::{AdamWHyper, AdamWSlot, AdamWUpdate, FusedAdamWBackend};

/// Inputs per slot: parameter, gradient, both moments. Outputs per slot: parameter, both
/// moments and (with a compute dtype) the compute copy; then the norm.
const INPUTS: usize = 4;

#[derive(Clone, Debug)]
struct AdamWOp<B: FusionBackend> {
    desc: CustomOpIr,
    /// Each slot's `(time, decay)`.
    slots: Vec<(usize, bool)>,
    hyper: AdamWHyper,
    compute: Option<FloatDType>,
    device: Device<B>,
    _backend: PhantomData<B>,
}

impl<B: FusionBackend + FusedAdamWBackend> Operation<B::FusionRuntime> for AdamWOp<B> {
    fn execute(&self, handles: &mut HandleContainer<<B::FusionRuntime as FusionRuntime>::FusionHandle>) {
        let inputs = &self.desc.inputs;
        let slots = self
            .slots
            .iter()
            .enumerate()
            .map(|(i, &(time, decay))| {
                let [param, grad, moment_1, moment_2] =
                    [0, 1, 2, 3].map(|k| handles.get_float_tensor::<B>(&inputs[i * INPUTS + k]));
                AdamWSlot { param, grad, moment_1, moment_2, time, decay }
            })
            .collect();
        let (updates, norm) = B::adamw_step(slots, self.hyper, self.compute, &self.device);
        let mut outputs = self.desc.outputs.iter();
        for update in updates {
            let mut register =
                |t| handles.register_float_tensor::<B>(&outputs.next().expect("an output per tensor").id, t);
            register(update.param);
            register(update.moment_1);
            register(update.moment_2);
            if let Some(c) = update.compute {
                register(c);
            }
        }
        handles.register_float_tensor::<B>(&outputs.next().expect("the norm's output").id, norm);
    }
}

impl<B: FusionBackend + FusedAdamWBackend> FusedAdamWBackend for Fusion<B> {
    fn adamw_step(
        slots: Vec<AdamWSlot<Self>>,
        hyper: AdamWHyper,
        compute: Option<FloatDType>,
        device: &Device<Self>,
    ) -> (Vec<AdamWUpdate<Self>>, FloatTensor<Self>) {
        let client = burn_fusion::get_client::<B>(device);
        let count = slots.len();
        let meta: Vec<(usize, bool)> = slots.iter().map(|s| (s.time, s.decay)).collect();
        let mut out_irs = Vec::new();
        for s in &slots {
            let (shape, dtype) = (s.param.shape.clone(), s.param.dtype);
            let mut declare = |shape: Shape, dtype: DType| {
                out_irs.push(TensorIr::uninit(client.create_empty_handle(), shape, dtype));
            };
            declare(shape.clone(), dtype);
            declare(shape.clone(), dtype);
            declare(shape.clone(), dtype);
            if let Some(c) = compute {
                declare(shape, DType::from(c));
            }
        }
        out_irs.push(TensorIr::uninit(client.create_empty_handle(), Shape::new([1]), DType::F32));
        let tensors: Vec<FloatTensor<Self>> =
            slots.into_iter().flat_map(|s| [s.param, s.grad, s.moment_1, s.moment_2]).collect();
        let streams = OperationStreams::with_inputs(tensors.iter());
        let in_irs: Vec<TensorIr> = tensors.into_iter().map(|t| t.into_ir()).collect();
        let desc = CustomOpIr::new("nsa_adamw", &in_irs, &out_irs);
        let op = AdamWOp::<B> {
            desc: desc.clone(),
            slots: meta,
            hyper,
            compute,
            device: device.clone(),
            _backend: PhantomData,
        };
        let mut outputs = client.register(streams, OperationIr::Custom(desc), op).into_iter();
        let mut next = || outputs.next().expect("an output per tensor");
        let updates = (0..count)
            .map(|_| AdamWUpdate {
                param: next(),
                moment_1: next(),
                moment_2: next(),
                compute: compute.map(|_| next()),
            })
            .collect();
        (updates, next())
    }
}
