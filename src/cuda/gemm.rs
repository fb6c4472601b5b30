//! Row-major GEMMs on cuBLAS.
//!
//! cuBLAS is column-major. A row-major `C[m×n] = A[m×k]·B[k×n]` is, read
//! column-major, `Cᵀ = Bᵀ·Aᵀ`, and a row-major matrix's memory read
//! column-major *is* its transpose. So we ask cuBLAS for `n×m = (op B)·(op A)`
//! with the operands swapped; a transposed operand is just the other
//! `cublasOperation_t`, never a copy.
//!
//! f32 (TF32 tensor cores only when [`GemmConfig::tf32`] is set), f16 and
//! bf16 (f32 accumulation, `gemm_ex`), f64. `beta = 1` accumulates into C
//! in place (how the autograd engine adds a weight gradient into its buffer).
//! cuBLAS's own workspace is not counted in the ledger.
//!
//! Two entries, one cuBLAS call ([`launch`]): [`gemm_views`] on operands
//! read in place through [`MatrixView`]s (the matmul primitive, strided
//! views included) and [`gemm`] on whole buffers.

use super::check;
use super::CudaBuffer;
use crate::{DType, Error, Result};
use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType};
use cudarc::driver::{DevicePtr, DevicePtrMut};
use std::ffi::c_void;

/// How a GEMM is computed: `C = alpha·op(A)·op(B) + beta·C`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct GemmConfig {
    /// A is stored as `[k, m]` (row-major) and used transposed.
    pub trans_a: bool,
    /// B is stored as `[n, k]` (row-major) and used transposed.
    pub trans_b: bool,
    /// Scale of the product.
    pub alpha: f64,
    /// Scale of C's previous contents (0: overwrite, 1: accumulate).
    pub beta: f64,
    /// Allow TF32 tensor cores for f32 (10-bit mantissa products); off by
    /// default so that f32 results are f32-accurate.
    pub tf32: bool,
}

impl Default for GemmConfig {
    fn default() -> GemmConfig {
        GemmConfig {
            trans_a: false,
            trans_b: false,
            alpha: 1.0,
            beta: 0.0,
            tf32: false,
        }
    }
}

/// The sizes of a (batched) GEMM: `batch` products of `[m×k]·[k×n]`.
/// Batch `i` reads A at `i·stride_a` and B at `i·stride_b` elements and
/// writes C at `i·m·n`; a stride of 0 reuses one matrix for every batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct GemmShape {
    /// Rows of C.
    pub m: usize,
    /// Columns of C.
    pub n: usize,
    /// The contracted size.
    pub k: usize,
    /// Number of products.
    pub batch: usize,
    /// Elements between consecutive A matrices (0 to broadcast A).
    pub stride_a: usize,
    /// Elements between consecutive B matrices (0 to broadcast B).
    pub stride_b: usize,
}

// The whole-buffer constructors serve `gemm` and `matmul` (see there).
#[cfg_attr(not(test), allow(dead_code))]
impl GemmShape {
    /// One product `[m×k]·[k×n]`.
    pub fn single(m: usize, n: usize, k: usize) -> GemmShape {
        GemmShape::batched(1, m, n, k)
    }

    /// `batch` products of contiguous, densely stacked matrices.
    pub fn batched(batch: usize, m: usize, n: usize, k: usize) -> GemmShape {
        GemmShape {
            m,
            n,
            k,
            batch,
            stride_a: m * k,
            stride_b: k * n,
        }
    }
}

/// cuBLAS data type, compute type, and whether alpha/beta are f64; other
/// dtypes are `UnsupportedDType` for `op`.
fn types(
    op: &'static str,
    dtype: DType,
    tf32: bool,
) -> Result<(cudaDataType, cublasComputeType_t, bool)> {
    use cublasComputeType_t::*;
    use cudaDataType::*;
    Ok(match dtype {
        DType::F32 if tf32 => (CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32, false),
        DType::F32 => (CUDA_R_32F, CUBLAS_COMPUTE_32F, false),
        DType::F16 => (CUDA_R_16F, CUBLAS_COMPUTE_32F, false),
        DType::BF16 => (CUDA_R_16BF, CUBLAS_COMPUTE_32F, false),
        DType::F64 => (CUDA_R_64F, CUBLAS_COMPUTE_64F, true),
        dtype => return Err(Error::UnsupportedDType { op, dtype }),
    })
}

fn int(op: &'static str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::InvalidArgument {
        op,
        msg: format!("size {v} exceeds cuBLAS's 32-bit sizes"),
    })
}

/// `C = alpha·op(A)·op(B) + beta·C` for every batch of `shape`, in place
/// in `c` (contiguous `[batch, m, n]`). All three buffers share a float dtype.
/// The library's matmul reads its operands through views ([`gemm_views`]);
/// this whole-buffer form is kept, and tested, as the plain entry of the
/// one cuBLAS call ([`launch`]) all three entries share.
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) fn gemm(
    a: &CudaBuffer,
    b: &CudaBuffer,
    c: &mut CudaBuffer,
    shape: GemmShape,
    cfg: &GemmConfig,
) -> Result<()> {
    let op = "cuda gemm";
    let GemmShape { m, n, k, batch, .. } = shape;
    types(op, c.dtype(), cfg.tf32)?;
    for (buf, stride, size) in [(a, shape.stride_a, m * k), (b, shape.stride_b, k * n)] {
        check::same_device(op, buf, c)?;
        if buf.dtype() != c.dtype() {
            return Err(Error::DTypeMismatch {
                op,
                expected: c.dtype(),
                got: buf.dtype(),
            });
        }
        let need = if batch == 0 {
            0
        } else {
            (batch - 1) * stride + size
        };
        if buf.len() < need {
            return Err(Error::InvalidArgument {
                op,
                msg: format!(
                    "an operand of {} elements for {batch} × {m}×{n}×{k}",
                    buf.len()
                ),
            });
        }
    }
    if c.len() != batch * m * n {
        return Err(Error::ShapeMismatch {
            op,
            lhs: vec![c.len()],
            rhs: vec![batch, m, n],
        });
    }
    if batch == 0 || m == 0 || n == 0 {
        return Ok(());
    }
    // Leading dimensions of the stored row-major matrices (at least 1, as
    // cuBLAS requires even when k = 0).
    let va = MatrixView {
        offset: 0,
        stride: shape.stride_a,
        ld: if cfg.trans_a { m } else { k }.max(1),
        trans: cfg.trans_a,
    };
    let vb = MatrixView {
        offset: 0,
        stride: shape.stride_b,
        ld: if cfg.trans_b { k } else { n }.max(1),
        trans: cfg.trans_b,
    };
    launch(op, (a, va), (b, vb), (c, 0, m * n), shape, cfg)
}

/// Where a GEMM operand's matrices lie in their buffer, read in place:
/// `batch` matrices from element `offset`, `stride` elements apart (0: one
/// matrix for every batch), each stored row-major with `ld` elements
/// between rows — the `[rows, cols]` operand itself, or with `trans` its
/// transpose `[cols, rows]`. So a view whose rows are spaced wider than
/// they are long (a head of a `[batch, seq, heads·dim]` tensor) needs no
/// copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MatrixView {
    /// Element offset of batch 0's matrix.
    pub offset: usize,
    /// Elements between consecutive batch matrices (0: shared).
    pub stride: usize,
    /// Elements between consecutive stored rows (at least the stored row
    /// length, as cuBLAS requires).
    pub ld: usize,
    /// The matrix is stored transposed.
    pub trans: bool,
}

impl MatrixView {
    /// One past the last element the view addresses for `batch` matrices of
    /// `rows × cols` (as used), or an error when `ld` is shorter than a
    /// stored row.
    fn end(&self, op: &'static str, rows: usize, cols: usize, batch: usize) -> Result<usize> {
        let (srows, scols) = if self.trans {
            (cols, rows)
        } else {
            (rows, cols)
        };
        if self.ld < scols.max(1) {
            return Err(Error::InvalidArgument {
                op,
                msg: format!("leading dimension {} below a row of {scols}", self.ld),
            });
        }
        if batch == 0 || srows == 0 || scols == 0 {
            return Ok(0);
        }
        Ok(self.offset + (batch - 1) * self.stride + (srows - 1) * self.ld + scols)
    }
}

/// `C = alpha·op(A)·op(B) + beta·C` for every batch of `shape` (its strides
/// are not read: the views carry them), with A and B read in place through
/// their views and C contiguous `[batch, m, n]` from element `c_offset` of
/// `c`. `cfg` gives alpha, beta and TF32; its transpose flags are not read.
pub(crate) fn gemm_views(
    a: (&CudaBuffer, MatrixView),
    b: (&CudaBuffer, MatrixView),
    c: (&mut CudaBuffer, usize),
    shape: GemmShape,
    cfg: &GemmConfig,
) -> Result<()> {
    let op = "cuda gemm";
    let GemmShape { m, n, k, batch, .. } = shape;
    for (buf, view, rows, cols) in [(a.0, a.1, m, k), (b.0, b.1, k, n)] {
        check::same_device(op, buf, c.0)?;
        if buf.dtype() != c.0.dtype() {
            return Err(Error::DTypeMismatch {
                op,
                expected: c.0.dtype(),
                got: buf.dtype(),
            });
        }
        if view.end(op, rows, cols, batch)? > buf.len() {
            return Err(Error::InvalidArgument {
                op,
                msg: format!(
                    "a view {view:?} of {batch} × {rows}×{cols} reaches past {} elements",
                    buf.len()
                ),
            });
        }
    }
    if c.1 + batch * m * n > c.0.len() {
        return Err(Error::InvalidArgument {
            op,
            msg: format!(
                "{batch} × {m}×{n} from element {} of an output of {}",
                c.1,
                c.0.len()
            ),
        });
    }
    if batch == 0 || m == 0 || n == 0 {
        return Ok(());
    }
    launch(op, a, b, (c.0, c.1, m * n), shape, cfg)
}

/// The cuBLAS call of [`gemm`] and [`gemm_views`] (arguments
/// checked by them): C's batch `i` is written row-major (`ldc = n`) from
/// element `c.1 + i·c.2` of `c.0`; the transpose flags are the views'.
fn launch(
    op: &'static str,
    a: (&CudaBuffer, MatrixView),
    b: (&CudaBuffer, MatrixView),
    c: (&mut CudaBuffer, usize, usize),
    shape: GemmShape,
    cfg: &GemmConfig,
) -> Result<()> {
    let GemmShape { m, n, k, batch, .. } = shape;
    let (data_type, compute, wide) = types(op, c.0.dtype(), cfg.tf32)?;
    let trans = |t: bool| {
        if t {
            cublasOperation_t::CUBLAS_OP_T
        } else {
            cublasOperation_t::CUBLAS_OP_N
        }
    };
    let (m_, n_, k_) = (int(op, m)?, int(op, n)?, int(op, k)?);
    let (lda, ldb, ldc) = (int(op, a.1.ld)?, int(op, b.1.ld)?, n_);
    let (alpha32, beta32) = (cfg.alpha as f32, cfg.beta as f32);
    let (alpha, beta): (*const c_void, *const c_void) = if wide {
        (
            (&cfg.alpha as *const f64).cast(),
            (&cfg.beta as *const f64).cast(),
        )
    } else {
        (
            (&alpha32 as *const f32).cast(),
            (&beta32 as *const f32).cast(),
        )
    };
    let size = c.0.dtype().size_in_bytes() as u64;
    let device = c.0.device().clone();
    let stream = device.stream().clone();
    device.with_blas(|blas| {
        let (pa, _ra) = a.0.slice().device_ptr(&stream);
        let (pb, _rb) = b.0.slice().device_ptr(&stream);
        let (pc, _rc) = c.0.slice_mut().device_ptr_mut(&stream);
        let (pa, pb, pc) = (
            pa + a.1.offset as u64 * size,
            pb + b.1.offset as u64 * size,
            pc + c.1 as u64 * size,
        );
        // SAFETY: the pointers are live device buffers holding every
        // element addressed (checked by the callers); alpha/beta point to
        // locals of the compute type's scale type; the handle runs on our
        // stream.
        let r = unsafe {
            cudarc::cublas::result::gemm_strided_batched_ex(
                *blas.handle(),
                trans(b.1.trans),
                trans(a.1.trans),
                n_,
                m_,
                k_,
                alpha,
                pb as *const c_void,
                data_type,
                ldb,
                b.1.stride as i64,
                pa as *const c_void,
                data_type,
                lda,
                a.1.stride as i64,
                beta,
                pc as *mut c_void,
                data_type,
                ldc,
                c.2 as i64,
                int(op, batch)?,
                compute,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        };
        r.map_err(|e| device.error("cublasGemmStridedBatchedEx", format!("{e:?}")))
    })
}

/// A new `[batch, m, n]` buffer `alpha·op(A)·op(B)` (beta is ignored);
/// [`gemm`] into fresh memory, kept with it.
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) fn matmul(
    a: &CudaBuffer,
    b: &CudaBuffer,
    shape: GemmShape,
    cfg: &GemmConfig,
) -> Result<CudaBuffer> {
    let len = shape.batch * shape.m * shape.n;
    if shape.k == 0 {
        // cuBLAS with k = 0 only scales C by beta: the empty sum is zeros.
        return CudaBuffer::zeros(a.device(), a.dtype(), len);
    }
    let mut c = CudaBuffer::alloc(a.device(), a.dtype(), len)?;
    let cfg = GemmConfig { beta: 0.0, ..*cfg };
    gemm(a, b, &mut c, shape, &cfg)?;
    Ok(c)
}
