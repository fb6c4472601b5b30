//! Launch wrappers for reductions (`reduce.cu`).

use super::check::{self, float_suffix};
use super::{CudaBuffer, CudaDevice, Strided};
use crate::op_code::ReduceCode;
use crate::{DType, Error, Result};

/// Adjacent outputs one block of `reduce_cols_*` computes (`LG_RED_COLS`).
const COLS_PER_BLOCK: usize = 8;

/// `lx` reordered so that the kept dims come first and the reduced ones
/// last, with (outputs, elements per output) and the output shape.
fn split_dims(
    op: &'static str,
    lx: &Strided,
    dims: &[usize],
) -> Result<(Strided, usize, usize, Vec<usize>)> {
    let (shape, strides) = (lx.shape(), lx.strides());
    for &d in dims {
        check::dim(op, d, shape.len())?;
    }
    let reduced = |d: &usize| dims.contains(d);
    let order: Vec<usize> = (0..shape.len())
        .filter(|d| !reduced(d))
        .chain((0..shape.len()).filter(reduced))
        .collect();
    let kept: Vec<usize> = (0..shape.len())
        .filter(|d| !reduced(d))
        .map(|d| shape[d])
        .collect();
    let inner: usize = dims
        .iter()
        .collect::<std::collections::BTreeSet<_>>()
        .iter()
        .map(|&&d| shape[d])
        .product();
    let outer: usize = kept.iter().product();
    let permuted = Strided::new(
        &order.iter().map(|&d| shape[d]).collect::<Vec<_>>(),
        &order.iter().map(|&d| strides[d]).collect::<Vec<_>>(),
        lx.offset(),
    )?;
    Ok((permuted, outer, inner, kept))
}

/// Reduces dims `dims` of the float buffer `x` (layout `lx`). The result is
/// contiguous with the kept dims' shape (reduced dims removed; a keepdim
/// result is the same buffer with 1s put back in the shape).
pub(crate) fn reduce(
    op: ReduceCode,
    x: &CudaBuffer,
    lx: &Strided,
    dims: &[usize],
) -> Result<CudaBuffer> {
    let sfx = float_suffix("cuda reduce", x.dtype())?;
    check::input("cuda reduce", x, x.dtype(), lx, x)?;
    let (permuted, outer, inner, _) = split_dims("cuda reduce", lx, dims)?;
    // Same element order, fewer dims for the kernel to divide through.
    let permuted = permuted.coalesced();
    if inner == 0 && matches!(op, ReduceCode::Max | ReduceCode::Min) {
        return Err(Error::InvalidArgument {
            op: "cuda reduce",
            msg: format!("max/min over dims {dims:?} of size 0"),
        });
    }
    let mut out = CudaBuffer::alloc(x.device(), x.dtype(), outer)?;
    if outer == 0 {
        return Ok(out);
    }
    let code: i32 = op.kernel_code();
    let (o64, i64_) = (outer as i64, inner as i64);
    // One kept dim, its elements adjacent in memory (a sum over rows):
    // blocks of adjacent outputs whose warps read whole sectors of a row.
    let shape = permuted.shape();
    if let ([1, stride], true) = (&permuted.strides()[..], shape == [outer, inner]) {
        let (stride, offset) = (*stride as i64, permuted.offset() as i64);
        let groups = outer.div_ceil(COLS_PER_BLOCK);
        return launch!(x.device(), "reduce.cu", format!("reduce_cols_{sfx}"), CudaDevice::grid_per_row(groups);
            &code, &o64, &i64_, &stride, out.slice_mut(), x.slice(), &offset)
        .map(|()| out);
    }
    launch!(x.device(), "reduce.cu", format!("reduce_{sfx}"), CudaDevice::grid_per_row(outer);
        &code, &o64, &i64_, out.slice_mut(), x.slice(), &permuted)?;
    Ok(out)
}

/// The index along `dim` of the largest (`max`) or smallest element of
/// each lane, as i64, with `dim` removed: the first on ties, the first NaN
/// if a lane holds one (as the CPU). Every dtype (integers compare exactly).
pub(crate) fn arg_reduce(
    x: &CudaBuffer,
    lx: &Strided,
    dim: usize,
    max: bool,
) -> Result<CudaBuffer> {
    let sfx = check::suffix(x.dtype());
    check::input("cuda argmax", x, x.dtype(), lx, x)?;
    let (permuted, outer, inner, _) = split_dims("cuda argmax", lx, &[dim])?;
    let permuted = permuted.coalesced();
    if inner == 0 {
        return Err(Error::InvalidArgument {
            op: "cuda argmax",
            msg: format!("dim {dim} has size 0"),
        });
    }
    let mut out = CudaBuffer::alloc(x.device(), DType::I64, outer)?;
    if outer == 0 {
        return Ok(out);
    }
    let (want, o64, i64_) = (i32::from(max), outer as i64, inner as i64);
    launch!(x.device(), "reduce.cu", format!("argreduce_{sfx}"), CudaDevice::grid_per_row(outer);
        &want, &o64, &i64_, out.slice_mut(), x.slice(), &permuted)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    /// The launch sizes its grid by the kernel's own column count.
    #[test]
    fn the_column_block_matches_the_kernels() {
        let src = include_str!("../../kernels/reduce.cu");
        assert_eq!(
            crate::cuda::testing::cu_define(src, "LG_RED_COLS"),
            super::COLS_PER_BLOCK
        );
    }
}
