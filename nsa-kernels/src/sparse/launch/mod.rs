//! Running a [`crate::sparse::plan`] on `CubeBackend` (CUDA, WGPU): the operands of one call
//! ([`Operands`]), the device's [`Capabilities`], and one launcher per plan ([`forward`],
//! [`backward`]). `cube.rs` chooses the plans; tests and benchmarks may force any of a problem's
//! candidates through [`forward_with`] and [`backward_with`].
//!
//! # Unchecked launches
//!
//! The tensor-core kernels (CUDA only) launch without CubeCL's bounds checks on global reads and
//! writes: each bounds every global access itself (rows past the tensor are clamped to the last
//! row or masked, stores test their row), and compute-sanitizer's memcheck runs clean over them
//! unchecked (`bench/memcheck.sh`). The selection partials stay checked at wide heads (see
//! [`forward`]).

pub mod backward;
pub mod forward;
pub(crate) mod index;

use burn::tensor::{DType, Shape};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{element::BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use cubecl::features::{AtomicUsage, MmaConfig, Plane};
use cubecl::ir::{FloatKind, StorageType, Type};
use cubecl::prelude::*;
use cubecl::{calculate_cube_count_elemwise, CubeDim};

use crate::sparse::api::SparseAttentionGrads;
use crate::sparse::keys::TokenKeys;
use crate::sparse::plan::{BackwardPlan, Capabilities, ForwardPlan, KeyKind, Problem};
use index::{InvertedIndex, UNITS_PER_CUBE};

/// Byte alignment the tensor-core kernels' global loads need of every buffer.
const ALIGN: u64 = 32;

/// A window or selection call's forward under `plan` (one of [`ForwardPlan::candidates`]):
/// `(out, lse)`.
pub fn forward_with<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement>(
    q: CubeTensor<R>,
    k: CubeTensor<R>,
    v: CubeTensor<R>,
    keys: TokenKeys<'_, CubeBackend<R, F, I, BT>>,
    plan: &ForwardPlan,
) -> (CubeTensor<R>, CubeTensor<R>) {
    forward::run(&Operands::new(q, k, v, keys, I::dtype()), plan)
}

/// The backward under `plan` (one of [`BackwardPlan::candidates`]).
#[allow(clippy::too_many_arguments)]
pub fn backward_with<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement>(
    q: CubeTensor<R>,
    k: CubeTensor<R>,
    v: CubeTensor<R>,
    out: CubeTensor<R>,
    lse: CubeTensor<R>,
    grad_out: CubeTensor<R>,
    keys: TokenKeys<'_, CubeBackend<R, F, I, BT>>,
    plan: &BackwardPlan,
) -> SparseAttentionGrads<CubeBackend<R, F, I, BT>> {
    let [q, k, v] = backward::run(&Operands::new(q, k, v, keys, I::dtype()), out, lse, grad_out, plan);
    SparseAttentionGrads { q, k, v }
}

/// The problem of a window or selection call on these tensors (`q`, `k`, `v` as passed).
pub fn problem<R: CubeRuntime, B: burn::tensor::backend::Backend>(
    q: &CubeTensor<R>,
    k: &CubeTensor<R>,
    v: &CubeTensor<R>,
    keys: TokenKeys<'_, B>,
) -> Problem {
    let [_, _, heads_q, d_k] = q.meta.shape().dims::<4>();
    let heads_kv = k.meta.shape()[2];
    let d_v = v.meta.shape()[3];
    let keys = match keys {
        TokenKeys::Window { w, .. } => KeyKind::Window { w },
        TokenKeys::Selected { block_size, .. } => KeyKind::Selected { block_size },
    };
    Problem { heads_q, heads_kv, d_k, d_v, dtype: q.dtype, keys }
}

/// What this device offers the plans.
pub fn capabilities<R: CubeRuntime>(client: &ComputeClient<R>) -> Capabilities {
    let props = client.properties();
    let planes_of_32 = planes_of_32(client);
    let aligned = props.memory.alignment.is_multiple_of(ALIGN);
    let manual_mma = |dtype: DType| {
        let config =
            MmaConfig { a_type: dtype.into(), b_type: dtype.into(), cd_type: DType::F32.into(), m: 16, n: 8, k: 16 };
        let storage: StorageType = dtype.into();
        let matmul = &props.features.matmul;
        planes_of_32 && aligned && matmul.mma.contains(&config) && matmul.ldmatrix.contains(&storage)
    };
    let f32_atomic_width = [4, 2, 1]
        .into_iter()
        .find(|&width| {
            let atomic = Type::new(StorageType::Atomic(FloatKind::F32.into())).with_vector_size(width);
            props.atomic_type_usage(atomic).contains(AtomicUsage::Add)
        })
        .unwrap_or(0);
    Capabilities {
        tensor_cores_f16: manual_mma(DType::F16),
        tensor_cores_bf16: manual_mma(DType::BF16),
        shared_bytes: props.hardware.max_shared_memory_size,
        f32_atomic_width,
        // cubecl-wgpu withholds plane operations from a CPU adapter: the one sign of lavapipe
        // it gives. (A GPU without them loses only the unrolling, which its compiler may do.)
        unrolls_loops: props.features.plane.contains(Plane::Ops),
    }
}

/// Whether the device's planes are exactly 32 units wide, on every kernel (what the tensor-core
/// fragments and the plane-shuffle exchanges assume).
pub(crate) fn planes_of_32<R: CubeRuntime>(client: &ComputeClient<R>) -> bool {
    let hardware = &client.properties().hardware;
    hardware.plane_size_min == 32 && hardware.plane_size_max == 32
}

/// One call's inputs made contiguous, with the launch parameters they imply.
pub(crate) struct Operands<R: CubeRuntime> {
    pub q: CubeTensor<R>,
    pub k: CubeTensor<R>,
    pub v: CubeTensor<R>,
    /// `[B, T, H_kv, n]`, or a 1-element placeholder for a window.
    pub blocks: CubeTensor<R>,
    /// The inverted index the key set carries, if any.
    pub index: Option<InvertedIndex<R>>,
    /// A window's document starts `[B, T]` (packed rows), or a 1-element placeholder.
    pub starts: CubeTensor<R>,
    pub documents: bool,
    pub window: bool,
    /// The window's width or the selection's block size.
    pub span: u32,
    pub scale: f32,
    pub d_k: usize,
    pub d_v: usize,
}

impl<R: CubeRuntime> Operands<R> {
    pub fn new<B: burn::tensor::backend::Backend<IntTensorPrimitive = CubeTensor<R>>>(
        q: CubeTensor<R>,
        k: CubeTensor<R>,
        v: CubeTensor<R>,
        keys: TokenKeys<'_, B>,
        int_dtype: DType,
    ) -> Self {
        check_shapes(&q, &k, &v);
        let (q, k, v) = (into_contiguous(q), into_contiguous(k), into_contiguous(v));
        let d_k = q.meta.shape()[3];
        let d_v = v.meta.shape()[3];
        // Never read (what they stand for is compile-time in the kernels), so not filled: a fill
        // is a launch of its own.
        let placeholder =
            |shape: Shape| empty_device_contiguous_dtype::<R>(q.client.clone(), q.device.clone(), shape, int_dtype);
        let (blocks, index, window, span, documents) = match keys {
            TokenKeys::Window { w, documents } => (placeholder(Shape::new([1, 1, 1, 1])), None, true, w, documents),
            TokenKeys::Selected { blocks, block_size, index } => {
                let index = index.map(|index| InvertedIndex::from_tensors(index.tensors.clone()));
                (into_contiguous(blocks.clone()), index, false, block_size, None)
            }
        };
        let starts =
            documents.map_or_else(|| placeholder(Shape::new([1, 1])), |starts| into_contiguous(starts.clone()));
        let span = u32::try_from(span).expect("window or block size fits in u32");
        let documents = documents.is_some();
        let scale = 1.0 / (d_k as f32).sqrt();
        Operands { q, k, v, blocks, index, starts, documents, window, span, scale, d_k, d_v }
    }

    pub fn client(&self) -> ComputeClient<R> {
        self.q.client.clone()
    }

    /// `[B, T, H_q, H_kv]`.
    pub fn dims(&self) -> [usize; 4] {
        let [b, t, h_q, _] = self.q.meta.shape().dims::<4>();
        [b, t, h_q, self.k.meta.shape()[2]]
    }

    /// Query heads per KV head (`g`): the tilings' and grids' input, and a compile-time
    /// argument of the key-side kernels.
    pub fn group(&self) -> usize {
        self.q.meta.shape()[2] / self.k.meta.shape()[2]
    }

    /// Every tensor the op allocates is contiguous. CubeCL's default allocation on CUDA is
    /// pitched (rows padded to a power of two), and the index kernels address their rows with
    /// plain `row * width + i`, which a padded row would break for every KV head after the
    /// first.
    pub fn empty(&self, shape: Shape, dtype: DType) -> CubeTensor<R> {
        empty_device_contiguous_dtype::<R>(self.client(), self.q.device.clone(), shape, dtype)
    }

    /// `cubes` cubes of `planes` planes of 32 units (the tensor-core kernels).
    pub fn plane_grid(&self, cubes: usize, planes: usize) -> (CubeCount, CubeDim) {
        let dim = CubeDim::new_2d(32, planes as u32);
        (calculate_cube_count_elemwise(&self.client(), cubes * dim.num_elems() as usize, dim), dim)
    }

    /// `cubes` cubes of `units` units, spread over the grid's dimensions (a 1-d grid is capped
    /// at 65535 cubes on some devices); kernels number them by `CUBE_POS` and skip the surplus.
    pub fn grid(&self, cubes: usize, units: usize) -> (CubeCount, CubeDim) {
        let dim = CubeDim::new_1d(units as u32);
        (calculate_cube_count_elemwise(&self.client(), cubes * units, dim), dim)
    }

    /// One unit per element of `units`, in cubes of [`UNITS_PER_CUBE`].
    pub fn elementwise(&self, units: usize) -> (CubeCount, CubeDim) {
        self.grid(units.div_ceil(UNITS_PER_CUBE as usize), UNITS_PER_CUBE as usize)
    }

    /// Query cubes of `queries` consecutive positions of one KV head.
    pub fn query_cubes(&self, queries: usize) -> usize {
        let [b, t, _, h_kv] = self.dims();
        b * h_kv * t.div_ceil(queries)
    }

    /// Key cubes of `keys` keys: window tiles, or sub-tiles of the selection's segments.
    pub fn key_cubes(&self, keys: usize, index: &InvertedIndex<R>) -> usize {
        let [b, t, _, h_kv] = self.dims();
        let span = self.span as usize;
        let tiles =
            if self.window { t.div_ceil(keys) } else { index.segment_block.meta.shape()[2] * span.div_ceil(keys) };
        b * h_kv * tiles
    }

    /// The selection's inverted block index: the one its key set carries, else built here.
    pub fn inverted_index(&self) -> InvertedIndex<R> {
        match (&self.index, self.window) {
            (Some(index), _) => index.clone(),
            (None, true) => InvertedIndex::placeholder(&self.client(), &self.q.device),
            (None, false) => InvertedIndex::build(&self.blocks, self.span as usize),
        }
    }
}

/// Shapes the kernels rely on; a mismatch is a caller bug, reported before any launch.
fn check_shapes<R: CubeRuntime>(q: &CubeTensor<R>, k: &CubeTensor<R>, v: &CubeTensor<R>) {
    let (qs, ks, vs) = (q.meta.shape(), k.meta.shape(), v.meta.shape());
    assert!(
        qs.num_dims() == 4 && ks.num_dims() == 4 && vs.num_dims() == 4,
        "sparse attention takes [B, T, H, d] tensors"
    );
    assert!(qs[0] == ks[0] && qs[1] == ks[1] && ks[..3] == vs[..3], "q, k, v disagree on batch, length or heads");
    assert!(qs[3] == ks[3], "q and k head dims differ");
    assert!(ks[2] > 0 && qs[2] % ks[2] == 0, "query heads must be a multiple of KV heads");
}
