//! `matmul` / `matmul_into` on CUDA: cuBLAS strided-batched GEMMs. An
//! operand is read in place when it is a whole buffer, row-major or
//! transposed in its last two dims, with a single matrix or one per batch;
//! any other view is first made contiguous (broadcast batches expanded).

use super::gemm::{self, GemmConfig, GemmShape};
use super::tensor::{strided, wrap};
use super::{elementwise, CudaBuffer};
use crate::tensor::{Layout, Tensor};
use crate::Result;

/// An operand ready for cuBLAS: the tensor holding it, whether it is
/// stored transposed, and the elements between batch matrices (0: shared).
struct Operand {
    tensor: Tensor,
    trans: bool,
    stride: usize,
}

/// `t` as the `[batch.., rows, cols]` operand of a GEMM.
fn operand(t: &Tensor, batch: &[usize], rows: usize, cols: usize) -> Result<Operand> {
    let l = t.layout();
    let r = l.shape().len();
    let (sr, sc) = (l.strides()[r - 2], l.strides()[r - 1]);
    let whole = l.offset() == 0 && t.numel() == t.storage().len();
    let tb: usize = l.shape()[..r - 2].iter().product();
    let row_major = (cols == 1 || sc == 1) && (rows == 1 || sr == cols);
    let transposed = (rows == 1 || sr == 1) && (cols == 1 || sc == rows);
    let nb = batch.len();
    let own_batch = l.shape()[..r - 2].to_vec();
    let padded: Vec<usize> = std::iter::repeat_n(1, nb - own_batch.len())
        .chain(own_batch)
        .collect();
    if whole && tb <= 1 && (row_major || transposed) {
        return Ok(Operand {
            tensor: t.clone(),
            trans: !row_major,
            stride: 0,
        });
    }
    if whole && t.is_contiguous() && padded == batch {
        return Ok(Operand {
            tensor: t.clone(),
            trans: false,
            stride: rows * cols,
        });
    }
    // Any other view: a contiguous copy (broadcast batch dims expanded).
    let full = if tb <= 1 {
        vec![rows, cols]
    } else {
        [batch, &[rows, cols]].concat()
    };
    let bl: Layout = l.broadcast_to(&[&padded[..], &[rows, cols]].concat())?;
    let bl = if tb <= 1 {
        Layout::from_parts(vec![rows, cols], bl.strides()[nb..].to_vec(), bl.offset())
    } else {
        l.broadcast_to(&full)?
    };
    let copy = elementwise::copy_strided(&*t.storage().cuda()?, &strided(&bl)?)?;
    Ok(Operand {
        tensor: wrap(copy, &full)?,
        trans: false,
        stride: if tb <= 1 { 0 } else { rows * cols },
    })
}

/// The operands and GEMM sizes of `a · b` with product shape `shape`.
fn plan(a: &Tensor, b: &Tensor, shape: &[usize]) -> Result<(Operand, Operand, GemmShape)> {
    let nb = shape.len() - 2;
    let (m, n) = (shape[nb], shape[nb + 1]);
    let k = a.shape()[a.rank() - 1];
    let batch = &shape[..nb];
    let (oa, ob) = (operand(a, batch, m, k)?, operand(b, batch, k, n)?);
    let g = GemmShape {
        m,
        n,
        k,
        batch: batch.iter().product(),
        stride_a: oa.stride,
        stride_b: ob.stride,
    };
    Ok((oa, ob, g))
}

fn config(oa: &Operand, ob: &Operand, beta: f64) -> GemmConfig {
    GemmConfig {
        trans_a: oa.trans,
        trans_b: ob.trans,
        beta,
        tf32: super::tf32_enabled(),
        ..GemmConfig::default()
    }
}

/// `a · b` as a new contiguous tensor of `shape`.
pub(crate) fn matmul(a: &Tensor, b: &Tensor, shape: &[usize]) -> Result<Tensor> {
    let (oa, ob, g) = plan(a, b, shape)?;
    let (da, db) = (oa.tensor.storage().cuda()?, ob.tensor.storage().cuda()?);
    let out: CudaBuffer = gemm::matmul(&da, &db, g, &config(&oa, &ob, 0.0))?;
    wrap(out, shape)
}

/// `dst = a · b` or `dst += a · b` (`beta = 1`) in place; `dst` must be a
/// whole contiguous buffer (else `NotOnCuda`).
pub(crate) fn matmul_into(dst: &Tensor, a: &Tensor, b: &Tensor, accumulate: bool) -> Result<()> {
    let whole = dst.layout().offset() == 0 && dst.numel() == dst.storage().len();
    if !whole || !dst.is_contiguous() {
        return Err(crate::Error::NotOnCuda {
            op: "matmul_into a view",
            device: dst.device(),
        });
    }
    let (oa, ob, g) = plan(a, b, dst.shape())?;
    let (da, db) = (oa.tensor.storage().cuda()?, ob.tensor.storage().cuda()?);
    let beta = if accumulate { 1.0 } else { 0.0 };
    gemm::gemm(
        &da,
        &db,
        &mut *dst.storage().cuda_mut()?,
        g,
        &config(&oa, &ob, beta),
    )
}
