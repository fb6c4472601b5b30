//! The stand-in cuBLAS (`libcublas.so`): handles, streams, math modes and
//! the GEMMs leangrad uses (`cublasGemmEx`, `cublasGemmStridedBatchedEx`,
//! `cublasSgemm_v2`/`Dgemm_v2` and their strided-batched forms), with
//! exactly the C ABI of cudarc 0.19's `cublas::sys`.
//!
//! A GEMM's arguments are checked at the call (as cuBLAS does: bad sizes
//! or leading dimensions → `CUBLAS_STATUS_INVALID_VALUE`, unsupported type
//! combinations → `CUBLAS_STATUS_NOT_SUPPORTED`), its operands' footprints
//! against the live allocations (outside → `CUBLAS_STATUS_EXECUTION_FAILED`
//! at once), and the product is queued on the handle's stream like a
//! kernel: memory faults found when it runs are delivered to the enqueuing
//! thread as `CUDA_ERROR_ILLEGAL_ADDRESS` at its next synchronising call.

pub mod gemm;
mod kernel;

use crate::driver::consts::*;
use crate::driver::errors::intern;
use crate::driver::lock::SimLock;
use crate::driver::state::{self, handle, id_of, panic_text, BlasEntry, Op, Sim, TAG_BLAS};
use gemm::{Compute, Elem, Gemm};
use std::ffi::{c_char, c_int, c_longlong, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// `cublasStatus_t`.
pub type CublasStatus = u32;
/// `cublasHandle_t`.
pub type CublasHandle = *mut c_void;

/// Success.
pub const CUBLAS_STATUS_SUCCESS: CublasStatus = 0;
/// No (valid) handle, or no CUDA context.
pub const CUBLAS_STATUS_NOT_INITIALIZED: CublasStatus = 1;
/// An argument is out of range.
pub const CUBLAS_STATUS_INVALID_VALUE: CublasStatus = 7;
/// The GEMM could not run (an operand outside device memory).
pub const CUBLAS_STATUS_EXECUTION_FAILED: CublasStatus = 13;
/// An internal error (a panic of the simulator).
pub const CUBLAS_STATUS_INTERNAL_ERROR: CublasStatus = 14;
/// A combination the simulator does not implement.
pub const CUBLAS_STATUS_NOT_SUPPORTED: CublasStatus = 15;

/// `CUBLAS_TF32_TENSOR_OP_MATH`.
const TF32_TENSOR_OP_MATH: u32 = 3;
/// `CUBLAS_PEDANTIC_MATH`.
const PEDANTIC_MATH: u32 = 2;
/// `CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION` (a flag bit).
const DISALLOW_REDUCED: u32 = 16;

/// The statuses: value, name, description.
const STATUSES: &[(CublasStatus, &str, &str)] = &[
    (
        0,
        "CUBLAS_STATUS_SUCCESS",
        "the operation completed successfully",
    ),
    (
        1,
        "CUBLAS_STATUS_NOT_INITIALIZED",
        "the library was not initialized",
    ),
    (
        3,
        "CUBLAS_STATUS_ALLOC_FAILED",
        "the resource allocation failed",
    ),
    (
        7,
        "CUBLAS_STATUS_INVALID_VALUE",
        "an invalid numeric value was used as an argument",
    ),
    (
        8,
        "CUBLAS_STATUS_ARCH_MISMATCH",
        "an absent device architectural feature is required",
    ),
    (
        11,
        "CUBLAS_STATUS_MAPPING_ERROR",
        "an access to GPU memory space failed",
    ),
    (
        13,
        "CUBLAS_STATUS_EXECUTION_FAILED",
        "the GPU program failed to execute",
    ),
    (
        14,
        "CUBLAS_STATUS_INTERNAL_ERROR",
        "an internal operation failed",
    ),
    (
        15,
        "CUBLAS_STATUS_NOT_SUPPORTED",
        "the functionality requested is not supported",
    ),
    (
        16,
        "CUBLAS_STATUS_LICENSE_ERROR",
        "error detected trying to check the license",
    ),
];

type BResult<T> = Result<T, (CublasStatus, String)>;

fn bfail<T>(status: CublasStatus, msg: impl Into<String>) -> BResult<T> {
    Err((status, msg.into()))
}

/// Runs cuBLAS call `func` on the simulator; a failure is printed as
/// `gpusim: <func>: <what>`.
fn blas_api(func: &str, f: impl FnOnce(&mut SimLock) -> BResult<()>) -> CublasStatus {
    let r = catch_unwind(AssertUnwindSafe(|| {
        let g = state::lock();
        if g.is_none() {
            return bfail(
                CUBLAS_STATUS_NOT_INITIALIZED,
                "the CUDA driver is not initialised (cuInit, and a current context)",
            );
        }
        f(&mut SimLock::new(g))
    }));
    let (status, msg) = match r {
        Ok(Ok(())) => return CUBLAS_STATUS_SUCCESS,
        Ok(Err(e)) => e,
        Err(p) => (
            CUBLAS_STATUS_INTERNAL_ERROR,
            format!("internal error (panic): {}", panic_text(&*p)),
        ),
    };
    eprintln!("gpusim: {func}: {msg}");
    status
}

/// The live handle `h`.
fn entry(sim: &Sim, h: CublasHandle) -> BResult<BlasEntry> {
    match sim.blas.get(&(h as u64)) {
        Some(&e) if id_of(h, TAG_BLAS).is_some() => Ok(e),
        _ => bfail(
            CUBLAS_STATUS_NOT_INITIALIZED,
            format!("{h:p} is not a live cuBLAS handle"),
        ),
    }
}

/// The queue key of stream handle `s` for device `dev` (0/1/2: default).
fn stream_key(sim: &Sim, dev: usize, s: u64) -> BResult<u64> {
    if s <= CU_STREAM_PER_THREAD {
        return Ok(0);
    }
    match sim.streams.get(&s) {
        Some(&d) if d == dev => Ok(s),
        Some(&d) => bfail(
            CUBLAS_STATUS_INVALID_VALUE,
            format!("stream {s:#x} belongs to device {d}, the handle to device {dev}"),
        ),
        None => bfail(
            CUBLAS_STATUS_INVALID_VALUE,
            format!("{s:#x} is not a live stream"),
        ),
    }
}

/// `cublasCreate_v2`: a handle on the current context's device, on the
/// default stream.
///
/// # Safety
/// `handle_out` must be null or writable.
#[no_mangle]
pub unsafe extern "C" fn cublasCreate_v2(handle_out: *mut CublasHandle) -> CublasStatus {
    blas_api("cublasCreate_v2", |sim| {
        let device = sim
            .current_device()
            .map_err(|e| (CUBLAS_STATUS_NOT_INITIALIZED, e.msg))?;
        if handle_out.is_null() {
            return bfail(CUBLAS_STATUS_INVALID_VALUE, "handle is null");
        }
        let h = handle(TAG_BLAS, sim.new_id());
        sim.blas.insert(
            h as u64,
            BlasEntry {
                device,
                stream: 0,
                math_mode: 0,
            },
        );
        *handle_out = h;
        Ok(())
    })
}

/// `cublasDestroy_v2`: the device's queued work runs first (the library
/// synchronises on destroy).
#[no_mangle]
pub extern "C" fn cublasDestroy_v2(h: CublasHandle) -> CublasStatus {
    blas_api("cublasDestroy_v2", |sim| {
        let e = entry(sim, h)?;
        sim.drain(e.device, None);
        sim.blas.remove(&(h as u64));
        Ok(())
    })
}

/// `cublasSetStream_v2`.
#[no_mangle]
pub extern "C" fn cublasSetStream_v2(h: CublasHandle, stream: CUstream) -> CublasStatus {
    blas_api("cublasSetStream_v2", |sim| {
        let e = entry(sim, h)?;
        let s = stream as u64;
        stream_key(sim, e.device, s)?;
        if let Some(b) = sim.blas.get_mut(&(h as u64)) {
            b.stream = if s <= CU_STREAM_PER_THREAD { 0 } else { s };
        }
        Ok(())
    })
}

/// `cublasGetStream_v2`.
///
/// # Safety
/// `stream` must be null or writable.
#[no_mangle]
pub unsafe extern "C" fn cublasGetStream_v2(
    h: CublasHandle,
    stream: *mut CUstream,
) -> CublasStatus {
    blas_api("cublasGetStream_v2", |sim| {
        let e = entry(sim, h)?;
        if stream.is_null() {
            return bfail(CUBLAS_STATUS_INVALID_VALUE, "streamId is null");
        }
        *stream = e.stream as CUstream;
        Ok(())
    })
}

/// `cublasSetMathMode`: default, tensor-op, pedantic or TF32, with or
/// without the reduced-precision-reduction bit; emulation modes are not
/// supported.
#[no_mangle]
pub extern "C" fn cublasSetMathMode(h: CublasHandle, mode: u32) -> CublasStatus {
    blas_api("cublasSetMathMode", |sim| {
        entry(sim, h)?;
        match mode & !DISALLOW_REDUCED {
            0..=3 => {}
            4 | 8 => {
                return bfail(
                    CUBLAS_STATUS_NOT_SUPPORTED,
                    format!("emulated math mode {mode} is not simulated"),
                )
            }
            _ => {
                return bfail(
                    CUBLAS_STATUS_INVALID_VALUE,
                    format!("unknown math mode {mode}"),
                )
            }
        }
        if let Some(b) = sim.blas.get_mut(&(h as u64)) {
            b.math_mode = mode;
        }
        Ok(())
    })
}

/// `cublasGetMathMode`.
///
/// # Safety
/// `mode` must be null or writable.
#[no_mangle]
pub unsafe extern "C" fn cublasGetMathMode(h: CublasHandle, mode: *mut u32) -> CublasStatus {
    blas_api("cublasGetMathMode", |sim| {
        let e = entry(sim, h)?;
        if mode.is_null() {
            return bfail(CUBLAS_STATUS_INVALID_VALUE, "mode is null");
        }
        *mode = e.math_mode;
        Ok(())
    })
}

/// `cublasSetPointerMode_v2`: only host pointers (mode 0) are supported.
#[no_mangle]
pub extern "C" fn cublasSetPointerMode_v2(h: CublasHandle, mode: u32) -> CublasStatus {
    blas_api("cublasSetPointerMode_v2", |sim| {
        entry(sim, h)?;
        match mode {
            0 => Ok(()),
            1 => bfail(
                CUBLAS_STATUS_NOT_SUPPORTED,
                "device pointer mode is not simulated (alpha/beta are read from the host)",
            ),
            _ => bfail(
                CUBLAS_STATUS_INVALID_VALUE,
                format!("unknown pointer mode {mode}"),
            ),
        }
    })
}

/// `cublasGetPointerMode_v2`: always host (0).
///
/// # Safety
/// `mode` must be null or writable.
#[no_mangle]
pub unsafe extern "C" fn cublasGetPointerMode_v2(h: CublasHandle, mode: *mut u32) -> CublasStatus {
    blas_api("cublasGetPointerMode_v2", |sim| {
        entry(sim, h)?;
        if mode.is_null() {
            return bfail(CUBLAS_STATUS_INVALID_VALUE, "mode is null");
        }
        *mode = 0;
        Ok(())
    })
}

/// `cublasGetVersion_v2`: 130000 (cuBLAS 13.0.0).
///
/// # Safety
/// `version` must be null or writable.
#[no_mangle]
pub unsafe extern "C" fn cublasGetVersion_v2(
    _h: CublasHandle,
    version: *mut c_int,
) -> CublasStatus {
    if version.is_null() {
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    *version = 130000;
    CUBLAS_STATUS_SUCCESS
}

/// `cublasGetStatusName`.
#[no_mangle]
pub extern "C" fn cublasGetStatusName(status: CublasStatus) -> *const c_char {
    let s = STATUSES.iter().find(|s| s.0 == status);
    intern(s.map_or("CUBLAS_STATUS_UNKNOWN", |s| s.1))
}

/// `cublasGetStatusString`.
#[no_mangle]
pub extern "C" fn cublasGetStatusString(status: CublasStatus) -> *const c_char {
    let s = STATUSES.iter().find(|s| s.0 == status);
    intern(s.map_or("unknown error", |s| s.2))
}

/// One matrix operand of a GEMM entry point, raw: device address, data
/// type, leading dimension and batch stride (0 for the unbatched calls).
struct Mat {
    ptr: u64,
    ty: u32,
    ld: c_int,
    stride: c_longlong,
}

impl Mat {
    /// The operand from the entry points' arguments, in their order.
    fn new(ptr: u64, ty: u32, ld: c_int, stride: c_longlong) -> Mat {
        Mat {
            ptr,
            ty,
            ld,
            stride,
        }
    }
}

/// The raw arguments of any GEMM entry point.
struct Args {
    transa: u32,
    transb: u32,
    m: c_int,
    n: c_int,
    k: c_int,
    alpha: *const c_void,
    beta: *const c_void,
    a: Mat,
    b: Mat,
    c: Mat,
    batch: c_int,
    compute: u32,
    algo: i32,
}

/// Checks `x` as cuBLAS does, reading alpha and beta (host pointers);
/// `None` for a call with nothing to do (m, n or batchCount 0).
unsafe fn check(x: &Args, math_mode: u32) -> BResult<Option<Gemm>> {
    let op = |t: u32, name: &str| match t {
        0 => Ok(false),
        1 | 2 => Ok(true), // C (conjugate transpose) is T for real types
        _ => bfail(
            CUBLAS_STATUS_INVALID_VALUE,
            format!("{name} = {t} is not N, T or C"),
        ),
    };
    let (transa, transb) = (op(x.transa, "transa")?, op(x.transb, "transb")?);
    if x.m < 0 || x.n < 0 || x.k < 0 || x.batch < 0 {
        return bfail(
            CUBLAS_STATUS_INVALID_VALUE,
            format!(
                "negative size: m={} n={} k={} batchCount={}",
                x.m, x.n, x.k, x.batch
            ),
        );
    }
    let (m, n, k) = (x.m as usize, x.n as usize, x.k as usize);
    let need_a = if transa { k } else { m }.max(1);
    let need_b = if transb { n } else { k }.max(1);
    for (name, ld, need) in [
        ("lda", x.a.ld, need_a),
        ("ldb", x.b.ld, need_b),
        ("ldc", x.c.ld, m.max(1)),
    ] {
        if ld < 0 || (ld as usize) < need {
            return bfail(
                CUBLAS_STATUS_INVALID_VALUE,
                format!("{name} = {ld} is below {need} (m={m} n={n} k={k}, transa={transa} transb={transb})"),
            );
        }
    }
    let (Some(ab), Some(bt), Some(ct)) = (
        Elem::from_cuda(x.a.ty),
        Elem::from_cuda(x.b.ty),
        Elem::from_cuda(x.c.ty),
    ) else {
        return bfail(
            CUBLAS_STATUS_NOT_SUPPORTED,
            format!(
                "data types A={} B={} C={} (supported: 32F, 64F, 16F, 16BF)",
                x.a.ty, x.b.ty, x.c.ty
            ),
        );
    };
    let base = math_mode & !DISALLOW_REDUCED;
    let compute = match x.compute {
        68 | 0 if base == TF32_TENSOR_OP_MATH => Compute::Tf32,
        68 | 69 | 0 => Compute::F32,
        77 if base == PEDANTIC_MATH => Compute::F32,
        77 => Compute::Tf32,
        70 | 71 | 1 => Compute::F64,
        c => {
            return bfail(
                CUBLAS_STATUS_NOT_SUPPORTED,
                format!("compute type {c} is not simulated (32F, 32F_FAST_TF32, 64F)"),
            )
        }
    };
    let supported = ab == bt
        && match (compute, ab, ct) {
            (Compute::F64, Elem::F64, Elem::F64) => true,
            (Compute::F32 | Compute::Tf32, Elem::F32, Elem::F32) => true,
            (Compute::F32, Elem::F16, Elem::F16 | Elem::F32) => true,
            (Compute::F32, Elem::Bf16, Elem::Bf16 | Elem::F32) => true,
            // 32F under the TF32 math mode with half inputs: TF32 does not apply.
            (Compute::Tf32, Elem::F16 | Elem::Bf16, _) => {
                x.compute != 77 && (ct == ab || ct == Elem::F32)
            }
            _ => false,
        };
    if !supported {
        return bfail(
            CUBLAS_STATUS_NOT_SUPPORTED,
            format!(
                "types A={ab:?} B={bt:?} C={ct:?} with compute type {}",
                x.compute
            ),
        );
    }
    let compute = if compute == Compute::Tf32 && ab != Elem::F32 {
        Compute::F32
    } else {
        compute
    };
    if !(x.algo == -1 || (0..=23).contains(&x.algo) || (99..=115).contains(&x.algo)) {
        return bfail(
            CUBLAS_STATUS_NOT_SUPPORTED,
            format!("GEMM algorithm {} is not known", x.algo),
        );
    }
    if m == 0 || n == 0 || x.batch == 0 {
        return Ok(None);
    }
    if x.alpha.is_null() || x.beta.is_null() {
        return bfail(CUBLAS_STATUS_INVALID_VALUE, "alpha or beta is null");
    }
    let (alpha, beta) = if compute == Compute::F64 {
        (*x.alpha.cast::<f64>(), *x.beta.cast::<f64>())
    } else {
        (*x.alpha.cast::<f32>() as f64, *x.beta.cast::<f32>() as f64)
    };
    Ok(Some(Gemm {
        transa,
        transb,
        m,
        n,
        k,
        alpha,
        beta,
        a: x.a.ptr,
        lda: x.a.ld as usize,
        stride_a: x.a.stride,
        b: x.b.ptr,
        ldb: x.b.ld as usize,
        stride_b: x.b.stride,
        c: x.c.ptr,
        ldc: x.c.ld as usize,
        stride_c: x.c.stride,
        batch: x.batch as usize,
        ab,
        ct,
        compute,
    }))
}

/// Checks and queues a GEMM on handle `h`'s stream.
fn gemm_call(func: &str, h: CublasHandle, x: Args) -> CublasStatus {
    blas_api(func, |sim| {
        let e = entry(sim, h)?;
        if sim.devices[e.device].primary_refs == 0 {
            return bfail(
                CUBLAS_STATUS_NOT_INITIALIZED,
                "the handle's context was released",
            );
        }
        let key = stream_key(sim, e.device, e.stream)?;
        // SAFETY: alpha and beta are host pointers to the scale type, as
        // the caller of the C API guarantees.
        let Some(g) = (unsafe { check(&x, e.math_mode)? }) else {
            return Ok(());
        };
        g.check_footprints(&sim.devices[e.device].mem)
            .map_err(|m| (CUBLAS_STATUS_EXECUTION_FAILED, m))?;
        crate::profile::record_gemm(g.profile_record(func));
        let what = format!(
            "{func} (m={} n={} k={} batch={} {:?}→{:?} {:?})",
            g.m, g.n, g.k, g.batch, g.ab, g.ct, g.compute
        );
        let job = move |mem: &mut crate::memory::DeviceMemory| {
            let t0 = std::time::Instant::now();
            let r = g.run(mem);
            crate::driver::stats::count_gemm(
                (g.m * g.n * g.k * g.batch) as u64,
                t0.elapsed().as_nanos() as u64,
            );
            r
        };
        sim.enqueue(
            e.device,
            key,
            Op::Host {
                what,
                job: Box::new(job),
            },
        );
        Ok(())
    })
}

/// `cublasGemmStridedBatchedEx`.
///
/// # Safety
/// alpha and beta must point to the compute type's scale type on the host.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cublasGemmStridedBatchedEx(
    handle: CublasHandle,
    transa: u32,
    transb: u32,
    m: c_int,
    n: c_int,
    k: c_int,
    alpha: *const c_void,
    a: *const c_void,
    atype: u32,
    lda: c_int,
    stride_a: c_longlong,
    b: *const c_void,
    btype: u32,
    ldb: c_int,
    stride_b: c_longlong,
    beta: *const c_void,
    c: *mut c_void,
    ctype: u32,
    ldc: c_int,
    stride_c: c_longlong,
    batch_count: c_int,
    compute_type: u32,
    algo: i32,
) -> CublasStatus {
    let x = Args {
        transa,
        transb,
        m,
        n,
        k,
        alpha,
        beta,
        a: Mat::new(a as u64, atype, lda, stride_a),
        b: Mat::new(b as u64, btype, ldb, stride_b),
        c: Mat::new(c as u64, ctype, ldc, stride_c),
        batch: batch_count,
        compute: compute_type,
        algo,
    };
    gemm_call("cublasGemmStridedBatchedEx", handle, x)
}

/// `cublasGemmEx`.
///
/// # Safety
/// alpha and beta must point to the compute type's scale type on the host.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cublasGemmEx(
    handle: CublasHandle,
    transa: u32,
    transb: u32,
    m: c_int,
    n: c_int,
    k: c_int,
    alpha: *const c_void,
    a: *const c_void,
    atype: u32,
    lda: c_int,
    b: *const c_void,
    btype: u32,
    ldb: c_int,
    beta: *const c_void,
    c: *mut c_void,
    ctype: u32,
    ldc: c_int,
    compute_type: u32,
    algo: i32,
) -> CublasStatus {
    let x = Args {
        transa,
        transb,
        m,
        n,
        k,
        alpha,
        beta,
        a: Mat::new(a as u64, atype, lda, 0),
        b: Mat::new(b as u64, btype, ldb, 0),
        c: Mat::new(c as u64, ctype, ldc, 0),
        batch: 1,
        compute: compute_type,
        algo,
    };
    gemm_call("cublasGemmEx", handle, x)
}

/// Defines a typed GEMM (`S`/`D`, plain or strided-batched) over the
/// common path: data and compute type fixed, legacy compute value so that
/// the math mode applies as it does to `cublasSgemm`.
macro_rules! typed_gemm {
    ($name:ident, $t:ty, $dt:expr, batched) => {
        /// A typed strided-batched GEMM (see [`cublasGemmStridedBatchedEx`]).
        ///
        /// # Safety
        /// alpha and beta must be host pointers.
        #[no_mangle]
        #[allow(clippy::too_many_arguments)]
        pub unsafe extern "C" fn $name(
            handle: CublasHandle,
            transa: u32,
            transb: u32,
            m: c_int,
            n: c_int,
            k: c_int,
            alpha: *const $t,
            a: *const $t,
            lda: c_int,
            stride_a: c_longlong,
            b: *const $t,
            ldb: c_int,
            stride_b: c_longlong,
            beta: *const $t,
            c: *mut $t,
            ldc: c_int,
            stride_c: c_longlong,
            batch_count: c_int,
        ) -> CublasStatus {
            let x = Args {
                transa,
                transb,
                m,
                n,
                k,
                alpha: alpha.cast(),
                beta: beta.cast(),
                a: Mat::new(a as u64, $dt, lda, stride_a),
                b: Mat::new(b as u64, $dt, ldb, stride_b),
                c: Mat::new(c as u64, $dt, ldc, stride_c),
                batch: batch_count,
                compute: $dt,
                algo: -1,
            };
            gemm_call(stringify!($name), handle, x)
        }
    };
    ($name:ident, $t:ty, $dt:expr) => {
        /// A typed GEMM (see [`cublasGemmEx`]).
        ///
        /// # Safety
        /// alpha and beta must be host pointers.
        #[no_mangle]
        #[allow(clippy::too_many_arguments)]
        pub unsafe extern "C" fn $name(
            handle: CublasHandle,
            transa: u32,
            transb: u32,
            m: c_int,
            n: c_int,
            k: c_int,
            alpha: *const $t,
            a: *const $t,
            lda: c_int,
            b: *const $t,
            ldb: c_int,
            beta: *const $t,
            c: *mut $t,
            ldc: c_int,
        ) -> CublasStatus {
            let x = Args {
                transa,
                transb,
                m,
                n,
                k,
                alpha: alpha.cast(),
                beta: beta.cast(),
                a: Mat::new(a as u64, $dt, lda, 0),
                b: Mat::new(b as u64, $dt, ldb, 0),
                c: Mat::new(c as u64, $dt, ldc, 0),
                batch: 1,
                compute: $dt,
                algo: -1,
            };
            gemm_call(stringify!($name), handle, x)
        }
    };
}

typed_gemm!(cublasSgemm_v2, f32, 0);
typed_gemm!(cublasDgemm_v2, f64, 1);
typed_gemm!(cublasSgemmStridedBatched, f32, 0, batched);
typed_gemm!(cublasDgemmStridedBatched, f64, 1, batched);
