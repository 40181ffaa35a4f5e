//! Launches the top-n selection kernel ([`crate::kernel::top_n`]) on `CubeBackend`.

use burn::tensor::{DType, Shape};
use burn_cubecl::kernel::{cast, into_contiguous};
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::{calculate_cube_count_elemwise, CubeDim};

use crate::kernel::top_n;

/// `scores [B, H_kv, T, nb]` -> the block lists `[B, T, H_kv, n]` and the 0/1 selection
/// `[B, H_kv, T, nb]`, both of the backend's int dtype `int`.
pub fn select_blocks<R: CubeRuntime>(
    scores: CubeTensor<R>,
    block_size: usize,
    n: usize,
    int: DType,
) -> (CubeTensor<R>, CubeTensor<R>) {
    let scores = into_contiguous(match scores.dtype {
        DType::F32 => scores,
        _ => cast::<R>(scores, DType::F32),
    });
    let [b, h_kv, t, nb] = scores.meta.shape().dims::<4>();
    let (client, device) = (scores.client.clone(), scores.device.clone());
    let empty = |shape: Shape| empty_device_contiguous_dtype::<R>(client.clone(), device.clone(), shape, int);
    let (list, taken) = (empty(Shape::new([b, t, h_kv, n])), empty(Shape::new([b, h_kv, t, nb])));
    let dim = CubeDim::new_1d(128);
    top_n::select_top_n::launch::<R>(
        &client,
        calculate_cube_count_elemwise(&client, b * h_kv * t, dim),
        dim,
        scores.into_tensor_arg(),
        list.clone().into_tensor_arg(),
        taken.clone().into_tensor_arg(),
        u32::try_from(block_size).expect("block size fits in u32"),
        u32::try_from(n).expect("n fits in u32"),
        int.into(),
    );
    (list, taken)
}
