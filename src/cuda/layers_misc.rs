//! Launch wrappers for embedding (`embedding.cu`). The fused attention softmax moved to
//! [`super::layers_attention`] and the optimizer updates to [`super::optim`];
//! both are re-exported here under their old paths.

use super::check::float_suffix;
use super::layers_util::expect;
use super::{CudaBuffer, CudaDevice};
use crate::Result;

// The fused attention softmax moved to `layers_attention.rs`; its old path
// stays valid.
pub use super::layers_attention::{attention_probs, attention_softmax_grad, AttnMask};

/// Checks host indices against a table of `num` rows, as i64.
fn indices(op: &'static str, idx: &[usize], num: usize) -> Result<Vec<i64>> {
    match idx.iter().find(|&&i| i >= num) {
        Some(&i) => Err(crate::Error::IndexOutOfRange {
            op,
            index: i as i64,
            size: num,
        }),
        None => Ok(idx.iter().map(|&i| i as i64).collect()),
    }
}

/// Embedding lookup: rows `idx` of the contiguous `[num, dim]` table `w`,
/// as a contiguous `[idx.len(), dim]` buffer.
pub fn embedding_forward(
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
        crate::tensor::cuda::uncounted(|| {
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
pub fn embedding_backward(
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
    crate::tensor::cuda::uncounted(|| {
        let d_rows = CudaBuffer::from_slice(dev, &rows)?;
        let d_starts = CudaBuffer::from_slice(dev, &starts)?;
        let d_pos = CudaBuffer::from_slice(dev, &pos)?;
        let (used, d) = (rows.len() as i64, dim as i64);
        launch!(dev, "embedding.cu", format!("embedding_bwd_{sfx}"), CudaDevice::grid_per_row(rows.len());
            &used, &d, gw.slice_mut(), g.slice(), d_rows.slice(), d_starts.slice(), d_pos.slice())
    })?;
    Ok(gw)
}
