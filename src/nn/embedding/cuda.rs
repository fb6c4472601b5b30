//! Embedding on CUDA: the glue from tensors to device buffers and the
//! launch wrappers of `embedding.cu`. Indices come from the host (read and
//! checked there, as on the CPU); their uploads stay out of the ledger, so
//! both devices count the same bytes. The weight gradient is deterministic
//! and bit-identical to the CPU's: positions are grouped by row on the host
//! and one block sums a row in index order.

use crate::cuda::check::{expect, float_suffix};
use crate::cuda::{launch, CudaBuffer, CudaDevice};
use crate::memory::{with_category, Category};
use crate::tensor::cuda as tensor;
use crate::{Error, Result, Tensor};

/// `x` as a whole-buffer dense CUDA tensor (a Workspace copy of a view).
fn dense(x: &Tensor) -> Result<Tensor> {
    let _ws = with_category(Category::Workspace);
    tensor::dense(x)
}

/// Rows `idx[k]` of the `[num, dim]` weight (any layout) as a contiguous
/// tensor of `shape` (`idx.len() · dim` elements).
pub(super) fn gather(weight: &Tensor, idx: &[usize], shape: &[usize]) -> Result<Tensor> {
    let (num, dim) = (weight.shape()[0], weight.shape()[1]);
    let w = dense(weight)?;
    let out = embedding_forward(&*w.storage().cuda()?, num, dim, idx)?;
    tensor::wrap(out, shape)
}

/// The `[num, dim]` weight gradient from `g` (any layout).
pub(super) fn backward(
    g: &Tensor,
    idx: &[usize],
    num: usize,
    dim: usize,
    padding: Option<usize>,
) -> Result<Tensor> {
    let g = dense(g)?;
    let out = embedding_backward(&*g.storage().cuda()?, idx, num, dim, padding)?;
    tensor::wrap(out, &[num, dim])
}

/// Checks host indices against a table of `num` rows, as i64.
fn indices(op: &'static str, idx: &[usize], num: usize) -> Result<Vec<i64>> {
    match idx.iter().find(|&&i| i >= num) {
        Some(&i) => Err(Error::IndexOutOfRange {
            op,
            index: i as i64,
            size: num,
        }),
        None => Ok(idx.iter().map(|&i| i as i64).collect()),
    }
}

/// Embedding lookup: rows `idx` of the contiguous `[num, dim]` table `w`,
/// as a contiguous `[idx.len(), dim]` buffer.
pub(crate) fn embedding_forward(
    w: &CudaBuffer,
    num: usize,
    dim: usize,
    idx: &[usize],
) -> Result<CudaBuffer> {
    let op = "cuda embedding";
    let sfx = float_suffix(op, w.dtype())?;
    expect(op, w, w.dtype(), num * dim, w)?;
    let host = indices(op, idx, num)?;
    let mut out = CudaBuffer::alloc(w.device(), w.dtype(), idx.len() * dim)?;
    if !out.is_empty() {
        // The indices are host values on the CPU (read, never stored): the
        // upload stays out of the ledger so both devices count the same.
        tensor::uncounted(|| {
            let d_idx = CudaBuffer::from_slice(w.device(), &host)?;
            let (k, d) = (idx.len() as i64, dim as i64);
            launch!(w.device(), "embedding.cu", format!("embedding_fwd_{sfx}"), CudaDevice::grid_for(idx.len() * dim);
                &k, &d, out.slice_mut(), w.slice(), d_idx.slice())
        })?;
    }
    Ok(out)
}

/// The `[num, dim]` weight gradient from `g` (contiguous `[idx.len(),
/// dim]`): row `idx[k]` gets row `k` of `g` added, in `k` order, except
/// where `idx[k]` is `padding`. Deterministic and bit-identical to the CPU:
/// the positions are grouped by row on the host and one block sums a row.
pub(crate) fn embedding_backward(
    g: &CudaBuffer,
    idx: &[usize],
    num: usize,
    dim: usize,
    padding: Option<usize>,
) -> Result<CudaBuffer> {
    let op = "cuda embedding backward";
    let sfx = float_suffix(op, g.dtype())?;
    expect(op, g, g.dtype(), idx.len() * dim, g)?;
    indices(op, idx, num)?;
    let mut gw = CudaBuffer::zeros(g.device(), g.dtype(), num * dim)?;
    // Positions grouped by row (a stable sort keeps k order inside a row).
    let mut order: Vec<usize> = (0..idx.len())
        .filter(|&k| Some(idx[k]) != padding)
        .collect();
    order.sort_by_key(|&k| idx[k]);
    let (mut rows, mut starts) = (Vec::<i64>::new(), Vec::<i64>::new());
    for (q, &k) in order.iter().enumerate() {
        if rows.last() != Some(&(idx[k] as i64)) {
            rows.push(idx[k] as i64);
            starts.push(q as i64);
        }
    }
    starts.push(order.len() as i64);
    if rows.is_empty() || dim == 0 {
        return Ok(gw);
    }
    let pos: Vec<i64> = order.iter().map(|&k| k as i64).collect();
    let dev = g.device();
    // The row grouping is host bookkeeping on the CPU: its upload stays out
    // of the ledger, so both devices count the same bytes.
    tensor::uncounted(|| {
        let d_rows = CudaBuffer::from_slice(dev, &rows)?;
        let d_starts = CudaBuffer::from_slice(dev, &starts)?;
        let d_pos = CudaBuffer::from_slice(dev, &pos)?;
        let (used, d) = (rows.len() as i64, dim as i64);
        launch!(dev, "embedding.cu", format!("embedding_bwd_{sfx}"), CudaDevice::grid_per_row(rows.len());
            &used, &d, gw.slice_mut(), g.slice(), d_rows.slice(), d_starts.slice(), d_pos.slice())
    })?;
    Ok(gw)
}
