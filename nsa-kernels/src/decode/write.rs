//! `CubeBackend`: a step's hand-over from its projection as
//! [`crate::kernel::decode::write::decode_write`], one unit per column of the product. Each cache
//! is written in place when no other tensor shares its buffer (a decode loop hands each step's
//! caches to the next and keeps no other), else into a copy.

use burn_cubecl::element::BoolElement;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{CubeBackend, CubeRuntime, FloatElement, IntElement};
use cubecl::{calculate_cube_count_elemwise, CubeDim};

use super::{DecodeWrite, DecodeWritten, StepLayout};
use crate::buffers::empty_together;
use crate::kernel::decode::write::{decode_write, CacheSlotsLaunch};

/// Launches the hand-over of `step` (see [`DecodeWrite`] for the shapes).
pub(super) fn launch<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement>(
    step: DecodeWrite<CubeBackend<R, F, I, BT>>,
) -> DecodeWritten<CubeBackend<R, F, I, BT>> {
    let DecodeWrite { projected, gate_bias, rotation, positions, caches, layout } = step;
    let StepLayout { heads, kv_heads, d_k, d_v, kv_sets } = layout;
    let projected = into_contiguous(projected);
    let [b, width] = projected.meta.shape().dims::<2>();
    let expected = (heads + kv_sets * kv_heads) * d_k + kv_sets * kv_heads * d_v + 3 * heads;
    assert_eq!(width, expected, "the projection's width does not match the layout {layout:?}");
    let dtype = projected.dtype;
    let caches = caches.map(|pair| pair.map(writable));
    assert!(
        caches.iter().flatten().chain(&rotation).all(|x| x.dtype == dtype) && gate_bias.dtype == dtype,
        "the decode caches, rotation and gate bias must share the projection's dtype ({dtype:?})"
    );
    let client = projected.client.clone();
    let [queries, gates] =
        empty_together(&client, &projected.device, [(vec![b, 1, heads, d_k], dtype), (vec![b, 1, 3, heads], dtype)]);
    let [cos, sin] = rotation.map(|x| into_contiguous(x).into_array_arg());
    let int = positions.dtype;
    let [tail, selected, window] = caches.each_ref().map(|[keys, _]| keys.meta.shape()[2]);
    let [[tail_k, tail_v], [selected_k, selected_v], [window_k, window_v]] =
        caches.clone().map(|pair| pair.map(|x| x.into_array_arg()));
    let dim = CubeDim::new_1d(256);
    decode_write::launch::<R>(
        &client,
        calculate_cube_count_elemwise(&client, b * width, dim),
        dim,
        projected.into_array_arg(),
        into_contiguous(gate_bias).into_array_arg(),
        cos,
        sin,
        into_contiguous(positions).into_array_arg(),
        tail_k,
        tail_v,
        selected_k,
        selected_v,
        window_k,
        window_v,
        queries.clone().into_array_arg(),
        gates.clone().into_array_arg(),
        CacheSlotsLaunch::new(tail, selected, window),
        heads,
        kv_heads,
        d_k,
        d_v,
        kv_sets,
        [dtype.into(), int.into()],
    );
    DecodeWritten { queries, gates, caches }
}

/// `x` itself when it is contiguous and nothing else holds its buffer, else a contiguous copy to
/// write into (the kernel indexes its caches as contiguous arrays).
fn writable<R: CubeRuntime>(x: CubeTensor<R>) -> CubeTensor<R> {
    match (x.is_contiguous(), x.can_mut()) {
        (true, true) => x,
        (true, false) => x.copy(),
        (false, _) => into_contiguous(x),
    }
}
