//! Launch wrappers for the elementwise kernels (`elementwise.cu`,
//! `compare.cu`, `cast.cu`, `copy.cu`). Inputs are read through a
//! [`Strided`] layout (any strides, broadcasting by stride 0); outputs are
//! new contiguous buffers of the layout's shape, counted under the current
//! category.

use super::check::{self, float_suffix, suffix};
use super::{CudaBuffer, CudaDevice, Strided};
use crate::op_code::{BinaryOp, CompareOp, UnaryOp};
use crate::{DType, Result, WithDType};

/// `op(x)` for every element of the float buffer `x` read through `lx`.
pub(crate) fn unary(op: UnaryOp, x: &CudaBuffer, lx: &Strided) -> Result<CudaBuffer> {
    let sfx = float_suffix("cuda unary", x.dtype())?;
    check::input("cuda unary", x, x.dtype(), lx, x)?;
    let n = lx.numel();
    let mut out = CudaBuffer::alloc(x.device(), x.dtype(), n)?;
    if n == 0 {
        return Ok(out);
    }
    // Typed lets: the op code and its scalars as the kernel's int, double, double.
    let op_code = op.code(x.dtype());
    let code: i32 = op_code.0;
    let param: f64 = op_code.1;
    let param2: f64 = op_code.2;
    let n64 = n as i64;
    let lx = lx.coalesced();
    launch!(x.device(), "elementwise.cu", format!("unary_{sfx}"), CudaDevice::grid_for(n);
        &code, &param, &param2, &n64, out.slice_mut(), x.slice(), &lx)?;
    Ok(out)
}

/// `x[range] = op(x[range])` in place on the float buffer `x`, with no
/// temporary: what an in-place op (`relu_`, `clamp_`…) allocates on the
/// CPU, nothing.
pub(crate) fn unary_inplace(
    op: UnaryOp,
    x: &mut CudaBuffer,
    range: std::ops::Range<usize>,
) -> Result<()> {
    let sfx = float_suffix("cuda unary_inplace", x.dtype())?;
    if range.end > x.len() || range.start > range.end {
        return Err(crate::Error::InvalidArgument {
            op: "cuda unary_inplace",
            msg: format!("range {range:?} of a buffer of {}", x.len()),
        });
    }
    let n = range.len();
    if n == 0 {
        return Ok(());
    }
    // Typed lets: the op code and its scalars as the kernel's int, double, double.
    let op_code = op.code(x.dtype());
    let code: i32 = op_code.0;
    let param: f64 = op_code.1;
    let param2: f64 = op_code.2;
    let (start, n64) = (range.start as i64, n as i64);
    let device = x.device().clone();
    launch!(&device, "elementwise.cu", format!("unary_inplace_{sfx}"), CudaDevice::grid_for(n);
        &code, &param, &param2, &start, &n64, x.slice_mut())
}

/// `op(a, b)` elementwise; `la` and `lb` must have the output's shape
/// (use [`super::broadcast_strides`] to broadcast).
pub(crate) fn binary(
    op: BinaryOp,
    a: &CudaBuffer,
    la: &Strided,
    b: &CudaBuffer,
    lb: &Strided,
) -> Result<CudaBuffer> {
    let sfx = float_suffix("cuda binary", a.dtype())?;
    check::same_shape("cuda binary", la, lb)?;
    check::input("cuda binary", a, a.dtype(), la, a)?;
    check::input("cuda binary", b, a.dtype(), lb, a)?;
    let n = la.numel();
    let mut out = CudaBuffer::alloc(a.device(), a.dtype(), n)?;
    if n == 0 {
        return Ok(out);
    }
    let op_code = op.code();
    let code: i32 = op_code.0;
    let param: f64 = op_code.1;
    let n64 = n as i64;
    let (la, lb) = (la.coalesced(), lb.coalesced());
    launch!(a.device(), "elementwise.cu", format!("binary_{sfx}"), CudaDevice::grid_for(n);
        &code, &param, &n64, out.slice_mut(), a.slice(), &la, b.slice(), &lb)?;
    Ok(out)
}

/// `x[range] = op(x[range], b)` in place (`b` read through `lb`, which has
/// the range's length), allocating nothing.
pub(crate) fn binary_inplace(
    op: BinaryOp,
    x: &mut CudaBuffer,
    range: std::ops::Range<usize>,
    b: &CudaBuffer,
    lb: &Strided,
) -> Result<()> {
    let sfx = float_suffix("cuda binary_inplace", x.dtype())?;
    check::input("cuda binary_inplace", b, x.dtype(), lb, x)?;
    if range.end > x.len() || range.start > range.end || lb.numel() != range.len() {
        return Err(crate::Error::InvalidArgument {
            op: "cuda binary_inplace",
            msg: format!(
                "range {range:?} of a buffer of {} with an operand of {} elements",
                x.len(),
                lb.numel()
            ),
        });
    }
    let n = range.len();
    if n == 0 {
        return Ok(());
    }
    let op_code = op.code();
    let code: i32 = op_code.0;
    let param: f64 = op_code.1;
    let (start, n64) = (range.start as i64, n as i64);
    let lb: Strided = lb.coalesced();
    let device = x.device().clone();
    launch!(&device, "elementwise.cu", format!("binary_inplace_{sfx}"), CudaDevice::grid_for(n);
        &code, &param, &start, &n64, x.slice_mut(), b.slice(), &lb)
}

/// `acc += alpha · x` in place (`acc` contiguous, `x` read through `lx` of
/// `acc`'s length): how gradients of a value used twice are summed, in runs
/// of 4 elements per thread (`axpy_dense_*` where `x` is contiguous from
/// its start).
pub(crate) fn axpy(acc: &mut CudaBuffer, alpha: f64, x: &CudaBuffer, lx: &Strided) -> Result<()> {
    let sfx = float_suffix("cuda axpy", acc.dtype())?;
    check::input("cuda axpy", x, acc.dtype(), lx, acc)?;
    let n = acc.len();
    if lx.numel() != n {
        return Err(crate::Error::ShapeMismatch {
            op: "cuda axpy",
            lhs: vec![n],
            rhs: lx.shape(),
        });
    }
    if n == 0 {
        return Ok(());
    }
    let n64 = n as i64;
    let device = acc.device().clone();
    let lx = lx.coalesced();
    if lx.strides() == [1] && lx.offset() == 0 {
        let vec = i32::from(check::runs_aligned(&[Some(acc), Some(x)]));
        return launch!(&device, "elementwise.cu", format!("axpy_dense_{sfx}"), check::runs_grid(n);
            &n64, &alpha, &vec, acc.slice_mut(), x.slice());
    }
    let vec = i32::from(check::runs_aligned(&[Some(acc)]));
    launch!(&device, "elementwise.cu", format!("axpy_{sfx}"), check::runs_grid(n);
        &n64, &alpha, &vec, acc.slice_mut(), x.slice(), &lx)
}

/// `op(a, b)` as u8 for buffers of any (equal) dtype; `la`, `lb` of the
/// output's shape.
pub(crate) fn compare(
    op: CompareOp,
    a: &CudaBuffer,
    la: &Strided,
    b: &CudaBuffer,
    lb: &Strided,
) -> Result<CudaBuffer> {
    check::same_shape("cuda compare", la, lb)?;
    check::input("cuda compare", a, a.dtype(), la, a)?;
    check::input("cuda compare", b, a.dtype(), lb, a)?;
    let n = la.numel();
    let mut out = CudaBuffer::alloc(a.device(), DType::U8, n)?;
    if n == 0 {
        return Ok(out);
    }
    let code: i32 = op.kernel_code();
    let n64 = n as i64;
    let name = format!("compare_{}", suffix(a.dtype()));
    let (la, lb) = (la.coalesced(), lb.coalesced());
    launch!(a.device(), "compare.cu", name, CudaDevice::grid_for(n);
        &code, &n64, out.slice_mut(), a.slice(), &la, b.slice(), &lb)?;
    Ok(out)
}

/// `op(a, s)` as u8, comparing each element (as f64) with the scalar.
pub(crate) fn compare_scalar(
    op: CompareOp,
    a: &CudaBuffer,
    la: &Strided,
    s: f64,
) -> Result<CudaBuffer> {
    check::input("cuda compare_scalar", a, a.dtype(), la, a)?;
    let n = la.numel();
    let mut out = CudaBuffer::alloc(a.device(), DType::U8, n)?;
    if n == 0 {
        return Ok(out);
    }
    let code: i32 = op.kernel_code();
    let n64 = n as i64;
    let name = format!("compare_scalar_{}", suffix(a.dtype()));
    let la = la.coalesced();
    launch!(a.device(), "compare.cu", name, CudaDevice::grid_for(n);
        &code, &s, &n64, out.slice_mut(), a.slice(), &la)?;
    Ok(out)
}

/// `cond ? a : b` elementwise (`cond` u8; `a`, `b` of one dtype); all three
/// layouts of the output's shape.
pub(crate) fn where_cond(
    cond: &CudaBuffer,
    lc: &Strided,
    a: &CudaBuffer,
    la: &Strided,
    b: &CudaBuffer,
    lb: &Strided,
) -> Result<CudaBuffer> {
    check::same_shape("cuda where", lc, la)?;
    check::same_shape("cuda where", lc, lb)?;
    check::input("cuda where", cond, DType::U8, lc, a)?;
    check::input("cuda where", a, a.dtype(), la, a)?;
    check::input("cuda where", b, a.dtype(), lb, a)?;
    let n = lc.numel();
    let mut out = CudaBuffer::alloc(a.device(), a.dtype(), n)?;
    if n == 0 {
        return Ok(out);
    }
    let n64 = n as i64;
    let name = format!("where_{}", a.dtype().size_in_bytes());
    let (lc, la, lb) = (lc.coalesced(), la.coalesced(), lb.coalesced());
    launch!(a.device(), "compare.cu", name, CudaDevice::grid_for(n);
        &n64, out.slice_mut(), cond.slice(), &lc, a.slice(), &la, b.slice(), &lb)?;
    Ok(out)
}

/// `x` converted to `to` (Rust `as` semantics through f64, like the CPU).
pub(crate) fn cast(x: &CudaBuffer, lx: &Strided, to: DType) -> Result<CudaBuffer> {
    check::input("cuda cast", x, x.dtype(), lx, x)?;
    let n = lx.numel();
    let mut out = CudaBuffer::alloc(x.device(), to, n)?;
    if n == 0 {
        return Ok(out);
    }
    let n64 = n as i64;
    let name = format!("cast_{}_{}", suffix(x.dtype()), suffix(to));
    let lx = lx.coalesced();
    launch!(x.device(), "cast.cu", name, CudaDevice::grid_for(n);
        &n64, out.slice_mut(), x.slice(), &lx)?;
    Ok(out)
}

/// The whole of `x` converted to `to`, a dtype of the same element size
/// (F16 ⇄ BF16, F32 ⇄ U32, F64 ⇄ I64), where it is: each element is read
/// and its conversion written over it (Rust `as` semantics through f64, as
/// [`cast`]), and the buffer becomes a buffer of `to`. No allocation.
pub(crate) fn cast_inplace(x: &mut CudaBuffer, to: DType) -> Result<()> {
    if x.dtype().size_in_bytes() != to.size_in_bytes() || x.dtype() == to {
        return Err(crate::Error::InvalidArgument {
            op: "cuda cast_inplace",
            msg: format!("no in-place cast from {:?} to {to:?}", x.dtype()),
        });
    }
    let n = x.len();
    if n > 0 {
        let n64 = n as i64;
        let name = format!("cast_inplace_{}_{}", suffix(x.dtype()), suffix(to));
        let device = x.device().clone();
        launch!(&device, "cast.cu", name, CudaDevice::grid_for(n); &n64, x.slice_mut())?;
    }
    x.retype(to)
}

/// A contiguous copy of `x` read through `lx` (make contiguous), any dtype:
/// runs of 4 elements per thread, moved as vectors where contiguous.
pub(crate) fn copy_strided(x: &CudaBuffer, lx: &Strided) -> Result<CudaBuffer> {
    check::input("cuda copy_strided", x, x.dtype(), lx, x)?;
    let n = lx.numel();
    let mut out = CudaBuffer::alloc(x.device(), x.dtype(), n)?;
    if n == 0 {
        return Ok(out);
    }
    let n64 = n as i64;
    let name = format!("copy_strided_{}", x.dtype().size_in_bytes());
    let lx = lx.coalesced();
    let vec = i32::from(check::runs_aligned(&[Some(&out)]));
    launch!(x.device(), "copy.cu", name, check::runs_grid(n);
        &n64, &vec, out.slice_mut(), x.slice(), &lx)?;
    Ok(out)
}

/// Sets every element of `buf` to `value` (whose type must be the buffer's):
/// one launch, nothing uploaded (`Tensor::full` and `ones` on CUDA, such
/// as the seed of `backward`).
pub(crate) fn fill<T: WithDType>(buf: &mut CudaBuffer, value: T) -> Result<()> {
    if T::DTYPE != buf.dtype() {
        return Err(crate::Error::DTypeMismatch {
            op: "cuda fill",
            expected: buf.dtype(),
            got: T::DTYPE,
        });
    }
    let n = buf.len();
    if n == 0 {
        return Ok(());
    }
    // The element's bits, widened to u64 (the kernel narrows them back).
    let mut bits = [0u8; 8];
    let size = std::mem::size_of::<T>();
    // SAFETY: `T` is plain data of `size` <= 8 bytes (see `WithDType`).
    let raw = unsafe { std::slice::from_raw_parts((&value as *const T).cast::<u8>(), size) };
    bits[..size].copy_from_slice(raw);
    let (bits, n64) = (u64::from_le_bytes(bits), n as i64);
    let name = format!("fill_{size}");
    let device = buf.device().clone();
    launch!(&device, "copy.cu", name, CudaDevice::grid_for(n); &n64, buf.slice_mut(), &bits)
}
