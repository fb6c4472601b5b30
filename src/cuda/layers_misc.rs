//! Launch wrappers for embedding (`embedding.cu`), the fused attention
//! softmax (`attention.cu`) and the per-channel sum of conv bias gradients
//! (`conv.cu`). The optimizer updates moved to [`super::optim`].

use super::check::float_suffix;
use super::layers_util::{expect, invalid, stat_dtype};
use super::{CudaBuffer, CudaDevice};
use crate::memory::Category;
use crate::{DType, Result};

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
        let d_idx = CudaBuffer::from_slice(w.device(), &host)?;
        let (k, d) = (idx.len() as i64, dim as i64);
        launch!(w.device(), "embedding.cu", format!("embedding_fwd_{sfx}"), CudaDevice::grid_for(idx.len() * dim);
            &k, &d, out.slice_mut(), w.slice(), d_idx.slice())?;
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
    let _ws = crate::memory::with_category(Category::Workspace);
    let d_rows = CudaBuffer::from_slice(dev, &rows)?;
    let d_starts = CudaBuffer::from_slice(dev, &starts)?;
    let d_pos = CudaBuffer::from_slice(dev, &pos)?;
    let (used, d) = (rows.len() as i64, dim as i64);
    launch!(dev, "embedding.cu", format!("embedding_bwd_{sfx}"), CudaDevice::grid_per_row(rows.len());
        &used, &d, gw.slice_mut(), g.slice(), d_rows.slice(), d_starts.slice(), d_pos.slice())?;
    Ok(gw)
}

/// The mask of the fused attention softmax.
#[derive(Clone, Copy)]
pub enum AttnMask<'a> {
    /// No mask.
    None,
    /// An additive float mask of the scores' dtype, `[mask_rows, lk]`.
    Float(&'a CudaBuffer, usize),
    /// A U8 mask `[mask_rows, lk]`: 0 removes the position (−∞).
    Bool(&'a CudaBuffer, usize),
}

/// Probabilities of attention scores `s` (contiguous `[rows, lk]`, rows =
/// batch·heads·`lq`): `P = exp(scale·s + mask − lse)` per row, with causal
/// masking (`j > row % lq` removed); row `r` reads mask row `r % mask_rows`.
/// Returns `P` and the per-row log-sum-exp ([`stat_dtype`]; −∞ for a fully
/// masked row, whose probabilities are 0). With `lse_in`, that lse is used
/// instead (recomputing forward's `P` in backward) and returned unchanged.
pub fn attention_probs(
    s: &CudaBuffer,
    lq: usize,
    lk: usize,
    scale: f64,
    causal: bool,
    mask: AttnMask,
    lse_in: Option<CudaBuffer>,
) -> Result<(CudaBuffer, CudaBuffer)> {
    let op = "cuda attention softmax";
    let sfx = float_suffix(op, s.dtype())?;
    if lq == 0 || lk == 0 || !s.len().is_multiple_of(lq * lk) {
        return Err(invalid(
            op,
            format!("{} scores for lq {lq}, lk {lk}", s.len()),
        ));
    }
    let rows = s.len() / lk;
    let (kind, mrows, fm, bm) = match mask {
        AttnMask::None => (0i32, 0usize, s, s),
        AttnMask::Float(m, r) => (1, r, m, s),
        AttnMask::Bool(m, r) => (2, r, s, m),
    };
    if kind == 1 {
        expect(op, fm, s.dtype(), mrows * lk, s)?;
    }
    if kind == 2 {
        expect(op, bm, DType::U8, mrows * lk, s)?;
    }
    if kind != 0 && mrows == 0 {
        return Err(invalid(op, "a mask of 0 rows"));
    }
    let use_lse = i32::from(lse_in.is_some());
    let mut lse = match lse_in {
        Some(l) => {
            expect(op, &l, stat_dtype(s.dtype()), rows, s)?;
            l
        }
        None => CudaBuffer::alloc(s.device(), stat_dtype(s.dtype()), rows)?,
    };
    let mut p = CudaBuffer::alloc(s.device(), s.dtype(), s.len())?;
    let (r64, q64, k64, m64, c) = (
        rows as i64,
        lq as i64,
        lk as i64,
        mrows as i64,
        i32::from(causal),
    );
    launch!(s.device(), "attention.cu", format!("attn_probs_{sfx}"), CudaDevice::grid_per_row(rows);
        &r64, &q64, &k64, &scale, &c, &kind, &m64, &use_lse, p.slice_mut(), lse.slice_mut(),
        s.slice(), fm.slice(), bm.slice())?;
    Ok((p, lse))
}

/// The gradient of the scaled scores: `scale·P ⊙ (dP − Σ_j P ⊙ dP)` per
/// row of `lk` (contiguous `p`, `dp` of the same length).
pub fn attention_softmax_grad(
    p: &CudaBuffer,
    dp: &CudaBuffer,
    lk: usize,
    scale: f64,
) -> Result<CudaBuffer> {
    let op = "cuda attention softmax backward";
    let sfx = float_suffix(op, p.dtype())?;
    expect(op, dp, p.dtype(), p.len(), p)?;
    if lk == 0 || !p.len().is_multiple_of(lk) {
        return Err(invalid(op, format!("{} elements in rows of {lk}", p.len())));
    }
    let rows = p.len() / lk;
    let mut ds = CudaBuffer::alloc(p.device(), p.dtype(), p.len())?;
    if rows > 0 {
        let (r64, k64) = (rows as i64, lk as i64);
        launch!(p.device(), "attention.cu", format!("attn_softmax_bwd_{sfx}"), CudaDevice::grid_per_row(rows);
            &r64, &k64, &scale, ds.slice_mut(), p.slice(), dp.slice())?;
    }
    Ok(ds)
}

// The optimizer wrappers live in `super::optim`; re-exported here for the
// callers that named them through this module.
pub use super::optim::{adam_update, sgd_update, AdamParams, GradMap, SgdParams};

/// Per channel of `gy` (`[n, c, l]`): the sum over `n` and `l` in f64 (the
/// bias gradient), in `gy`'s dtype.
pub fn channel_sum(gy: &CudaBuffer, n: usize, c: usize, l: usize) -> Result<CudaBuffer> {
    let op = "cuda channel_sum";
    let sfx = float_suffix(op, gy.dtype())?;
    expect(op, gy, gy.dtype(), n * c * l, gy)?;
    let mut out = CudaBuffer::alloc(gy.device(), gy.dtype(), c)?;
    if c > 0 {
        let (n64, c64, l64) = (n as i64, c as i64, l as i64);
        launch!(gy.device(), "conv.cu", format!("channel_sum_{sfx}"), CudaDevice::grid_per_row(c);
            &n64, &c64, &l64, out.slice_mut(), gy.slice())?;
    }
    Ok(out)
}
