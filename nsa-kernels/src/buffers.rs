//! Several kernel outputs carved from one allocation. CubeCL queues every allocation as a task
//! on its device thread, as it does a launch; where an op launches little work (a decode step's
//! attention at one token per sequence) those tasks are the op's host time.

use burn::tensor::{DType, Shape};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::client::ComputeClient;
use cubecl::server::{MemoryLayout, MemoryLayoutDescriptor};
use cubecl::zspace::metadata::Metadata;

/// Empty contiguous tensors of the given shapes and dtypes, in one buffer (one allocation task).
/// The buffer lives while any of them does.
pub(crate) fn empty_together<R: CubeRuntime, const N: usize>(
    client: &ComputeClient<R>,
    device: &R::Device,
    specs: [(Vec<usize>, DType); N],
) -> [CubeTensor<R>; N] {
    let descriptors =
        specs.iter().map(|(shape, dtype)| MemoryLayoutDescriptor::contiguous(Shape::from(shape.clone()), dtype.size()));
    let layouts = client.empty_tensors(descriptors.collect());
    let mut tensors = specs.into_iter().zip(layouts).map(|((shape, dtype), layout)| {
        let MemoryLayout { memory, strides } = layout;
        CubeTensor::new(client.clone(), memory, Metadata::new(Shape::from(shape), strides), device.clone(), dtype)
    });
    std::array::from_fn(|_| tensors.next().expect("one layout per spec"))
}
