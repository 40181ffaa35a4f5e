//! `op(A) op(B)` in cuBLASLt, in CubeCL's work order without a host sync.
//!
//! CubeCL does not hand out the CUDA stream it launches on, so the product is ordered against
//! it through the context. The product is a task on CubeCL's device thread, queued behind the
//! launches before it without waiting for them (a blocking call would stall Burn's fusion
//! thread, and with it the thread that records the step); there the operands'
//! device pointers are known, an event recorded on the whole (primary) context captures the
//! work before, our stream waits for it, runs the product, and the context waits for our
//! stream before any later work (`cuCtxRecordEvent` / `cuCtxWaitEvent`, CUDA 12.5+ drivers).
//! The device never idles for the host, and the host never waits for the device.
//!
//! Row-major matrices are column-major ones transposed, so `C = op(A) op(B)` (row-major) is
//! computed as `C^T = op(B)^T op(A)^T` (column-major) with the operands swapped.
//!
//! Where the library or the driver entry points are missing, [`available`] says so once and
//! the caller keeps Burn's matmul.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Mutex, OnceLock};

use burn::tensor::{DType, Shape};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::cuda::CudaRuntime;
use cubecl::server::{Binding, ComputeServer};
use cubecl::Runtime;
use cubecl_common::device::Device;
use cubecl_common::device_handle::DeviceHandle;
use cubecl_common::stream_id::StreamId;
use cudarc::cublaslt::{result as lt, sys as ltsys};
use cudarc::driver::{result as drv, sys as dsys};

/// Workspace cuBLASLt may use per product (what cudarc's own wrapper gives Hopper).
const WORKSPACE_BYTES: usize = 32 << 20;

/// A product's shape and types: what its descriptors and chosen algorithm depend on.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
struct GemmShape {
    m: usize,
    n: usize,
    k: usize,
    transpose_a: bool,
    transpose_b: bool,
    /// Products in one call, their matrices `m k`, `k n`, `m n` elements apart.
    batch: usize,
    dtype: DType,
    out_dtype: DType,
    /// The largest power of two up to 256 that divides every operand's address: cuBLASLt picks
    /// among the algorithms that need no more.
    alignment: u64,
}

/// Descriptors and the heuristic's algorithm for one [`GemmShape`], made once.
struct Plan {
    desc: ltsys::cublasLtMatmulDesc_t,
    a: ltsys::cublasLtMatrixLayout_t,
    b: ltsys::cublasLtMatrixLayout_t,
    c: ltsys::cublasLtMatrixLayout_t,
    algo: ltsys::cublasLtMatmulAlgo_t,
}

/// The library's state for one device: its handle, our stream, the two ordering events.
struct Library {
    handle: ltsys::cublasLtHandle_t,
    ctx: dsys::CUcontext,
    stream: dsys::CUstream,
    before: dsys::CUevent,
    after: dsys::CUevent,
    plans: HashMap<GemmShape, Plan>,
    /// The products' workspace, allocated once outside CubeCL's pool and held (only our stream
    /// uses it, one product after another), with its address.
    workspace: Option<u64>,
}

// SAFETY: the raw handles are only used under the `Mutex` around `Library`, one thread at a
// time, and none is tied to the thread that made it (the context is made current per call).
unsafe impl Send for Library {}

/// One library per device (each holds that device's context, stream and workspace), made on
/// first use and kept for the process.
static LIBRARIES: OnceLock<Mutex<HashMap<usize, Option<&'static Mutex<Library>>>>> = OnceLock::new();

/// Whether products run in cuBLASLt on `device`'s context (the first call sets it up, and says
/// once why not when it cannot).
pub fn available(device_index: usize) -> bool {
    library(device_index).is_some()
}

fn library(device_index: usize) -> Option<&'static Mutex<Library>> {
    let mut libraries = LIBRARIES.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    *libraries.entry(device_index).or_insert_with(|| match unsafe { Library::new(device_index) } {
        Ok(lib) => Some(&*Box::leak(Box::new(Mutex::new(lib)))),
        Err(why) => {
            eprintln!("note: linear layers on CUDA device {device_index} use Burn's matmul, not cuBLASLt ({why})");
            None
        }
    })
}

impl Library {
    unsafe fn new(device_index: usize) -> Result<Self, String> {
        if !ltsys::is_culib_present() {
            return Err("libcublasLt was not found".into());
        }
        drv::init().map_err(|e| format!("CUDA driver: {e:?}"))?;
        let device = drv::device::get(device_index as i32).map_err(|e| format!("CUDA device: {e:?}"))?;
        let ctx = drv::primary_ctx::retain(device).map_err(|e| format!("CUDA context: {e:?}"))?;
        drv::ctx::set_current(ctx).map_err(|e| format!("CUDA context: {e:?}"))?;
        let stream = drv::stream::create(drv::stream::StreamKind::NonBlocking).map_err(|e| format!("stream: {e:?}"))?;
        let event = || drv::event::create(dsys::CUevent_flags::CU_EVENT_DISABLE_TIMING);
        let before = event().map_err(|e| format!("event: {e:?}"))?;
        let after = event().map_err(|e| format!("event: {e:?}"))?;
        // The context-wide ordering needs CUDA 12.5+ entry points: try them once here.
        dsys::cuCtxRecordEvent(ctx, before).result().map_err(|e| format!("cuCtxRecordEvent: {e:?}"))?;
        dsys::cuCtxWaitEvent(ctx, before).result().map_err(|e| format!("cuCtxWaitEvent: {e:?}"))?;
        let handle = lt::create_handle().map_err(|e| format!("cublasLtCreate: {e:?}"))?;
        Ok(Self { handle, ctx, stream, before, after, plans: HashMap::new(), workspace: None })
    }

    /// The plan of `p`, made and kept on first use.
    unsafe fn plan(&mut self, p: GemmShape) -> Result<&Plan, lt::CublasError> {
        if !self.plans.contains_key(&p) {
            let plan = make_plan(self.handle, p)?;
            self.plans.insert(p, plan);
        }
        Ok(&self.plans[&p])
    }
}

fn data_type(dtype: DType) -> Option<ltsys::cudaDataType> {
    match dtype {
        DType::BF16 => Some(ltsys::cudaDataType::CUDA_R_16BF),
        DType::F16 => Some(ltsys::cudaDataType::CUDA_R_16F),
        DType::F32 => Some(ltsys::cudaDataType::CUDA_R_32F),
        _ => None,
    }
}

/// Column-major descriptors of `C^T [n x m] = op(B)^T [n x k] op(A)^T [k x m]`: cuBLASLt's
/// first operand is our `B` buffer, its second our `A` buffer.
unsafe fn make_plan(handle: ltsys::cublasLtHandle_t, p: GemmShape) -> Result<Plan, lt::CublasError> {
    let ty = data_type(p.dtype).expect("checked by the caller");
    let desc = lt::create_matmul_desc(ltsys::cublasComputeType_t::CUBLAS_COMPUTE_32F, ltsys::cudaDataType::CUDA_R_32F)?;
    let set_transpose = |attr, transpose: bool| {
        // cublasOperation_t: 0 = N, 1 = T.
        let op = transpose as i32;
        lt::set_matmul_desc_attribute(desc, attr, &op as *const _ as *const c_void, std::mem::size_of_val(&op))
    };
    // Our B, row-major [k, n] (or [n, k] transposed), is column-major [n, k] (or [k, n]).
    set_transpose(ltsys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA, p.transpose_b)?;
    set_transpose(ltsys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSB, p.transpose_a)?;
    let (b_rows, b_cols) = if p.transpose_b { (p.n, p.k) } else { (p.k, p.n) };
    let (a_rows, a_cols) = if p.transpose_a { (p.k, p.m) } else { (p.m, p.k) };
    let out_ty = data_type(p.out_dtype).expect("checked by the caller");
    let first = matrix_layout(ty, b_cols, b_rows, p.batch)?;
    let second = matrix_layout(ty, a_cols, a_rows, p.batch)?;
    let out = matrix_layout(out_ty, p.n, p.m, p.batch)?;
    let pref = lt::create_matmul_pref()?;
    let workspace = WORKSPACE_BYTES as u64;
    lt::set_matmul_pref_attribute(
        pref,
        ltsys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
        &workspace as *const u64 as *const c_void,
        std::mem::size_of::<u64>(),
    )?;
    let alignment = p.alignment as u32;
    for attr in [
        ltsys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
        ltsys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        ltsys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
        ltsys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
    ] {
        lt::set_matmul_pref_attribute(pref, attr, &alignment as *const u32 as *const c_void, 4)?;
    }
    let heuristic = lt::get_matmul_algo_heuristic(handle, desc, first, second, out, out, pref);
    lt::destroy_matmul_pref(pref)?;
    Ok(Plan { desc, a: first, b: second, c: out, algo: heuristic?.algo })
}

/// Column-major `rows x cols` matrices, `batch` of them back to back.
unsafe fn matrix_layout(
    ty: ltsys::cudaDataType,
    rows: usize,
    cols: usize,
    batch: usize,
) -> Result<ltsys::cublasLtMatrixLayout_t, lt::CublasError> {
    let layout = lt::create_matrix_layout(ty, rows as u64, cols as u64, rows as i64)?;
    if batch > 1 {
        let (count, offset) = (batch as i32, (rows * cols) as i64);
        let set = |attr, value: *const c_void, size| lt::set_matrix_layout_attribute(layout, attr, value, size);
        set(
            ltsys::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
            &count as *const i32 as *const c_void,
            4,
        )?;
        set(
            ltsys::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
            &offset as *const i64 as *const c_void,
            8,
        )?;
    }
    Ok(layout)
}

/// `op(a) op(b)` in cuBLASLt, or `None` (nothing queued) when it cannot run it: the library is
/// missing, the dtype is not bf16/f16/f32, or the dtypes differ.
pub fn gemm(
    a: &CubeTensor<CudaRuntime>,
    b: &CubeTensor<CudaRuntime>,
    transpose_a: bool,
    transpose_b: bool,
) -> Option<CubeTensor<CudaRuntime>> {
    let [a0, a1] = a.meta.shape().dims::<2>();
    let [b0, b1] = b.meta.shape().dims::<2>();
    // Contiguous first, so that the reshapes only add a unit dimension's stride.
    let a3 = burn_cubecl::ops::reshape(into_contiguous(a.clone()), Shape::new([1, a0, a1]));
    let b3 = burn_cubecl::ops::reshape(into_contiguous(b.clone()), Shape::new([1, b0, b1]));
    let out = batched_gemm(&a3, &b3, transpose_a, transpose_b, a.dtype)?;
    let [_, m, n] = out.meta.shape().dims::<3>();
    Some(burn_cubecl::ops::reshape(out, Shape::new([m, n])))
}

/// `op(a_i) op(b_i)` for each of the `batch` matrices of `a [batch, ., .]` and `b [batch, .,
/// .]`, written as `out_dtype` (bf16 products can be kept in f32): `None` (nothing queued) when
/// cuBLASLt cannot run it, as [`gemm`].
pub fn batched_gemm(
    a: &CubeTensor<CudaRuntime>,
    b: &CubeTensor<CudaRuntime>,
    transpose_a: bool,
    transpose_b: bool,
    out_dtype: DType,
) -> Option<CubeTensor<CudaRuntime>> {
    if a.dtype != b.dtype || data_type(a.dtype).is_none() || data_type(out_dtype).is_none() {
        return None;
    }
    let library = library(a.device.index)?;
    let (a, b) = (into_contiguous(a.clone()), into_contiguous(b.clone()));
    let [batch, a0, a1] = a.meta.shape().dims::<3>();
    let [b_batch, b0, b1] = b.meta.shape().dims::<3>();
    if batch != b_batch {
        return None;
    }
    let (m, k) = if transpose_a { (a1, a0) } else { (a0, a1) };
    let n = if transpose_b { b0 } else { b1 };
    let shape = Shape::new([batch, m, n]);
    let out = empty_device_contiguous_dtype(a.client.clone(), a.device.clone(), shape, out_dtype);
    if let Some(why) = FAILED.get() {
        panic!("a cuBLASLt product failed earlier in this run: {why}");
    }
    let problem = GemmShape { m, n, k, transpose_a, transpose_b, batch, dtype: a.dtype, out_dtype, alignment: 0 };
    // Queued on CubeCL's device thread without waiting for it: there the work before it has
    // been launched and the buffers' addresses are known. The bindings keep the buffers alive
    // until the product is queued.
    let (bindings, stream) = ([&a, &b, &out].map(|x| x.handle.clone().binding()), StreamId::current());
    DeviceHandle::<<CudaRuntime as Runtime>::Server>::new(a.device.to_id()).submit(move |server| {
        if let Err(why) = unsafe { enqueue(server, library, bindings, stream, problem) } {
            eprintln!("error: a cuBLASLt product failed: {why}");
            let _ = FAILED.set(why);
        }
    });
    Some(out)
}

/// `what: error`, for a failed driver or library call.
fn err<E: std::fmt::Debug>(what: &'static str) -> impl Fn(E) -> String {
    move |e| format!("{what}: {e:?}")
}

/// Why a queued product failed, if one did: its output is undefined, so the next product
/// stops the run with this message.
static FAILED: OnceLock<String> = OnceLock::new();

/// Queues `problem` on the buffers of `[a, b, out]` from CubeCL's device thread, ordered after
/// everything CubeCL queued before it and before everything after it (see the module doc).
unsafe fn enqueue(
    server: &mut <CudaRuntime as Runtime>::Server,
    library: &Mutex<Library>,
    bindings: [Binding; 3],
    stream: StreamId,
    problem: GemmShape,
) -> Result<(), String> {
    let [ra, rb, rc] = bindings.map(|binding| server.get_resource(binding, stream));
    let (ra, rb, rc) = (ra.map_err(err("operand"))?, rb.map_err(err("operand"))?, rc.map_err(err("output"))?);
    let mut lib = library.lock().unwrap_or_else(|e| e.into_inner());
    drv::ctx::set_current(lib.ctx).map_err(err("context"))?;
    let workspace = match lib.workspace {
        Some(ptr) => ptr,
        None => {
            let bytes = WORKSPACE_BYTES;
            let ptr = drv::malloc_sync(bytes).map_err(err("workspace"))?;
            lib.workspace = Some(ptr);
            ptr
        }
    };
    let ptrs = [ra.resource().ptr, rb.resource().ptr, rc.resource().ptr, workspace];
    let alignment = ptrs.iter().fold(256u64, |align, p| align.min(1 << p.trailing_zeros().min(8)));
    let problem = GemmShape { alignment, ..problem };
    let (alpha, beta) = (1.0f32, 0.0f32);
    {
        let (handle, ctx, stream, before, after) = (lib.handle, lib.ctx, lib.stream, lib.before, lib.after);
        let plan = lib.plan(problem).map_err(err("plan"))?;
        dsys::cuCtxRecordEvent(ctx, before).result().map_err(err("cuCtxRecordEvent"))?;
        drv::stream::wait_event(stream, before, dsys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT)
            .map_err(err("wait"))?;
        let queued = lt::matmul(
            handle,
            plan.desc,
            &alpha as *const f32 as *const c_void,
            &beta as *const f32 as *const c_void,
            ptrs[1] as *const c_void,
            plan.a,
            ptrs[0] as *const c_void,
            plan.b,
            ptrs[2] as *const c_void,
            plan.c,
            ptrs[2] as *mut c_void,
            plan.c,
            &plan.algo,
            ptrs[3] as *mut c_void,
            WORKSPACE_BYTES,
            stream as ltsys::cudaStream_t,
        );
        drv::event::record(after, stream).map_err(err("record"))?;
        dsys::cuCtxWaitEvent(ctx, after).result().map_err(err("cuCtxWaitEvent"))?;
        queued.map_err(err("matmul"))?;
    }
    Ok(())
}
