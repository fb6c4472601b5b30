//! Attention on CUDA: the glue from tensors to device buffers and the
//! launch wrappers of the fused attention softmax (`attention.cu`): scaled,
//! masked scores to probabilities with the per-row log-sum-exp (or from a
//! given one, recomputing forward's probabilities in backward), and the
//! softmax backward of attention. Semantics are `cpu.rs`'s; the GEMMs
//! around them are the shared matmul (cuBLAS).

use super::{RowLse, ScoreGeom, ScoreSpec};
use crate::cuda::check::{expect, float_suffix, invalid};
use crate::cuda::{elementwise, launch, CudaBuffer, CudaDevice};
use crate::dtype::stat_dtype;
use crate::memory::{with_category, Category};
use crate::op_code::MaskCode;
use crate::tensor::cuda as tensor;
use crate::tensor::Layout;
use crate::{DType, Result, Tensor};

// SAFETY: ScoreGeom is #[repr(C)] plain data, laid out as attention.cu's
// `struct ScoreGeom`.
unsafe impl cudarc::driver::DeviceRepr for ScoreGeom {}

/// The per-row log-sum-exp on the device.
pub(super) enum DeviceLse {
    /// A `[rows]` tensor of the lse dtype on the scores' device.
    Tensor(Tensor),
    /// A `[rows]` device buffer the forward just wrote, outside the ledger
    /// (as the CPU's host values are) until [`DeviceLse::into_tensor`].
    Uncounted(CudaBuffer),
}

impl DeviceLse {
    /// As a `[rows]` tensor of `dtype` (an uncounted buffer is counted now).
    pub(super) fn into_tensor(self, dtype: DType) -> Result<Tensor> {
        match self {
            DeviceLse::Tensor(t) => t.to_dtype(dtype),
            DeviceLse::Uncounted(b) => {
                let rows = b.len();
                tensor::adopt(b, &[rows])?.to_dtype(dtype)
            }
        }
    }
}

/// The mask of the fused attention softmax; `rows` is the number of mask
/// rows of `lk` elements (score row `r` reads mask row `r % rows`).
#[derive(Clone, Copy)]
pub(crate) enum AttnMask<'a> {
    /// No mask.
    None,
    /// An additive float mask of the scores' dtype, `[rows, lk]`.
    Float(&'a CudaBuffer, usize),
    /// An additive F64 mask `[rows, lk]` (a float mask of another dtype,
    /// converted exactly, as the CPU reads every mask in f64).
    F64(&'a CudaBuffer, usize),
    /// A U8 mask `[rows, lk]`: 0 removes the position (−∞).
    Bool(&'a CudaBuffer, usize),
}

/// Probabilities of attention scores `s` (contiguous `[rows, lk]`, rows =
/// batch·heads·`lq`): `P = exp(scale·s + mask − lse)` per row, with causal
/// masking (`j > row % lq` removed); row `r` reads mask row `r % rows` of
/// the mask. Returns `P` and, when `lse_in` is `None`, the per-row
/// log-sum-exp it computed ([`stat_dtype`]; −∞ for a fully masked row,
/// whose probabilities are 0), uncounted. With `lse_in` (`rows` values of
/// [`stat_dtype`], a saved tensor's buffer, not copied), that lse is used
/// instead: forward's `P` bit for bit.
pub(crate) fn attention_probs(
    s: &CudaBuffer,
    geom: ScoreGeom,
    mask: AttnMask,
    lse_in: Option<&CudaBuffer>,
) -> Result<(CudaBuffer, Option<CudaBuffer>)> {
    let op = "cuda attention softmax";
    let sfx = float_suffix(op, s.dtype())?;
    let (lq, lk) = (geom.lq, geom.lk);
    if lq == 0 || lk == 0 || !s.len().is_multiple_of(lq * lk) {
        return Err(invalid(
            op,
            format!("{} scores for lq {lq}, lk {lk}", s.len()),
        ));
    }
    let rows = s.len() / lk;
    // Unused mask pointers point at `s` (never read: the kind selects).
    let (kind, mrows, fm, bm, dm) = match mask {
        AttnMask::None => (MaskCode::None, 0usize, s, s, s),
        AttnMask::Float(m, r) => {
            expect(op, m, s.dtype(), r * lk, s)?;
            (MaskCode::Float, r, m, s, s)
        }
        AttnMask::Bool(m, r) => {
            expect(op, m, DType::U8, r * lk, s)?;
            (MaskCode::Bool, r, s, m, s)
        }
        AttnMask::F64(m, r) => {
            expect(op, m, DType::F64, r * lk, s)?;
            (MaskCode::F64, r, s, s, m)
        }
    };
    if kind != MaskCode::None && mrows == 0 {
        return Err(invalid(op, "a mask of 0 rows"));
    }
    let mut p = CudaBuffer::alloc(s.device(), s.dtype(), s.len())?;
    let (r64, m64) = (rows as i64, mrows as i64);
    let kind: i32 = kind.kernel_code();
    let name = format!("attn_probs_{sfx}");
    let cfg = CudaDevice::grid_per_row(rows);
    // Parameters: (ScoreGeom g, i64 rows, i32 kind, i64 mask_rows,
    // i32 use_lse, T* p, Acc<T>* lse, const T* s, const T* fmask,
    // const u8* bmask, const f64* dmask).
    match lse_in {
        Some(l) => {
            expect(op, l, stat_dtype(s.dtype()), rows, s)?;
            let use_lse = 1i32;
            launch!(s.device(), "attention.cu", name, cfg;
                &geom, &r64, &kind, &m64, &use_lse, p.slice_mut(), l.slice(),
                s.slice(), fm.slice(), bm.slice(), dm.slice())?;
            Ok((p, None))
        }
        None => {
            // Host values on the CPU until saved: uncounted here too (the
            // caller counts it if it keeps it, `RowLse::into_tensor`).
            let mut lse =
                tensor::uncounted(|| CudaBuffer::alloc(s.device(), stat_dtype(s.dtype()), rows))?;
            let use_lse = 0i32;
            launch!(s.device(), "attention.cu", name, cfg;
                &geom, &r64, &kind, &m64, &use_lse, p.slice_mut(),
                lse.slice_mut(), s.slice(), fm.slice(), bm.slice(), dm.slice())?;
            Ok((p, Some(lse)))
        }
    }
}

/// The gradient of the scaled scores: `scale·P ⊙ (dP − Σ_j P ⊙ dP)` per
/// row of `lk` (contiguous `p`, `dp` of the same length).
pub(crate) fn attention_softmax_grad(
    p: &CudaBuffer,
    dp: &CudaBuffer,
    geom: ScoreGeom,
) -> Result<CudaBuffer> {
    let lk = geom.lk;
    let op = "cuda attention softmax backward";
    let sfx = float_suffix(op, p.dtype())?;
    expect(op, dp, p.dtype(), p.len(), p)?;
    if lk == 0 || !p.len().is_multiple_of(lk) {
        return Err(invalid(op, format!("{} elements in rows of {lk}", p.len())));
    }
    let rows = p.len() / lk;
    let mut ds = CudaBuffer::alloc(p.device(), p.dtype(), p.len())?;
    if rows > 0 {
        let r64 = rows as i64;
        // Parameters: (ScoreGeom g, i64 rows, T* ds, const T* p, const T* dp).
        launch!(p.device(), "attention.cu", format!("attn_softmax_bwd_{sfx}"), CudaDevice::grid_per_row(rows);
            &geom, &r64, ds.slice_mut(), p.slice(), dp.slice())?;
    }
    Ok(ds)
}

/// The score mask as a dense device tensor for [`attention_probs`] and its
/// number of `lk`-rows: the leading dims over which the broadcast mask does
/// not vary are dropped (a `[lq, lk]` mask serves every batch and head from
/// one copy), the rest is made contiguous; a float mask of another dtype
/// than the scores is converted to F64 (exact, as the CPU reads masks in
/// f64). A temporary the caller keeps out of the ledger.
fn dense_mask(mask: &Tensor, spec: &ScoreSpec, like: &Tensor) -> Result<(Tensor, usize)> {
    let mask = if mask.device() == like.device() {
        mask.detach()
    } else {
        mask.detach().to_device(like.device())?
    };
    let scores = spec.scores;
    let full = mask.layout().broadcast_to(scores)?;
    let rank = scores.len();
    let mut d = 0;
    while d + 1 < rank && (full.strides()[d] == 0 || scores[d] == 1) {
        d += 1;
    }
    let sub = Layout::from_parts(
        scores[d..].to_vec(),
        full.strides()[d..].to_vec(),
        full.offset(),
    );
    let view = mask.view_with_layout(sub);
    let target = match mask.dtype() {
        DType::U8 => DType::U8,
        t if t == like.dtype() => t,
        _ => DType::F64,
    };
    let dense = if target == mask.dtype() {
        tensor::dense(&view)?
    } else {
        tensor::map(&view, view.shape(), |b, l| elementwise::cast(b, l, target))?
    };
    let rows = dense.numel() / spec.geom.lk;
    Ok((dense, rows))
}

/// The probabilities of scores `s` (any layout; a view is copied as
/// Workspace) and the `[rows]` lse (computed, uncounted until saved; or
/// `lse_in` itself when given).
pub(super) fn probs_tensor(
    s: &Tensor,
    spec: &ScoreSpec,
    lse_in: Option<&Tensor>,
    ordinal: usize,
) -> Result<(Tensor, RowLse)> {
    let rows = s.numel().checked_div(spec.geom.lk).unwrap_or(0);
    let stat = stat_dtype(s.dtype());
    if rows == 0 || spec.geom.lk == 0 {
        let lse = match lse_in {
            Some(l) => DeviceLse::Tensor(l.clone()),
            None => DeviceLse::Tensor(tensor::zeros(&[rows], stat, ordinal)?),
        };
        let lse = RowLse::Cuda(lse);
        return Ok((tensor::zeros(s.shape(), s.dtype(), ordinal)?, lse));
    }
    let sd = {
        let _ws = with_category(Category::Workspace);
        tensor::dense(s)?
    };
    // The CPU reads the mask into host values (uncounted): so does this copy.
    let mask = tensor::uncounted(|| spec.mask.map(|m| dense_mask(m, spec, s)).transpose())?;
    let lse_dense = match lse_in {
        Some(l) => {
            let _ws = with_category(Category::Workspace);
            Some(tensor::dense(l)?)
        }
        None => None,
    };
    let mask_guard = mask.as_ref().map(|(m, _)| m.storage().cuda()).transpose()?;
    let attn_mask = match (&mask, &mask_guard) {
        (Some((m, r)), Some(g)) => match m.dtype() {
            DType::U8 => AttnMask::Bool(g, *r),
            DType::F64 if s.dtype() != DType::F64 => AttnMask::F64(g, *r),
            _ => AttnMask::Float(g, *r),
        },
        _ => AttnMask::None,
    };
    let lse_guard = lse_dense.as_ref().map(|l| l.storage().cuda()).transpose()?;
    let (p, lse) = attention_probs(
        &*sd.storage().cuda()?,
        spec.geom,
        attn_mask,
        lse_guard.as_deref(),
    )?;
    let p = tensor::wrap(p, s.shape())?;
    let lse = match (lse, lse_in) {
        (Some(l), _) => DeviceLse::Uncounted(l),
        (None, Some(l)) => DeviceLse::Tensor(l.clone()),
        (None, None) => return Err(invalid("cuda attention softmax", "no lse")),
    };
    Ok((p, RowLse::Cuda(lse)))
}

/// The gradient of the scaled scores (`p`, `dp` of one shape and dtype,
/// any layouts; views are copied as Workspace).
pub(super) fn softmax_grad_tensor(p: &Tensor, dp: &Tensor, geom: ScoreGeom) -> Result<Tensor> {
    if p.numel() == 0 || geom.lk == 0 {
        return p.zeros_like();
    }
    let (pd, dd) = {
        let _ws = with_category(Category::Workspace);
        (tensor::dense(p)?, tensor::dense(dp)?)
    };
    let ds = attention_softmax_grad(&*pd.storage().cuda()?, &*dd.storage().cuda()?, geom)?;
    tensor::wrap(ds, p.shape())
}
