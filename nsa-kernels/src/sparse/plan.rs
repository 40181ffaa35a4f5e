//! Which kernels run a window or selection call: the [`Problem`] (shapes, storage type, key
//! set), what the device can do ([`Capabilities`], probed once per call), and one plan per pass.
//! The compressed branch runs as a window over its interleaved rows
//! (`crate::sparse::compressed::interleaved`), so these rules choose its kernels too.
//! [`ForwardPlan::choose`] and [`BackwardPlan::choose`] are the rule table; docs/kernels.md
//! lists it with the reason for each rule. `nsa_kernels::sparse::launch` runs a plan, chosen or forced
//! ([`ForwardPlan::candidates`], [`BackwardPlan::candidates`]: every plan that can run a problem
//! on a device, which the tests and the benchmark's parity check run one by one).
//!
//! Two kernel families:
//! - portable: f32 arithmetic on any device and storage type (WGPU, f32 storage, head dims off
//!   the MMA tile);
//! - tensor-core: CUDA's manual MMA (`mma.sync` m16n8k16 with f32 accumulation) and `ldmatrix`
//!   on f16/bf16, scores and accumulators in registers (flash attention 2's layout); a
//!   selection runs key-major, on the cubes of its inverted block index.

use burn::tensor::DType;

use crate::sparse::tiling::{
    FlashKeyTiling, FlashSelectTiling, FlashTiling, KeyTiling, QueryPass, QueryTiling, SelectionTiling,
};
use crate::sparse::tiling::{Unroll, MMA_SHARED, MMA_TILE};

/// Shared memory a portable cube may use at most, so that several cubes share a streaming
/// multiprocessor.
pub const PORTABLE_SHARED: usize = 48 * 1024;

/// The key set's kind, as far as the plan cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyKind {
    Window { w: usize },
    Selected { block_size: usize },
}

/// One call: `q [batch, seq, heads_q, d_k]`, `k [.., heads_kv, d_k]`, `v [.., heads_kv, d_v]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Problem {
    pub heads_q: usize,
    pub heads_kv: usize,
    pub d_k: usize,
    pub d_v: usize,
    pub dtype: DType,
    pub keys: KeyKind,
}

impl Problem {
    /// Query heads per KV head.
    pub fn group(&self) -> usize {
        self.heads_q / self.heads_kv
    }

    pub fn is_window(&self) -> bool {
        matches!(self.keys, KeyKind::Window { .. })
    }
}

/// What the device offers the plans.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// Manual MMA and `ldmatrix` for f16 / for bf16 on planes of 32 lanes, with buffers aligned
    /// for 16-byte loads (CUDA on sm80 and newer).
    pub tensor_cores_f16: bool,
    pub tensor_cores_bf16: bool,
    /// Shared memory one cube may declare (bytes).
    pub shared_bytes: usize,
    /// f32 elements the device adds to global memory in one atomic operation (4 with sm90's
    /// 16-byte vector atomics); 0 when it adds none.
    pub f32_atomic_width: usize,
    /// Whether the portable kernels unroll their loops ([`Unroll`]): on a GPU; not on WGPU's
    /// CPU adapter (lavapipe), whose compiler takes minutes over unrolled kernels.
    pub unrolls_loops: bool,
}

impl Capabilities {
    /// An H100 (sm90), for the plan table.
    pub const CUDA_SM90: Capabilities = Capabilities {
        tensor_cores_f16: true,
        tensor_cores_bf16: true,
        shared_bytes: 227 * 1024,
        f32_atomic_width: 4,
        unrolls_loops: true,
    };
    /// WGPU as Mesa's lavapipe reports it in CI: no tensor cores, no float atomics.
    pub const WGPU: Capabilities = Capabilities {
        tensor_cores_f16: false,
        tensor_cores_bf16: false,
        shared_bytes: 32 * 1024,
        f32_atomic_width: 0,
        unrolls_loops: false,
    };

    /// Whether the tensor-core kernels can run `problem`: the device has them for its storage
    /// type, and its head dims are whole MMA tiles (so are the strides of the contiguous inputs
    /// the kernels read, as their 16-byte loads need).
    pub fn tensor_cores(&self, problem: &Problem) -> bool {
        let device = match problem.dtype {
            DType::F16 => self.tensor_cores_f16,
            DType::BF16 => self.tensor_cores_bf16,
            _ => false,
        };
        device && problem.d_k.is_multiple_of(MMA_TILE) && problem.d_v.is_multiple_of(MMA_TILE)
    }

    fn atomics(&self) -> bool {
        self.f32_atomic_width > 0
    }

    /// Shared memory of a portable cube.
    fn portable_shared(&self) -> usize {
        self.shared_bytes.min(PORTABLE_SHARED)
    }

    fn unroll(&self) -> Unroll {
        Unroll(self.unrolls_loops)
    }
}

/// The forward pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ForwardPlan {
    /// `kernel::portable::forward` (windows and selections).
    Portable(QueryTiling),
    /// `kernel::window::forward`.
    Window(FlashTiling),
    /// `kernel::selection::partials`, then `merge`.
    Selection(FlashSelectTiling),
}

impl ForwardPlan {
    /// The rule table's forward column:
    /// 1. tensor cores where the device has them for the storage type and the head dims and
    ///    strides are whole MMA tiles: a window's register-resident forward, a selection's
    ///    key-major forward where its block is a multiple of 16 and at most 128 keys (64 at
    ///    wide heads, `d_k + d_v > 128`);
    /// 2. else the portable kernel.
    pub fn choose(problem: &Problem, caps: &Capabilities) -> Self {
        let tensor_core = match problem.keys {
            _ if !caps.tensor_cores(problem) => None,
            KeyKind::Window { .. } => {
                FlashTiling::plan(QueryPass::Forward, problem.group(), problem.d_k, problem.d_v).map(Self::Window)
            }
            KeyKind::Selected { block_size } => {
                let shared = caps.shared_bytes.min(MMA_SHARED);
                FlashSelectTiling::plan(block_size, problem.d_k, problem.d_v, shared).map(Self::Selection)
            }
        };
        tensor_core.unwrap_or_else(|| Self::portable(problem, caps))
    }

    pub fn portable(problem: &Problem, caps: &Capabilities) -> Self {
        let (g, d_k, d_v) = (problem.group(), problem.d_k, problem.d_v);
        let shared = caps.portable_shared();
        Self::Portable(QueryTiling::plan(QueryPass::Forward, problem.is_window(), g, d_k, d_v, shared, caps.unroll()))
    }

    /// Every forward plan that can run `problem` here: the chosen one, and the portable one.
    pub fn candidates(problem: &Problem, caps: &Capabilities) -> Vec<Self> {
        dedup(vec![Self::choose(problem, caps), Self::portable(problem, caps)])
    }
}

/// The backward pass: dQ, then dK and dV (and a selection's sum of segment shares).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackwardPlan {
    /// `kernel::portable::backward`: query cubes write dQ and `delta`, key cubes dK and dV.
    Portable { query: QueryTiling, keys: KeyTiling },
    /// `kernel::key_gradients` for dK and dV, with dQ as `dq` says; dQ sums are added
    /// `atomic_width` f32 at a time.
    TensorCore { dq: DqPlan, keys: FlashKeyTiling, atomic_width: usize },
}

/// Where the tensor-core backward's dQ comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DqPlan {
    /// The key cubes add it by atomics (`FlashKeyTiling::fold_dq`).
    Folded,
    /// `kernel::window::dq`: the forward's query cubes.
    Window(FlashTiling),
    /// `kernel::selection::dq`: key-major, added by atomics.
    Selection(FlashSelectTiling),
}

impl BackwardPlan {
    /// The rule table's backward column:
    /// 1. tensor cores under the forward's conditions (a selection also needs f32 atomics, which
    ///    its dQ is added by): the register-resident key kernel, which folds dQ in at narrow
    ///    heads (`d_k + d_v <= 128`) where the device adds f32 atomically; otherwise dQ is the
    ///    window's query-side kernel or the selection's key-major one;
    /// 2. else the portable kernels.
    pub fn choose(problem: &Problem, caps: &Capabilities) -> Self {
        Self::tensor_core(problem, caps, true).unwrap_or_else(|| Self::portable(problem, caps))
    }

    /// The tensor-core plan, with dQ folded into the key kernel where `fold` allows and the
    /// tiling takes it.
    fn tensor_core(problem: &Problem, caps: &Capabilities, fold: bool) -> Option<Self> {
        if !caps.tensor_cores(problem) {
            return None;
        }
        let (d_k, d_v) = (problem.d_k, problem.d_v);
        let dq = match problem.keys {
            KeyKind::Window { .. } => {
                FlashTiling::plan(QueryPass::Gradient, problem.group(), d_k, d_v).map(DqPlan::Window)
            }
            KeyKind::Selected { block_size } if caps.atomics() => {
                FlashSelectTiling::plan(block_size, d_k, d_v, caps.shared_bytes.min(MMA_SHARED)).map(DqPlan::Selection)
            }
            KeyKind::Selected { .. } => None,
        }?;
        let keys = FlashKeyTiling::plan(problem.is_window(), d_k, d_v, fold && caps.atomics(), caps.shared_bytes)?;
        let dq = if keys.fold_dq { DqPlan::Folded } else { dq };
        Some(Self::TensorCore { dq, keys, atomic_width: caps.f32_atomic_width.max(1) })
    }

    pub fn portable(problem: &Problem, caps: &Capabilities) -> Self {
        let (g, d_k, d_v, shared) = (problem.group(), problem.d_k, problem.d_v, caps.portable_shared());
        Self::Portable {
            query: QueryTiling::plan(QueryPass::Gradient, problem.is_window(), g, d_k, d_v, shared, caps.unroll()),
            keys: KeyTiling::plan(d_k, d_v, shared, caps.unroll()),
        }
    }

    /// Every backward plan that can run `problem` here: the chosen one, the tensor-core one
    /// with a separate dQ pass (what narrow heads run on a device without f32 atomics), and the
    /// portable one.
    pub fn candidates(problem: &Problem, caps: &Capabilities) -> Vec<Self> {
        let unfolded = Self::tensor_core(problem, caps, false);
        dedup(
            [Some(Self::choose(problem, caps)), unfolded, Some(Self::portable(problem, caps))]
                .into_iter()
                .flatten()
                .collect(),
        )
    }
}

/// The block selection (scores and top-n, `crate::sparse::top_n`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SelectionPlan {
    /// `kernel::selection::top_n`: f32 products on any device and storage type.
    Portable(SelectionTiling),
    /// `kernel::selection::top_n_mma`: the products on tensor cores.
    TensorCore(SelectionTiling),
}

impl SelectionPlan {
    /// Tensor cores where the device has them for the storage type and `d_k` is whole MMA
    /// tiles (`problem` names the queries and compressed keys; its `d_v` is `d_k`), else the
    /// portable kernel; an error line when the sequence's block scores fit neither.
    pub fn choose(
        problem: &Problem,
        caps: &Capabilities,
        t: usize,
        block_size: usize,
        n: usize,
    ) -> Result<Self, String> {
        let (g, d_k, shared) = (problem.group(), problem.d_k, caps.shared_bytes);
        if caps.tensor_cores(problem) {
            if let Ok(tiling) = SelectionTiling::plan_tensor_core(t, block_size, n, g, d_k, shared) {
                return Ok(Self::TensorCore(tiling));
            }
        }
        SelectionTiling::plan(t, block_size, n, g, d_k, shared).map(Self::Portable)
    }
}

fn dedup<T: PartialEq>(plans: Vec<T>) -> Vec<T> {
    let mut out = Vec::with_capacity(plans.len());
    for plan in plans {
        if !out.contains(&plan) {
            out.push(plan);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The benchmark's shapes `(name, H_q, H_kv, d_k, d_v)`.
    const SHAPES: [(&str, usize, usize, usize, usize); 4] =
        [("production", 12, 2, 64, 64), ("paper", 64, 4, 128, 128), ("wide", 16, 1, 192, 128), ("mha", 4, 4, 64, 64)];

    fn problem(shape: (&str, usize, usize, usize, usize), keys: KeyKind, dtype: DType) -> Problem {
        let (_, heads_q, heads_kv, d_k, d_v) = shape;
        Problem { heads_q, heads_kv, d_k, d_v, dtype, keys }
    }

    const WINDOW: KeyKind = KeyKind::Window { w: 512 };
    const SELECTED: KeyKind = KeyKind::Selected { block_size: 64 };

    /// What `choose` returns, as `docs/kernels.md`'s table names it.
    fn names(problem: &Problem, caps: &Capabilities) -> (&'static str, &'static str) {
        let forward = match ForwardPlan::choose(problem, caps) {
            ForwardPlan::Portable(_) => "portable",
            ForwardPlan::Window(_) => "window",
            ForwardPlan::Selection(_) => "selection",
        };
        let backward = match BackwardPlan::choose(problem, caps) {
            BackwardPlan::Portable { .. } => "portable",
            BackwardPlan::TensorCore { dq: DqPlan::Folded, .. } => "keys, dQ folded",
            BackwardPlan::TensorCore { dq: DqPlan::Window(_), .. } => "keys + window dQ",
            BackwardPlan::TensorCore { dq: DqPlan::Selection(_), .. } => "keys + selection dQ",
        };
        (forward, backward)
    }

    #[test]
    fn cuda_runs_the_tensor_core_plans_and_folds_dq_at_narrow_heads() {
        let cuda = Capabilities::CUDA_SM90;
        let expected = [
            ("production", ("window", "keys, dQ folded"), ("selection", "keys, dQ folded")),
            ("paper", ("window", "keys + window dQ"), ("selection", "keys + selection dQ")),
            ("wide", ("window", "keys + window dQ"), ("selection", "keys + selection dQ")),
            ("mha", ("window", "keys, dQ folded"), ("selection", "keys, dQ folded")),
        ];
        for (shape, (name, window, selected)) in SHAPES.into_iter().zip(expected) {
            assert_eq!(shape.0, name);
            assert_eq!(names(&problem(shape, WINDOW, DType::BF16), &cuda), window, "{name} window");
            assert_eq!(names(&problem(shape, SELECTED, DType::BF16), &cuda), selected, "{name} selection");
            // f32 storage has no tensor cores.
            for keys in [WINDOW, SELECTED] {
                assert_eq!(names(&problem(shape, keys, DType::F32), &cuda), ("portable", "portable"), "{name} f32");
            }
        }
    }

    #[test]
    fn wgpu_runs_the_portable_plans_everywhere() {
        for shape in SHAPES {
            for keys in [WINDOW, SELECTED] {
                for dtype in [DType::F32, DType::F16, DType::BF16] {
                    let p = problem(shape, keys, dtype);
                    assert_eq!(names(&p, &Capabilities::WGPU), ("portable", "portable"), "{p:?}");
                    assert_eq!(ForwardPlan::candidates(&p, &Capabilities::WGPU).len(), 1);
                    assert_eq!(BackwardPlan::candidates(&p, &Capabilities::WGPU).len(), 1);
                }
            }
        }
    }

    #[test]
    fn off_tile_shapes_and_long_blocks_fall_back_to_the_portable_kernels() {
        let cuda = Capabilities::CUDA_SM90;
        let odd = Problem { d_k: 72, ..problem(SHAPES[0], WINDOW, DType::BF16) };
        assert_eq!(names(&odd, &cuda), ("portable", "portable"));
        let odd_values = Problem { d_v: 40, ..problem(SHAPES[0], SELECTED, DType::BF16) };
        assert_eq!(names(&odd_values, &cuda), ("portable", "portable"));
        // Blocks longer than a lane's registers allow: 128 keys at wide heads.
        let long = problem(SHAPES[1], KeyKind::Selected { block_size: 128 }, DType::BF16);
        assert_eq!(names(&long, &cuda), ("portable", "portable"));
        // A selection's tensor-core backward adds dQ by atomics; without them it is portable.
        let no_atomics = Capabilities { f32_atomic_width: 0, ..cuda };
        let sel = problem(SHAPES[0], SELECTED, DType::BF16);
        assert_eq!(names(&sel, &no_atomics), ("selection", "portable"));
        let win = problem(SHAPES[0], WINDOW, DType::BF16);
        assert_eq!(names(&win, &no_atomics), ("window", "keys + window dQ"));
    }

    #[test]
    fn the_selection_runs_on_tensor_cores_where_the_window_does() {
        let choose = |dtype, caps: &Capabilities, t| {
            let p = problem(SHAPES[0], SELECTED, dtype);
            SelectionPlan::choose(&Problem { d_v: p.d_k, ..p }, caps, t, 64, 16).unwrap()
        };
        assert!(
            matches!(choose(DType::BF16, &Capabilities::CUDA_SM90, 65_536), SelectionPlan::TensorCore(t) if t.rows == 8)
        );
        assert!(
            matches!(choose(DType::BF16, &Capabilities::CUDA_SM90, 131_072), SelectionPlan::TensorCore(t) if t.rows == 4)
        );
        assert!(matches!(choose(DType::F32, &Capabilities::CUDA_SM90, 4096), SelectionPlan::Portable(_)));
        let wgpu = Capabilities { shared_bytes: 64 * 1024, ..Capabilities::WGPU };
        assert!(matches!(choose(DType::BF16, &wgpu, 4096), SelectionPlan::Portable(_)));
    }

    #[test]
    fn candidates_cover_every_runnable_plan_once() {
        let cuda = Capabilities::CUDA_SM90;
        let win = problem(SHAPES[0], WINDOW, DType::BF16);
        let backward = BackwardPlan::candidates(&win, &cuda);
        assert_eq!(backward.len(), 3, "{backward:?}");
        assert!(matches!(backward[1], BackwardPlan::TensorCore { dq: DqPlan::Window(_), keys, .. } if !keys.fold_dq));
        assert_eq!(ForwardPlan::candidates(&win, &cuda).len(), 2);
        // The paper's heads never fold: the chosen plan is the unfolded one.
        let paper = problem(SHAPES[1], SELECTED, DType::BF16);
        assert_eq!(BackwardPlan::candidates(&paper, &cuda).len(), 2);
    }
}
