//! `Σᵢ x[i]·y[i]` over a broadcast batch: the weight gradient of a batched
//! product against an unbatched operand, without materializing the batch.

use super::gemm::{check_operands, matmul, matmul_into, matmul_shape, merged_stride};
use crate::tensor::{Layout, Tensor};
use crate::Result;

/// `Σᵢ x[i] · y[i]` over the broadcast batch of `x` `[.., p, q]` and `y`
/// `[.., q, r]`: a new `[p, r]` tensor, never materializing the per-batch
/// products. When the batch nests with `q` in both operands it is one
/// product with inner size `batch·q`; otherwise it accumulates batch by batch.
pub(crate) fn matmul_sum_batches(x: &Tensor, y: &Tensor) -> Result<Tensor> {
    check_operands(x, y)?;
    let shape = matmul_shape(x.shape(), y.shape())?;
    let nb = shape.len() - 2;
    let (batch, p, r) = (&shape[..nb], shape[nb], shape[nb + 1]);
    let q = x.shape()[x.rank() - 1];
    let xl = x.layout().broadcast_to(&[batch, &[p, q]].concat())?;
    let yl = y.layout().broadcast_to(&[batch, &[q, r]].concat())?;
    let dims = |l: &Layout, inner: usize| -> Vec<(usize, usize)> {
        batch
            .iter()
            .copied()
            .zip(l.strides()[..nb].iter().copied())
            .chain([(q, l.strides()[inner])])
            .collect()
    };
    if let (Some(xs), Some(ys)) = (
        merged_stride(&dims(&xl, nb + 1)),
        merged_stride(&dims(&yl, nb)),
    ) {
        let bq = batch.iter().product::<usize>() * q;
        let x2 = x.view_with_layout(Layout::from_parts(
            vec![p, bq],
            vec![xl.strides()[nb], xs],
            xl.offset(),
        ));
        let y2 = y.view_with_layout(Layout::from_parts(
            vec![bq, r],
            vec![ys, yl.strides()[nb + 1]],
            yl.offset(),
        ));
        return matmul(&x2, &y2);
    }
    let out = Tensor::zeros(&[p, r], x.dtype(), x.device())?;
    let offsets = |l: &Layout| {
        Layout::from_parts(batch.to_vec(), l.strides()[..nb].to_vec(), l.offset()).offsets()
    };
    for (i, (xo, yo)) in offsets(&xl)?.into_iter().zip(offsets(&yl)?).enumerate() {
        let xi = x.view_with_layout(Layout::from_parts(
            vec![p, q],
            xl.strides()[nb..].to_vec(),
            xo,
        ));
        let yi = y.view_with_layout(Layout::from_parts(
            vec![q, r],
            yl.strides()[nb..].to_vec(),
            yo,
        ));
        matmul_into(&out, &xi, &yi, i > 0)?;
    }
    Ok(out)
}
