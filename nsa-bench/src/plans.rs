//! Parity of every plan the device can run for a window or a selection
//! (`nsa_kernels::sparse::plan`'s candidates), each forced through `nsa_kernels::sparse::launch` on the inner
//! `CubeBackend`, against the reference the op's own parity check uses.

use burn::tensor::{DType, TensorData};
use serde::Serialize;

/// One branch's inputs on the host and its reference `[out, dq, dk, dv]`. A build without a GPU
/// backend reads none of it (the CPU has no plans).
#[cfg_attr(not(any(feature = "cuda", feature = "wgpu")), allow(dead_code))]
pub struct PlanCase<'a> {
    pub shape: &'static str,
    pub branch: &'static str,
    /// `q`, `k`, `v`, `dO` as f32 data.
    pub inputs: &'a [TensorData; 4],
    /// A selection's block lists `[1, T, H_kv, n]`; `None` for a window of `window` keys.
    pub blocks: Option<&'a TensorData>,
    /// A window's document starts `[1, T]` (packed documents), or `None`.
    pub starts: Option<&'a TensorData>,
    pub window: usize,
    pub block_size: usize,
    pub dtype: DType,
    pub want: &'a [Vec<f64>; 4],
    pub tolerance: f64,
}

/// One plan's errors (max error over the reference's max magnitude): the forward's `out`, or
/// the backward's `dq`, `dk`, `dv`.
#[derive(Debug, Clone, Serialize)]
pub struct PlanParity {
    pub shape: &'static str,
    pub branch: &'static str,
    pub plan: String,
    pub errors: Vec<f64>,
    pub tolerance: f64,
    pub pass: bool,
}

/// Checks every plan of a case: [`check`] on the GPU backends, nothing elsewhere.
pub type PlanCheck<'a> = &'a dyn Fn(&PlanCase) -> Vec<PlanParity>;

/// Runs every candidate plan of `case` on `device`; the backward plans take the chosen
/// forward's `out` and `lse`.
#[cfg(any(feature = "cuda", feature = "wgpu"))]
pub fn check<R: burn_cubecl::CubeRuntime>(device: &R::Device, case: &PlanCase) -> Vec<PlanParity> {
    use burn::tensor::{Int, Tensor, TensorPrimitive};
    use nsa_kernels::sparse::launch::{backward_with, capabilities, forward_with, problem};
    use nsa_kernels::sparse::plan::{BackwardPlan, ForwardPlan};
    use nsa_kernels::TokenKeys;
    use nsa_train::measure::rel_err;
    type C<R> = burn_cubecl::CubeBackend<R, f32, i32, u8>;
    let load = |data: &TensorData| {
        Tensor::<C<R>, 4>::from_data(data.clone(), device).cast(case.dtype).into_primitive().tensor()
    };
    let [q, k, v, grad_out] = [0, 1, 2, 3].map(|i| load(&case.inputs[i]));
    let blocks = case.blocks.map(|b| Tensor::<C<R>, 4, Int>::from_data(b.clone(), device).into_primitive());
    let starts = case.starts.map(|s| Tensor::<C<R>, 2, Int>::from_data(s.clone(), device).into_primitive());
    let keys: TokenKeys<'_, C<R>> = match &blocks {
        None => TokenKeys::Window { w: case.window, documents: starts.as_ref() },
        Some(blocks) => TokenKeys::Selected { blocks, block_size: case.block_size, index: None },
    };
    let problem = problem(&q, &k, &v, keys);
    let caps = capabilities(&q.client);
    let host = |t| {
        let t = Tensor::<C<R>, 4>::from_primitive(TensorPrimitive::Float(t));
        t.into_data().convert::<f64>().to_vec::<f64>().expect("float data")
    };
    let mut rows = Vec::new();
    let mut row = |plan: String, errors: Vec<f64>| {
        let pass = errors.iter().all(|e| *e <= case.tolerance);
        println!(
            "plan parity {} {} {plan}: {} (tolerance {:.0e}) {}",
            case.shape,
            case.branch,
            errors.iter().map(|e| format!("{e:.1e}")).collect::<Vec<_>>().join(" "),
            case.tolerance,
            if pass { "ok" } else { "FAIL" }
        );
        rows.push(PlanParity { shape: case.shape, branch: case.branch, plan, errors, tolerance: case.tolerance, pass });
    };
    for plan in ForwardPlan::candidates(&problem, &caps) {
        let (out, _) = forward_with(q.clone(), k.clone(), v.clone(), keys, &plan);
        row(format!("forward {plan:?}"), vec![rel_err(&host(out), &case.want[0])]);
    }
    let chosen = ForwardPlan::choose(&problem, &caps);
    let (out, lse) = forward_with(q.clone(), k.clone(), v.clone(), keys, &chosen);
    for plan in BackwardPlan::candidates(&problem, &caps) {
        let grads =
            backward_with(q.clone(), k.clone(), v.clone(), out.clone(), lse.clone(), grad_out.clone(), keys, &plan);
        let errors = [grads.q, grads.k, grads.v].into_iter().zip(&case.want[1..]).map(|(g, w)| rel_err(&host(g), w));
        row(format!("backward {plan:?}"), errors.collect());
    }
    rows
}
