//! `matmul` / `matmul_into` on CUDA: cuBLAS strided-batched GEMMs reading
//! the operands in place, exactly where the CPU's gemm reads them in place
//! (`cpu::gemm`: one unit stride in the matrix, no broadcast row or column —
//! anything else `cpu::matmul` has already made contiguous, on either
//! device): a row stride longer than a row is cuBLAS's leading dimension,
//! and the batch matrices (any batch strides, broadcast included) are
//! covered by one strided-batched call per run of evenly spaced ones. So a
//! product allocates on CUDA exactly what it allocates on the CPU.

use crate::cuda::gemm::{self, GemmConfig, GemmShape, MatrixView};
use crate::cuda::{elementwise, CudaBuffer};
use crate::tensor::cuda::{strided, wrap};
use crate::tensor::{Layout, Tensor};
use crate::Result;

/// An operand ready for cuBLAS: the tensor holding it, where each batch's
/// matrix starts in its buffer, its leading dimension and whether it is
/// stored transposed.
struct Operand {
    tensor: Tensor,
    offsets: Vec<usize>,
    ld: usize,
    trans: bool,
}

/// `t` as the `[batch.., rows, cols]` operand of a GEMM, read in place when
/// its matrix strides suit cuBLAS (as they suit the CPU's gemm).
fn operand(t: &Tensor, batch: &[usize], rows: usize, cols: usize) -> Result<Operand> {
    let nb = batch.len();
    let full = [batch, &[rows, cols]].concat();
    let l = t.layout().broadcast_to(&full)?;
    let (rs, cs) = (l.strides()[nb], l.strides()[nb + 1]);
    let offsets = |l: &Layout| {
        Layout::from_parts(batch.to_vec(), l.strides()[..nb].to_vec(), l.offset()).offsets()
    };
    let view = match crate::primitives::gemm_usable(rows, cols, rs, cs) {
        Some((rs, 1)) if rs >= cols.max(1) => Some((rs, false)),
        Some((1, cs)) if cs >= rows.max(1) => Some((cs, true)),
        _ => None,
    };
    if let Some((ld, trans)) = view {
        return Ok(Operand {
            tensor: t.clone(),
            offsets: offsets(&l)?,
            ld,
            trans,
        });
    }
    // Rows that overlap (a stride shorter than a row): cuBLAS cannot read
    // them, so they are copied. The CPU reads such a view in place; no
    // layer makes one.
    let copy = elementwise::copy_strided(&*t.storage().cuda()?, &strided(&l)?)?;
    let tensor = wrap(copy, &full)?;
    let offsets = offsets(tensor.layout())?;
    Ok(Operand {
        tensor,
        offsets,
        ld: cols.max(1),
        trans: false,
    })
}

/// The operands and GEMM sizes (`batch` = all batch matrices) of `a · b`
/// with product shape `shape`.
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
        stride_a: 0,
        stride_b: 0,
    };
    Ok((oa, ob, g))
}

/// The spacing from batch `i` to `i + 1` of `offsets` (`None`: backwards,
/// which one strided call cannot express).
fn step(offsets: &[usize], i: usize) -> Option<usize> {
    offsets[i + 1].checked_sub(offsets[i])
}

/// `dst[dst_offset..] = a · b` (`beta` 0) or `+=` (`beta` 1), `dst`
/// contiguous `[batch, m, n]`: one strided-batched GEMM per run of batch
/// matrices evenly spaced in both operands.
fn run(oa: &Operand, ob: &Operand, dst: &mut CudaBuffer, g: GemmShape, beta: f64) -> Result<()> {
    let cfg = GemmConfig {
        beta,
        tf32: crate::cuda::tf32_enabled(),
        ..GemmConfig::default()
    };
    let (da, db) = (oa.tensor.storage().cuda()?, ob.tensor.storage().cuda()?);
    let mut first = 0;
    while first < g.batch {
        let (mut last, mut sa, mut sb) = (first + 1, 0, 0);
        if let (Some(a), Some(b)) = (
            (last < g.batch).then(|| step(&oa.offsets, first)).flatten(),
            (last < g.batch).then(|| step(&ob.offsets, first)).flatten(),
        ) {
            (sa, sb) = (a, b);
            while last < g.batch
                && step(&oa.offsets, last - 1) == Some(sa)
                && step(&ob.offsets, last - 1) == Some(sb)
            {
                last += 1;
            }
        }
        let view = |o: &Operand, stride: usize| MatrixView {
            offset: o.offsets[first],
            stride,
            ld: o.ld,
            trans: o.trans,
        };
        let shape = GemmShape {
            batch: last - first,
            ..g
        };
        gemm::gemm_views(
            (&da, view(oa, sa)),
            (&db, view(ob, sb)),
            (dst, first * g.m * g.n),
            shape,
            &cfg,
        )?;
        first = last;
    }
    Ok(())
}

/// `a · b` as a new contiguous tensor of `shape`.
pub(crate) fn matmul(a: &Tensor, b: &Tensor, shape: &[usize]) -> Result<Tensor> {
    let (oa, ob, g) = plan(a, b, shape)?;
    let len = g.batch * g.m * g.n;
    let device = oa.tensor.storage().cuda()?.device().clone();
    let mut out = if g.k == 0 {
        // cuBLAS with k = 0 only scales C by beta: the empty sum is zeros.
        CudaBuffer::zeros(&device, a.dtype(), len)?
    } else {
        CudaBuffer::alloc(&device, a.dtype(), len)?
    };
    if g.k > 0 {
        run(&oa, &ob, &mut out, g, 0.0)?;
    }
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
    let beta = if accumulate { 1.0 } else { 0.0 };
    run(&oa, &ob, &mut *dst.storage().cuda_mut()?, g, beta)
}
