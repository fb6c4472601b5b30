//! Launch wrappers for the indexing kernels (`index.cu`): gather,
//! index_select and scatter-add along a dim, with i64 indices. An index out
//! of range is reported as [`Error::IndexOutOfRange`] by the next read from
//! the device: the kernels record it in the device's check record
//! (`cuda::checks`) and the wrappers do not wait.

use super::check::{self, float_suffix};
use super::{CudaBuffer, CudaDevice, Strided};
use crate::{DType, Error, Result};

/// The device's check record for an index kernel of `op` (see
/// `cuda::checks`): its address and `op`'s id. A bad index is reported by
/// the next read from the device, not by the launch.
fn check_record(x: &CudaBuffer, op: &'static str) -> Result<(u64, i64)> {
    x.device().check_record(op)
}

/// `out[.., i, ..] = x[.., index[.., i, ..], ..]` along `dim`: the result
/// has the index's shape (`li`); any dtype.
pub(crate) fn gather(
    x: &CudaBuffer,
    lx: &Strided,
    dim: usize,
    index: &CudaBuffer,
    li: &Strided,
) -> Result<CudaBuffer> {
    let op = "cuda gather";
    check::input(op, x, x.dtype(), lx, x)?;
    check::input(op, index, DType::I64, li, x)?;
    let (xs, is) = (lx.shape(), li.shape());
    check::dim(op, dim, xs.len())?;
    if xs.len() != is.len() || (0..xs.len()).any(|d| d != dim && is[d] > xs[d]) {
        return Err(Error::ShapeMismatch {
            op,
            lhs: xs,
            rhs: is,
        });
    }
    let n = li.numel();
    let mut out = CudaBuffer::alloc(x.device(), x.dtype(), n)?;
    if n == 0 {
        return Ok(out);
    }
    let record = check_record(x, "gather")?;
    let check: u64 = record.0;
    let check_op: i64 = record.1;
    let (d64, n64) = (dim as i64, n as i64);
    let name = format!("gather_{}", x.dtype().size_in_bytes());
    launch!(x.device(), "index.cu", name, CudaDevice::grid_for(n);
        &d64, &n64, out.slice_mut(), x.slice(), lx, index.slice(), li, &check, &check_op)?;
    Ok(out)
}

/// `out[.., i, ..] = x[.., index[i], ..]` along `dim` for a 1-D contiguous
/// i64 `index`: `x`'s shape with `dim` of size `index.len()`; any dtype.
pub(crate) fn index_select(
    x: &CudaBuffer,
    lx: &Strided,
    dim: usize,
    index: &CudaBuffer,
) -> Result<CudaBuffer> {
    let op = "cuda index_select";
    check::input(op, x, x.dtype(), lx, x)?;
    check::input(
        op,
        index,
        DType::I64,
        &Strided::contiguous(&[index.len()])?,
        x,
    )?;
    let mut shape = lx.shape();
    check::dim(op, dim, shape.len())?;
    shape[dim] = index.len();
    let lo = Strided::contiguous(&shape)?;
    let n = lo.numel();
    let mut out = CudaBuffer::alloc(x.device(), x.dtype(), n)?;
    if n == 0 {
        return Ok(out);
    }
    let record = check_record(x, "index_select")?;
    let check: u64 = record.0;
    let check_op: i64 = record.1;
    let (d64, n64) = (dim as i64, n as i64);
    let name = format!("index_select_{}", x.dtype().size_in_bytes());
    launch!(x.device(), "index.cu", name, CudaDevice::grid_for(n);
        &d64, &n64, out.slice_mut(), &lo, x.slice(), lx, index.slice(), &check, &check_op)?;
    Ok(out)
}

/// `out[.., index[.., i, ..], ..] += src[.., i, ..]` along `dim`, in place
/// through `out`'s layout `lo`; `index` (`li`) and `src` (`ls`) have one
/// shape. Float dtypes; atomic adds, so the order of additions (and the
/// last bits of f16/bf16/f32 sums) may vary from run to run.
pub(crate) fn scatter_add(
    out: &mut CudaBuffer,
    lo: &Strided,
    dim: usize,
    index: &CudaBuffer,
    li: &Strided,
    src: &CudaBuffer,
    ls: &Strided,
) -> Result<()> {
    let op = "cuda scatter_add";
    let sfx = float_suffix(op, out.dtype())?;
    check::input(op, out, out.dtype(), lo, out)?;
    check::input(op, index, DType::I64, li, out)?;
    check::input(op, src, out.dtype(), ls, out)?;
    check::same_shape(op, li, ls)?;
    let (os, is) = (lo.shape(), li.shape());
    check::dim(op, dim, os.len())?;
    if os.len() != is.len() || (0..os.len()).any(|d| d != dim && is[d] > os[d]) {
        return Err(Error::ShapeMismatch {
            op,
            lhs: os,
            rhs: is,
        });
    }
    let n = li.numel();
    if n == 0 {
        return Ok(());
    }
    let record = check_record(out, "scatter_add")?;
    let check: u64 = record.0;
    let check_op: i64 = record.1;
    let (d64, n64) = (dim as i64, n as i64);
    let device = out.device().clone();
    launch!(&device, "index.cu", format!("scatter_add_{sfx}"), CudaDevice::grid_for(n);
        &d64, &n64, out.slice_mut(), lo, src.slice(), ls, index.slice(), li, &check, &check_op)
}

/// The backward of max/min along `dim`: zeros of `shape` (contiguous, any
/// dtype) holding, for every element `p` of `g` (read through `lg`, the
/// keepdim shape), `g[p]` at index `indices[p]` along `dim`; `indices`
/// (U8, U32 or I64, read through `li` in the same row-major order) has
/// `g`'s element count. A negative I64 index reads as 0; one past the axis
/// is reported by the next read from the device (`IndexOutOfRange` of
/// `scatter_along`; the CPU's is `InvalidArgument` at the call). No two elements share a
/// target, so the result is exact.
pub(crate) fn scatter_along(
    g: &CudaBuffer,
    lg: &Strided,
    indices: &CudaBuffer,
    li: &Strided,
    shape: &[usize],
    dim: usize,
) -> Result<CudaBuffer> {
    let op = "cuda scatter_along";
    check::input(op, g, g.dtype(), lg, g)?;
    let isfx = match indices.dtype() {
        DType::U8 => "u8",
        DType::U32 => "u32",
        DType::I64 => "i64",
        dtype => return Err(Error::UnsupportedDType { op, dtype }),
    };
    check::input(op, indices, indices.dtype(), li, g)?;
    check::dim(op, dim, shape.len())?;
    let mut keep = shape.to_vec();
    keep[dim] = 1;
    if lg.shape() != keep || li.numel() != lg.numel() {
        return Err(Error::ShapeMismatch {
            op,
            lhs: keep,
            rhs: lg.shape(),
        });
    }
    let (len, inner) = (shape[dim], shape[dim + 1..].iter().product::<usize>());
    let mut out = CudaBuffer::zeros(g.device(), g.dtype(), shape.iter().product())?;
    let n = lg.numel();
    if n == 0 {
        return Ok(out);
    }
    let record = check_record(g, "scatter_along")?;
    let check: u64 = record.0;
    let check_op: i64 = record.1;
    let (len64, inner64, n64) = (len as i64, inner as i64, n as i64);
    let name = format!("scatter_along_{}_{isfx}", g.dtype().size_in_bytes());
    let (lg, li) = (lg.coalesced(), li.coalesced());
    launch!(g.device(), "index.cu", name, CudaDevice::grid_for(n);
        &len64, &inner64, &n64, out.slice_mut(), g.slice(), &lg, indices.slice(), &li,
        &check, &check_op)?;
    Ok(out)
}

/// Writes the contiguous `x` into `out` through `lo` (of `x`'s element
/// count; a layout that addresses each element once, such as a corner of
/// a contiguous layout), any dtype: a block placed into a larger tensor.
pub(crate) fn place(out: &mut CudaBuffer, lo: &Strided, x: &CudaBuffer) -> Result<()> {
    let op = "cuda place";
    check::input(op, out, x.dtype(), lo, x)?;
    let n = x.len();
    if lo.numel() != n {
        return Err(Error::ShapeMismatch {
            op,
            lhs: lo.shape(),
            rhs: vec![n],
        });
    }
    if n == 0 {
        return Ok(());
    }
    let n64 = n as i64;
    let name = format!("place_{}", x.dtype().size_in_bytes());
    let lo = lo.coalesced();
    let device = out.device().clone();
    launch!(&device, "index.cu", name, CudaDevice::grid_for(n);
        &n64, out.slice_mut(), &lo, x.slice())
}
