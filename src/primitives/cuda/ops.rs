//! The CUDA arms of the shared primitives (`src/primitives/`): each takes tensors
//! (CUDA storages + layouts), calls one launch wrapper and wraps the output.
//! Outputs are allocated exactly as the CPU kernels allocate theirs, so a
//! program moves the CUDA ledger as it moves the CPU's.

use crate::cuda::elementwise as ew;
use crate::cuda::reduce as red;
use crate::op_code::ReduceCode;
use crate::op_code::{BinaryOp, CompareOp, UnaryOp};
use crate::primitives::CmpOp;
use crate::tensor::cuda::{adopt, contiguous, map, strided, uncounted, wrap};
use crate::tensor::{Backing, Layout};
use crate::{DType, Error, Result, Tensor};

/// The typed error for `op` on `t`'s device.
fn missing(op: &'static str, t: &Tensor) -> Error {
    Error::NotOnCuda {
        op,
        device: t.device(),
    }
}

/// `op(x)` elementwise; `None` (a kernel without a CUDA form) is `NotOnCuda`.
pub(crate) fn unary(x: &Tensor, op: Option<UnaryOp>, name: &'static str) -> Result<Tensor> {
    let op = op.ok_or_else(|| missing(name, x))?;
    map(x, x.shape(), |b, l| ew::unary(op, b, l))
}

/// `op(a, b)` over the broadcast layouts `la`, `lb` of `shape`.
pub(crate) fn binary(
    a: &Tensor,
    la: &Layout,
    b: &Tensor,
    lb: &Layout,
    shape: &[usize],
    op: Option<BinaryOp>,
    name: &'static str,
) -> Result<Tensor> {
    let op = op.ok_or_else(|| missing(name, a))?;
    let (sa, sb) = (strided(la)?, strided(lb)?);
    let out = ew::binary(op, &*a.storage().cuda()?, &sa, &*b.storage().cuda()?, &sb)?;
    wrap(out, shape)
}

/// `dst = op(dst, src)` in place (`dst` contiguous at `range`, `src`
/// broadcast by `lsrc`; different storages). Add and subtract over a whole
/// buffer (gradient accumulation) are one `axpy` with no temporary; other
/// ops compute a temporary and copy it in.
pub(crate) fn binary_assign(
    dst: &Tensor,
    range: std::ops::Range<usize>,
    src: &Tensor,
    lsrc: &Layout,
    op: Option<BinaryOp>,
    name: &'static str,
) -> Result<()> {
    let op = op.ok_or_else(|| missing(name, dst))?;
    let alpha = match op {
        BinaryOp::Add => Some(1.0),
        BinaryOp::Sub => Some(-1.0),
        _ => None,
    };
    let whole = range.start == 0 && range.len() == dst.storage().len();
    if let (Some(alpha), true) = (alpha, whole) {
        let ls = strided(lsrc)?;
        let s = src.storage().cuda()?;
        return ew::axpy(&mut *dst.storage().cuda_mut()?, alpha, &s, &ls);
    }
    let ls = strided(lsrc)?;
    let s = src.storage().cuda()?;
    ew::binary_inplace(op, &mut *dst.storage().cuda_mut()?, range, &s, &ls)
}

/// `x = op(x)` in place on the contiguous `x`, with no temporary (the
/// CPU's in-place kernels allocate nothing, so neither may this).
pub(crate) fn unary_assign(x: &Tensor, op: Option<UnaryOp>, name: &'static str) -> Result<()> {
    let op = op.ok_or_else(|| missing(name, x))?;
    let range = x
        .layout()
        .contiguous_range()
        .ok_or(Error::InvalidArgument {
            op: name,
            msg: "in-place destination must be contiguous".into(),
        })?;
    ew::unary_inplace(op, &mut *x.storage().cuda_mut()?, range)
}

fn compare_op(op: CmpOp) -> CompareOp {
    match op {
        CmpOp::Eq => CompareOp::Eq,
        CmpOp::Ne => CompareOp::Ne,
        CmpOp::Lt => CompareOp::Lt,
        CmpOp::Le => CompareOp::Le,
        CmpOp::Gt => CompareOp::Gt,
        CmpOp::Ge => CompareOp::Ge,
    }
}

/// `op(a, b)` as U8 1/0 over broadcast layouts of `shape`.
pub(crate) fn compare(
    a: &Tensor,
    la: &Layout,
    b: &Tensor,
    lb: &Layout,
    shape: &[usize],
    op: CmpOp,
) -> Result<Tensor> {
    let (sa, sb) = (strided(la)?, strided(lb)?);
    let (da, db) = (a.storage().cuda()?, b.storage().cuda()?);
    wrap(ew::compare(compare_op(op), &da, &sa, &db, &sb)?, shape)
}

/// `op(x, s)` as U8 1/0.
pub(crate) fn compare_scalar(x: &Tensor, s: f64, op: CmpOp) -> Result<Tensor> {
    map(x, x.shape(), |b, l| {
        ew::compare_scalar(compare_op(op), b, l, s)
    })
}

/// `cond ? a : b` over broadcast layouts of `shape`.
pub(crate) fn select(
    cond: (&Tensor, &Layout),
    a: (&Tensor, &Layout),
    b: (&Tensor, &Layout),
    shape: &[usize],
) -> Result<Tensor> {
    let (lc, la, lb) = (strided(cond.1)?, strided(a.1)?, strided(b.1)?);
    let dc = cond.0.storage().cuda()?;
    let (da, db) = (a.0.storage().cuda()?, b.0.storage().cuda()?);
    wrap(ew::where_cond(&dc, &lc, &da, &la, &db, &lb)?, shape)
}

/// `x` converted to `dtype`.
pub(crate) fn cast(x: &Tensor, dtype: DType) -> Result<Tensor> {
    map(x, x.shape(), |b, l| ew::cast(b, l, dtype))
}

/// The device buffer of a storage converted to `dtype` (of the same element
/// size) where it is, by the in-place cast kernel.
pub(crate) fn cast_in_place(backing: &mut Backing, dtype: DType) -> Result<()> {
    match backing {
        Backing::Cuda(buffer) => {
            ew::cast_inplace(buffer.get_mut().unwrap_or_else(|e| e.into_inner()), dtype)
        }
        _ => Err(Error::InvalidArgument {
            op: "cuda cast_inplace",
            msg: "the storage is not on a CUDA device".into(),
        }),
    }
}

/// The dims of `x` that reduce to `out_shape` (same rank).
fn reduced_dims(x: &Tensor, out_shape: &[usize]) -> Vec<usize> {
    (0..x.rank())
        .filter(|&d| out_shape[d] == 1 && x.shape()[d] != 1)
        .collect()
}

/// `scale ·` the sum of `x` reduced to `out_shape`; a scale of one over
/// the reduced count is the mean kernel.
pub(crate) fn sum_scaled(x: &Tensor, out_shape: &[usize], scale: f64) -> Result<Tensor> {
    let dims = reduced_dims(x, out_shape);
    let count: usize = dims.iter().map(|&d| x.shape()[d]).product();
    if dims.is_empty() {
        return if scale == 1.0 {
            contiguous(x)
        } else {
            unary(x, Some(UnaryOp::Scale(scale)), "sum")
        };
    }
    let op = if scale == 1.0 {
        ReduceCode::Sum
    } else if scale == 1.0 / count as f64 {
        ReduceCode::Mean
    } else {
        let sum = sum_scaled(x, out_shape, 1.0)?;
        return unary(&sum, Some(UnaryOp::Scale(scale)), "sum");
    };
    map(x, out_shape, |b, l| red::reduce(op, b, l, &dims))
}

/// The maximum (`max`) or minimum of `x` reduced to `out_shape`.
pub(crate) fn extremum_to(x: &Tensor, out_shape: &[usize], max: bool) -> Result<Tensor> {
    let dims = reduced_dims(x, out_shape);
    if dims.is_empty() {
        return contiguous(x);
    }
    let op = if max {
        ReduceCode::Max
    } else {
        ReduceCode::Min
    };
    map(x, out_shape, |b, l| red::reduce(op, b, l, &dims))
}

/// The index of the extremum of every lane along `dim` (read back to the
/// host, as the CPU kernel returns them) and, when asked for, the values
/// as a tensor of `lanes` (the keepdim shape): the elements at those
/// indices, gathered on the device, so that they are the CPU's exactly
/// (the first of tied -0/+0, the NaN itself) and any dtype works. The
/// device copy of the indices is uncounted, as the CPU's host vector is.
pub(crate) fn arg_extremum(
    x: &Tensor,
    dim: usize,
    max: bool,
    values: bool,
    lanes: &[usize],
) -> Result<(Vec<usize>, Option<Tensor>)> {
    let lx = strided(x.layout())?;
    let (idx, vals) = uncounted(|| {
        let dx = x.storage().cuda()?;
        let idx = red::arg_reduce(&dx, &lx, dim, max)?;
        let li = crate::cuda::Strided::contiguous(lanes)?;
        let vals = values
            .then(|| crate::cuda::index::gather(&dx, &lx, dim, &idx, &li))
            .transpose()?;
        Ok((idx.to_vec::<i64>()?, vals))
    })?;
    let vals = vals.map(|v| adopt(v, lanes)).transpose()?;
    Ok((idx.into_iter().map(|i| i as usize).collect(), vals))
}
