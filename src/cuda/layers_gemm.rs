//! A row-major strided-batched GEMM on sub-ranges of buffers (element
//! offsets and an output stride), for the convolution wrappers: the same
//! column-major swap as [`super::gemm`], which only takes whole buffers.

use super::layers_util::invalid;
use super::CudaBuffer;
use crate::{DType, Error, Result};
use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType};
use cudarc::driver::{DevicePtr, DevicePtrMut};
use std::ffi::c_void;

/// One operand: its buffer, the element offset of batch 0 and the elements
/// between batches (0 reuses one matrix).
pub(crate) type Operand<'a> = (&'a CudaBuffer, usize, usize);

/// The sizes: `batch` products `[m×k]·[k×n]`, A stored `[k, m]` when
/// `trans_a`, B stored `[n, k]` when `trans_b`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SubGemm {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub batch: usize,
    pub trans_a: bool,
    pub trans_b: bool,
    pub beta: f64,
}

fn i32_of(v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| invalid("cuda conv gemm", format!("size {v} over 32 bits")))
}

/// `C[c_off + i·c_stride] = op(A_i)·op(B_i) + beta·C` (row-major, ldc = n)
/// for every batch `i`. Bounds are checked against the buffers.
pub(crate) fn gemm_sub(
    a: Operand,
    b: Operand,
    c: (&mut CudaBuffer, usize, usize),
    s: SubGemm,
) -> Result<()> {
    let op = "cuda conv gemm";
    let dtype = c.0.dtype();
    use cublasComputeType_t::*;
    use cudaDataType::*;
    let (dt, compute, wide) = match dtype {
        DType::F32 => (CUDA_R_32F, CUBLAS_COMPUTE_32F, false),
        DType::F16 => (CUDA_R_16F, CUBLAS_COMPUTE_32F, false),
        DType::BF16 => (CUDA_R_16BF, CUBLAS_COMPUTE_32F, false),
        DType::F64 => (CUDA_R_64F, CUBLAS_COMPUTE_64F, true),
        dtype => return Err(Error::UnsupportedDType { op, dtype }),
    };
    if s.batch == 0 || s.m == 0 || s.n == 0 {
        return Ok(());
    }
    let last = |off: usize, stride: usize, size: usize| off + (s.batch - 1) * stride + size;
    for (buf, off, stride, size) in [(a.0, a.1, a.2, s.m * s.k), (b.0, b.1, b.2, s.k * s.n)] {
        super::check::same_device(op, buf, c.0)?;
        if buf.dtype() != dtype || buf.len() < last(off, stride, size) {
            return Err(invalid(
                op,
                format!("operand of {} {:?} elements", buf.len(), buf.dtype()),
            ));
        }
    }
    if c.0.len() < last(c.1, c.2, s.m * s.n) {
        return Err(invalid(op, format!("output of {} elements", c.0.len())));
    }
    let trans = |t: bool| {
        if t {
            cublasOperation_t::CUBLAS_OP_T
        } else {
            cublasOperation_t::CUBLAS_OP_N
        }
    };
    let lda = i32_of(if s.trans_a { s.m } else { s.k }.max(1))?;
    let ldb = i32_of(if s.trans_b { s.k } else { s.n }.max(1))?;
    let (m, n, k, batch) = (i32_of(s.m)?, i32_of(s.n)?, i32_of(s.k)?, i32_of(s.batch)?);
    let (alpha64, beta64) = (1.0f64, s.beta);
    let (alpha32, beta32) = (1.0f32, s.beta as f32);
    let (alpha, beta): (*const c_void, *const c_void) = if wide {
        (
            (&alpha64 as *const f64).cast(),
            (&beta64 as *const f64).cast(),
        )
    } else {
        (
            (&alpha32 as *const f32).cast(),
            (&beta32 as *const f32).cast(),
        )
    };
    let size = dtype.size_in_bytes() as u64;
    let device = c.0.device().clone();
    let stream = device.stream().clone();
    device.with_blas(|blas| {
        let (pa, _ra) = a.0.slice().device_ptr(&stream);
        let (pb, _rb) = b.0.slice().device_ptr(&stream);
        let (pc, _rc) = c.0.slice_mut().device_ptr_mut(&stream);
        let (pa, pb, pc) = (
            pa + a.1 as u64 * size,
            pb + b.1 as u64 * size,
            pc + c.1 as u64 * size,
        );
        // SAFETY: every addressed element lies inside its buffer (checked
        // above); alpha/beta point to locals of the scale type; the handle
        // runs on the device's stream.
        let r = unsafe {
            cudarc::cublas::result::gemm_strided_batched_ex(
                *blas.handle(),
                trans(s.trans_b),
                trans(s.trans_a),
                n,
                m,
                k,
                alpha,
                pb as *const c_void,
                dt,
                ldb,
                b.2 as i64,
                pa as *const c_void,
                dt,
                lda,
                a.2 as i64,
                beta,
                pc as *mut c_void,
                dt,
                n,
                c.2 as i64,
                batch,
                compute,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        };
        r.map_err(|e| device.error("cublasGemmStridedBatchedEx", format!("{e:?}")))
    })
}
