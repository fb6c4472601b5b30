//! All CUDA code of the norms: the glue the dispatch seam calls for CUDA
//! tensors, and the launch wrappers of `norm.cu`.
//!
//! The glue takes and returns what the CPU kernels do, as device tensors:
//! f64 moments, statistics in the statistics dtype, outputs of the input's
//! dtype, so every op saves on CUDA exactly the tensors it saves on the
//! CPU. Statistics the call only uses on the way are made outside the
//! ledger (`memory::uncounted`), as their host counterparts are outside it
//! on the CPU; a non-contiguous operand is copied first, also outside the
//! ledger, as the CPU reads views in place. Nothing is read back to the
//! host.
//!
//! The launch wrappers: the unrounded f64 moments per statistic
//! ([`norm_moments`]), the derived statistics and the running statistics'
//! update ([`prepare`], `norm_prep_*`), normalise + affine
//! ([`norm_forward`]), and the input and weight / bias gradients from the
//! saved `x̂` ([`norm_input_grad`], [`norm_param_grads`]) — the saved `x̂`
//! is read rather than recomputed from `x`, so CUDA saves what the CPU
//! saves. Reductions run in f64 in a fixed order (deterministic);
//! statistics passed to the kernels are in the statistics dtype (f32, f64
//! for f64).

use super::{GradMode, GradScale, NormGeom, Normalize, Prep, Prepared, StatSource};
use crate::cuda::check::{
    ballot_grid, expect, float_suffix, invalid, runs_aligned, runs_grid, RUN,
};
use crate::cuda::launch;
use crate::cuda::{CudaBuffer, CudaDevice};
use crate::dtype::stat_dtype;
use crate::op_code::NormGradCode;
use crate::primitives::mask_words;
use crate::tensor::cuda::{adopt, uncounted, wrap};
use crate::tensor::Tensor;
use crate::{DType, Result};
use cudarc::driver::DeviceRepr;
use std::sync::Arc;

// The kernels take `struct NormGeom` of 6 `long long`s by value; `usize`
// has their layout only where it is 8 bytes.
const _: () = assert!(std::mem::size_of::<NormGeom>() == 6 * 8);

// SAFETY: a plain `repr(C)` struct of 6 usizes (8 bytes each, asserted
// above), laid out as `struct NormGeom` in `norm.cu`.
unsafe impl DeviceRepr for NormGeom {}

// ---- glue: Tensors to buffers, for the seam in `norm/mod.rs` ----

/// `x` as one whole contiguous buffer; a copy, when one is needed, stays
/// out of the ledger, as the CPU's gather of a view into host values does.
fn dense(x: &Tensor) -> Result<Tensor> {
    uncounted(|| crate::tensor::cuda::dense(x))
}

/// The device `x` lives on.
fn device_of(x: &Tensor) -> Result<Arc<CudaDevice>> {
    Ok(x.storage().cuda()?.device().clone())
}

/// The device address of element 0 of the contiguous tensor `t`, or null
/// for an absent operand (the kernels test for it); `write` bumps the
/// storage's version (an in-place update).
fn address(t: Option<&Tensor>, write: bool) -> Result<u64> {
    t.map_or(Ok(0), |t| {
        crate::tensor::cuda::address("cuda norm statistics", t, write)
    })
}

/// Per statistic: the unrounded mean and biased variance as f64 tensors on
/// the device, outside the ledger (the CPU's host vectors).
pub(super) fn norm_stats(x: &Tensor, geo: NormGeom, centered: bool) -> Result<(Tensor, Tensor)> {
    let xd = dense(x)?;
    let xb = xd.storage().cuda()?;
    uncounted(|| {
        let (mean, var) = norm_moments(&xb, &geo, centered)?;
        Ok((wrap(mean, &[geo.s])?, wrap(var, &[geo.s])?))
    })
}

/// The seam's [`Prep`] in one launch (`norm_prep_*` in `norm.cu`): the
/// derived statistics as new tensors outside the ledger, the running
/// statistics and the counter updated in place.
pub(super) fn prepare(p: &Prep<'_>) -> Result<Prepared> {
    let op = "cuda norm statistics";
    let sfx = float_suffix(op, p.dtype)?;
    let dev = device_of(p.var)?;
    let s = p.var.numel();
    let sd = stat_dtype(p.dtype);
    let out = |want: bool| -> Result<Option<Tensor>> {
        want.then(|| uncounted(|| wrap(CudaBuffer::alloc(&dev, sd, s)?, &[s])))
            .transpose()
    };
    let prepared = Prepared {
        mean: out(p.want_mean)?,
        rstd: out(p.want_rstd)?,
        scale: out(p.want_scale)?,
    };
    let (mean, var, w) = (
        address(p.mean, false)?,
        address(Some(p.var), false)?,
        address(p.weight, false)?,
    );
    let (mean_out, rstd_out, scale_out) = (
        address(prepared.mean.as_ref(), true)?,
        address(prepared.rstd.as_ref(), true)?,
        address(prepared.scale.as_ref(), true)?,
    );
    let s64 = s as i64;
    let eps: f64 = p.eps;
    let cfg = CudaDevice::grid_for(s);
    match (p.source, p.update) {
        (StatSource::Moments, update) => {
            let momentum: f64 = update.map_or(0.0, |u| u.momentum);
            let unbias: f64 = update.map_or(1.0, |u| u.unbias);
            let run_mean = address(update.map(|u| u.mean), true)?;
            let run_var = address(update.map(|u| u.var), true)?;
            let counter = address(update.and_then(|u| u.counter), true)?;
            launch!(&dev, "norm.cu", format!("norm_prep_moments_{sfx}"), cfg;
                &s64, &eps, &momentum, &unbias, &mean, &var, &run_mean, &run_var, &w,
                &mean_out, &rstd_out, &scale_out, &counter)?;
        }
        (StatSource::Running, None) => {
            launch!(&dev, "norm.cu", format!("norm_prep_running_{sfx}"), cfg;
                &s64, &eps, &mean, &var, &w, &mean_out, &rstd_out, &scale_out)?;
        }
        (StatSource::Running, Some(_)) => {
            return Err(invalid(
                op,
                "running statistics are updated from batch moments only",
            ))
        }
    }
    Ok(prepared)
}

/// The seam's `scale_tensor` on CUDA: `w·rstd` (or `rstd`) in one launch,
/// a new tensor counted under the current category.
pub(super) fn scale_tensor(w: Option<&Tensor>, rstd: &Tensor) -> Result<Tensor> {
    let op = "cuda batch norm scale";
    let dtype = w.map_or(rstd.dtype(), |w| w.dtype());
    let sfx = float_suffix(op, dtype)?;
    let dev = device_of(rstd)?;
    let s = rstd.numel();
    let scale = wrap(CudaBuffer::alloc(&dev, rstd.dtype(), s)?, &[s])?;
    let (wp, rp, sp) = (
        address(w, false)?,
        address(Some(rstd), false)?,
        address(Some(&scale), true)?,
    );
    let s64 = s as i64;
    launch!(&dev, "norm.cu", format!("norm_scale_{sfx}"), CudaDevice::grid_for(s);
        &s64, &wp, &rp, &sp)?;
    Ok(scale)
}

/// Dense device copies (outside the ledger) of a kernel's optional small
/// operands, held while their buffers are borrowed.
fn dense_opt(t: Option<&Tensor>) -> Result<Option<Tensor>> {
    t.map(dense).transpose()
}

/// The mean operand of `norm_fwd`: the given means, or zeros (RMS norm's
/// recomputed `x̂` under SaveAll), outside the ledger.
fn mean_or_zeros(mean: Option<&Tensor>, rstd: &Tensor) -> Result<Tensor> {
    match mean {
        Some(m) => dense(m),
        None => uncounted(|| {
            let dev = device_of(rstd)?;
            wrap(
                CudaBuffer::zeros(&dev, rstd.dtype(), rstd.numel())?,
                rstd.shape(),
            )
        }),
    }
}

/// The CPU's `normalize` on CUDA: `y` and/or `x̂` as new contiguous tensors
/// counted under the current category, as the CPU's.
pub(super) fn normalize(
    x: &Tensor,
    geo: NormGeom,
    n: &Normalize<'_>,
) -> Result<(Option<Tensor>, Option<Tensor>)> {
    with_params(n, |params| {
        if n.y_over_x {
            // `x` is exclusive and contiguous (the seam checked): y goes over it.
            let xh = {
                let mut xb = x.storage().cuda_mut()?;
                // The kernel's 1-element stand-ins are not tensor memory; x̂
                // is adopted into the ledger below.
                uncounted(|| norm_forward_in_place(&mut xb, &geo, params, n.want_xhat))?
            };
            let xh = xh.map(|t| adopt(t, x.shape())).transpose()?;
            return Ok((Some(x.detach()), xh));
        }
        let xd = dense(x)?;
        let (y, xh) = {
            let xb = xd.storage().cuda()?;
            let dt = x.dtype();
            let dev = xb.device().clone();
            uncounted(|| {
                if x.numel() == 0 {
                    let none =
                        |want: bool| want.then(|| CudaBuffer::alloc(&dev, dt, 0)).transpose();
                    return Ok((none(n.want_y)?, none(n.want_xhat)?));
                }
                norm_forward(&xb, &geo, params, n.want_y, n.want_xhat)
            })?
        };
        let own = |t: Option<CudaBuffer>| t.map(|t| adopt(t, x.shape())).transpose();
        Ok((own(y)?, own(xh)?))
    })
}

/// The packed mask of a fused norm + ReLU's positives, kept out of the
/// ledger until [`ReluBits::into_tensor`] counts it (where the unfused
/// ReLU would have made it).
pub(super) struct ReluBits(CudaBuffer);

impl ReluBits {
    /// The mask as a U32 tensor of `ceil(n/32)` words, counted now.
    pub(super) fn into_tensor(self) -> Result<Tensor> {
        let words = self.0.len();
        adopt(self.0, &[words])
    }
}

/// [`normalize`] with `y` over `x` (exclusive and contiguous: the seam
/// checked) and ReLU applied in the same pass: `x̂` when wanted, and the
/// mask of `y > 0` (uncounted).
pub(super) fn normalize_relu(
    x: &Tensor,
    geo: NormGeom,
    n: &Normalize<'_>,
) -> Result<(Option<Tensor>, ReluBits)> {
    with_params(n, |params| {
        let (xh, bits) = {
            let mut xb = x.storage().cuda_mut()?;
            uncounted(|| norm_forward_relu_in_place(&mut xb, &geo, params, n.want_xhat))?
        };
        let xh = xh.map(|t| adopt(t, x.shape())).transpose()?;
        Ok((xh, ReluBits(bits)))
    })
}

/// Runs `f` with `n`'s statistics and affine parameters as kernel
/// operands (a missing mean as zeros; views copied dense, uncounted).
fn with_params<R>(n: &Normalize<'_>, f: impl FnOnce(&NormParams<'_>) -> Result<R>) -> Result<R> {
    let (mean, rstd) = (mean_or_zeros(n.mean, n.rstd)?, dense(n.rstd)?);
    let (w, b) = (dense_opt(n.w)?, dense_opt(n.b)?);
    let (mb, rb) = (mean.storage().cuda()?, rstd.storage().cuda()?);
    let wg = w.as_ref().map(|t| t.storage().cuda()).transpose()?;
    let bg = b.as_ref().map(|t| t.storage().cuda()).transpose()?;
    f(&NormParams {
        mean: &mb,
        rstd: &rb,
        w: wg.as_deref(),
        b: bg.as_deref(),
    })
}

/// The CPU's `input_grad` on CUDA from the saved `x̂` (checked by the seam
/// against `g`), `scale` per statistic and `w` per parameter.
pub(super) fn input_grad(
    g: &Tensor,
    xhat: Option<&Tensor>,
    geo: NormGeom,
    mode: GradMode,
    by: GradScale<'_>,
) -> Result<Tensor> {
    let gd = dense(g)?;
    let xd = xhat.map(dense).transpose()?;
    let (scale, w) = (dense(by.scale)?, dense_opt(by.w)?);
    let dx = {
        let gb = gd.storage().cuda()?;
        let xg = xd.as_ref().map(|t| t.storage().cuda()).transpose()?;
        let sb = scale.storage().cuda()?;
        let wb = w.as_ref().map(|t| t.storage().cuda()).transpose()?;
        norm_input_grad(&gb, xg.as_deref(), &geo, &sb, wb.as_deref(), mode)?
    };
    wrap(dx, g.shape())
}

/// [`input_grad`] written over `g` (exclusive and contiguous: the seam
/// checked).
pub(super) fn input_grad_in_place(
    g: &Tensor,
    xhat: Option<&Tensor>,
    geo: NormGeom,
    mode: GradMode,
    by: GradScale<'_>,
) -> Result<()> {
    let xd = xhat.map(dense).transpose()?;
    let (scale, w) = (dense(by.scale)?, dense_opt(by.w)?);
    let xg = xd.as_ref().map(|t| t.storage().cuda()).transpose()?;
    let sb = scale.storage().cuda()?;
    let wb = w.as_ref().map(|t| t.storage().cuda()).transpose()?;
    let mut gb = g.storage().cuda_mut()?;
    uncounted(|| norm_input_grad_in_place(&mut gb, xg.as_deref(), &geo, &sb, wb.as_deref(), mode))
}

/// The CPU's `param_sums` on CUDA: `Σ g·x̂` (when `xhat` is given) and `Σ g`
/// (when `want_b`) as tensors of `g`'s dtype shaped `shape`.
pub(super) fn param_grads(
    g: &Tensor,
    xhat: Option<&Tensor>,
    geo: NormGeom,
    want_b: bool,
    shape: &[usize],
) -> Result<(Option<Tensor>, Option<Tensor>)> {
    let gd = dense(g)?;
    let xd = xhat.map(dense).transpose()?;
    let (dw, db) = {
        let gb = gd.storage().cuda()?;
        let xg = xd.as_ref().map(|t| t.storage().cuda()).transpose()?;
        // The kernel's 1-element stand-ins are not tensor memory; the
        // gradients are adopted into the ledger below, as the CPU's.
        uncounted(|| norm_param_grads(&gb, xg.as_deref(), &geo, want_b))?
    };
    let own = |t: Option<CudaBuffer>| t.map(|t| adopt(t, shape)).transpose();
    Ok((own(dw)?, own(db)?))
}

// ---- launch wrappers (`norm.cu`) ----

/// How the two-level sums of `norm.cu` cut each statistic (or parameter)
/// into pieces: `chunks` pieces of `len` consecutive elements (the last
/// may be shorter), a block each, joined in piece order by a second kernel
/// when there are several, so that a layer with few statistics still
/// spreads over the GPU and the sums stay deterministic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Pieces {
    /// Elements per piece: whole rows of a statistic, or a multiple of
    /// [`RUN`] (a piece never starts inside a run).
    pub len: usize,
    /// Pieces per statistic (at least 1).
    pub chunks: usize,
}

impl Pieces {
    /// Blocks a reduction aims at: 4 resident 256-thread blocks (32 warps)
    /// on each of an H100's or H200's 132 SMs, rounded down.
    const BLOCKS: usize = 512;
    /// Fewest elements a piece cut inside a row holds: 4 runs per thread
    /// of a block, so that a piece's setup and tree stay small beside its
    /// loads.
    const MIN_LEN: usize = 4096;

    /// The pieces for `stats` statistics, each `rows` rows of `row_len`
    /// elements (the geometry's `a` and `b`). With several rows a piece is
    /// whole rows (batch norm: some samples' planes of a channel), so the
    /// pieces, and the launches, are the same at every image size; a
    /// single row (layer, group and RMS norm) is cut into stretches.
    pub(crate) fn new(stats: usize, rows: usize, row_len: usize) -> Pieces {
        let count = rows * row_len;
        if count == 0 {
            return Pieces {
                len: RUN,
                chunks: 1,
            };
        }
        let spread = Self::BLOCKS.div_ceil(stats.max(1));
        if rows > 1 {
            let per = rows.div_ceil(spread.min(rows));
            return Pieces {
                len: per * row_len,
                chunks: rows.div_ceil(per),
            };
        }
        let want = spread.min(count.div_ceil(Self::MIN_LEN)).max(1);
        let len = count.div_ceil(want).next_multiple_of(RUN);
        Pieces {
            len,
            chunks: count.div_ceil(len),
        }
    }

    /// What a launch over `stats` statistics cut this way takes: its grid,
    /// the piece arguments and the scratch of the pieces' sums.
    fn launch(self, dev: &Arc<CudaDevice>, stats: usize) -> Result<PieceLaunch> {
        // The pieces' two f64 sums each, outside the ledger (a kernel's
        // scratch, as the CPU's partial sums are); none for one piece per
        // statistic, where the kernels take a null pointer they never touch.
        let scratch = (self.chunks > 1)
            .then(|| uncounted(|| CudaBuffer::alloc(dev, DType::F64, 2 * stats * self.chunks)))
            .transpose()?;
        Ok(PieceLaunch {
            grid: CudaDevice::grid_per_row(stats.saturating_mul(self.chunks)),
            len: self.len as i64,
            chunks: self.chunks as i64,
            joined: self.chunks > 1,
            part: scratch.as_ref().map_or(0, CudaBuffer::address),
            _scratch: scratch,
        })
    }
}

/// A pieces kernel's launch: a block (and a block iteration) per piece,
/// the kernels' `len`, `chunks` and `part` arguments, and whether a second
/// launch joins the pieces.
struct PieceLaunch {
    grid: cudarc::driver::LaunchConfig,
    len: i64,
    chunks: i64,
    joined: bool,
    /// The scratch's address (null without one).
    part: u64,
    /// Held until the launches are queued (freed in stream order after).
    _scratch: Option<CudaBuffer>,
}

/// Per-statistic mean (0 unless `centered`) and biased variance (the mean
/// square when not `centered`) of contiguous `x`, as unrounded f64 buffers
/// (what the CPU's `norm_stats` returns before the caller rounds).
pub(crate) fn norm_moments(
    x: &CudaBuffer,
    geo: &NormGeom,
    centered: bool,
) -> Result<(CudaBuffer, CudaBuffer)> {
    let op = "cuda norm moments";
    let sfx = float_suffix(op, x.dtype())?;
    expect(op, x, x.dtype(), geo.numel(), x)?;
    let dev = x.device();
    let mut mean = CudaBuffer::alloc(dev, DType::F64, geo.s)?;
    let mut var = CudaBuffer::alloc(dev, DType::F64, geo.s)?;
    if geo.s > 0 {
        let pl = Pieces::new(geo.s, geo.a, geo.b).launch(dev, geo.s)?;
        let c = i32::from(centered);
        let vec = i32::from(runs_aligned(&[Some(x)]));
        launch!(dev, "norm.cu", format!("norm_moments_{sfx}"), pl.grid;
            geo, &pl.len, &pl.chunks, &c, &vec, x.slice(), &pl.part, mean.slice_mut(),
            var.slice_mut())?;
        if pl.joined {
            let (s64, cnt) = (geo.s as i64, geo.count() as i64);
            launch!(dev, "norm.cu", "norm_moments_combine", CudaDevice::grid_for(geo.s);
                &s64, &cnt, &pl.len, &pl.chunks, &c, &pl.part, mean.slice_mut(),
                var.slice_mut())?;
        }
    }
    Ok((mean, var))
}

/// Normalises contiguous `x` with the statistics: returns
/// `y = x̂·w + b` (when `want_y`; `w`, `b` default to 1 and 0) and
/// `x̂ = (x − mean)·rstd` (when `want_xhat`), both rounded to `x`'s dtype.
pub(crate) fn norm_forward(
    x: &CudaBuffer,
    geo: &NormGeom,
    p: &NormParams<'_>,
    want_y: bool,
    want_xhat: bool,
) -> Result<(Option<CudaBuffer>, Option<CudaBuffer>)> {
    let op = "cuda norm";
    let sfx = float_suffix(op, x.dtype())?;
    let n = geo.numel();
    expect(op, x, x.dtype(), n, x)?;
    check_stats(op, x, geo, p.mean, p.rstd)?;
    check_params(op, x, geo, [p.w, p.b])?;
    let dev = x.device();
    let mut y = want_y
        .then(|| CudaBuffer::alloc(dev, x.dtype(), n))
        .transpose()?;
    let mut xh = want_xhat
        .then(|| CudaBuffer::alloc(dev, x.dtype(), n))
        .transpose()?;
    if n > 0 && (want_y || want_xhat) {
        // Absent buffers are never read or written: x stands in for them.
        let mut spare_y = CudaBuffer::alloc(dev, x.dtype(), 1)?;
        let mut spare_x = CudaBuffer::alloc(dev, x.dtype(), 1)?;
        let flags = [
            i32::from(want_y),
            i32::from(want_xhat),
            i32::from(p.w.is_some()),
            i32::from(p.b.is_some()),
        ];
        let (wb, bb) = (p.w.unwrap_or(x), p.b.unwrap_or(x));
        let vec = i32::from(runs_aligned(&[Some(x), y.as_ref(), xh.as_ref()]));
        let ys = y.as_mut().unwrap_or(&mut spare_y);
        let xs = xh.as_mut().unwrap_or(&mut spare_x);
        launch!(dev, "norm.cu", format!("norm_fwd_{sfx}"), runs_grid(n);
            geo, &flags[0], &flags[1], &flags[2], &flags[3], &vec, x.slice(), p.mean.slice(),
            p.rstd.slice(), wb.slice(), bb.slice(), ys.slice_mut(), xs.slice_mut())?;
    }
    Ok((y, xh))
}

/// The statistics and affine parameters `norm_fwd` reads.
pub(crate) struct NormParams<'a> {
    /// Per-statistic means (statistics dtype).
    pub mean: &'a CudaBuffer,
    /// Per-statistic reciprocal standard deviations (statistics dtype).
    pub rstd: &'a CudaBuffer,
    /// Per-parameter weights (1 when absent).
    pub w: Option<&'a CudaBuffer>,
    /// Per-parameter biases (0 when absent).
    pub b: Option<&'a CudaBuffer>,
}

/// [`norm_forward`]'s `y` written over `x` itself (buffer reuse), and `x̂`
/// when `want_xhat`, which it returns.
pub(crate) fn norm_forward_in_place(
    x: &mut CudaBuffer,
    geo: &NormGeom,
    p: &NormParams<'_>,
    want_xhat: bool,
) -> Result<Option<CudaBuffer>> {
    Ok(norm_forward_over(x, geo, p, want_xhat, false)?.0)
}

/// [`norm_forward_in_place`] and then ReLU over the result in the same
/// kernel: returns `x̂` (when wanted) and the packed mask of `y > 0`
/// (`ceil(n/32)` U32 words, bit `i % 32` of word `i / 32`).
pub(crate) fn norm_forward_relu_in_place(
    x: &mut CudaBuffer,
    geo: &NormGeom,
    p: &NormParams<'_>,
    want_xhat: bool,
) -> Result<(Option<CudaBuffer>, CudaBuffer)> {
    match norm_forward_over(x, geo, p, want_xhat, true)? {
        (xh, Some(mask)) => Ok((xh, mask)),
        (_, None) => Err(crate::Error::Backward("cuda norm + relu: no mask".into())),
    }
}

/// The norm written over `x`, then ReLU and its mask when `relu`: `x̂`
/// when wanted, and the mask.
fn norm_forward_over(
    x: &mut CudaBuffer,
    geo: &NormGeom,
    p: &NormParams<'_>,
    want_xhat: bool,
    relu: bool,
) -> Result<(Option<CudaBuffer>, Option<CudaBuffer>)> {
    let op = if relu {
        "cuda norm + relu"
    } else {
        "cuda norm"
    };
    let sfx = float_suffix(op, x.dtype())?;
    let n = geo.numel();
    expect(op, x, x.dtype(), n, x)?;
    check_stats(op, x, geo, p.mean, p.rstd)?;
    check_params(op, x, geo, [p.w, p.b])?;
    let dev = x.device().clone();
    let mut xh = want_xhat
        .then(|| CudaBuffer::alloc(&dev, x.dtype(), n))
        .transpose()?;
    let mut mask = relu
        .then(|| CudaBuffer::alloc(&dev, DType::U32, mask_words(n)))
        .transpose()?;
    if n > 0 {
        // Absent buffers are never read or written: stand-ins of 1 element.
        let mut spare_x = CudaBuffer::alloc(&dev, x.dtype(), 1)?;
        let spare_p = CudaBuffer::alloc(&dev, x.dtype(), 1)?;
        let flags = [
            i32::from(want_xhat),
            i32::from(p.w.is_some()),
            i32::from(p.b.is_some()),
        ];
        let (wb, bb) = (p.w.unwrap_or(&spare_p), p.b.unwrap_or(&spare_p));
        let vec = i32::from(runs_aligned(&[Some(&*x), xh.as_ref()]));
        let xs = xh.as_mut().unwrap_or(&mut spare_x);
        if let Some(mask) = mask.as_mut() {
            // One lane per run: a warp covers RUN mask words per pass.
            launch!(&dev, "norm.cu", format!("norm_fwd_relu_inplace_{sfx}"), ballot_grid(n.div_ceil(RUN));
                geo, &flags[0], &flags[1], &flags[2], &vec, x.slice_mut(), p.mean.slice(),
                p.rstd.slice(), wb.slice(), bb.slice(), xs.slice_mut(), mask.slice_mut())?;
        } else {
            launch!(&dev, "norm.cu", format!("norm_fwd_inplace_{sfx}"), runs_grid(n);
                geo, &flags[0], &flags[1], &flags[2], &vec, x.slice_mut(), p.mean.slice(),
                p.rstd.slice(), wb.slice(), bb.slice(), xs.slice_mut())?;
        }
    }
    Ok((xh, mask))
}

/// [`norm_input_grad`] written over `g` itself (buffer reuse).
pub(crate) fn norm_input_grad_in_place(
    g: &mut CudaBuffer,
    xhat: Option<&CudaBuffer>,
    geo: &NormGeom,
    scale: &CudaBuffer,
    w: Option<&CudaBuffer>,
    mode: GradMode,
) -> Result<()> {
    let (sfx, n) = check_input_grad(g, xhat, geo, scale, w, mode)?;
    if n == 0 {
        return Ok(());
    }
    let dev = g.device().clone();
    let code = mode_code(mode);
    let hw = i32::from(w.is_some());
    // Absent x̂ / w are never read: a 1-element stand-in.
    let spare = CudaBuffer::alloc(&dev, g.dtype(), 1)?;
    if mode == GradMode::Affine {
        // No sums: element-wise runs over the whole grid.
        let vec = i32::from(runs_aligned(&[Some(&*g)]));
        launch!(&dev, "norm.cu", format!("norm_bwd_affine_inplace_{sfx}"), runs_grid(n);
            geo, &hw, &vec, scale.slice(), g.slice_mut(), w.unwrap_or(&spare).slice())?;
        return Ok(());
    }
    let xh = xhat.unwrap_or(&spare);
    let vec = i32::from(runs_aligned(&[Some(&*g), Some(xh)]));
    let pl = Pieces::new(geo.s, geo.a, geo.b).launch(&dev, geo.s)?;
    let wb = w.unwrap_or(&spare);
    // The sums, then (with several pieces) the join and the apply.
    for pass in 0..=i32::from(pl.joined) {
        let join: i32 = pass;
        launch!(&dev, "norm.cu", format!("norm_bwd_inplace_{sfx}"), pl.grid;
            geo, &pl.len, &pl.chunks, &join, &code, &hw, &vec, xh.slice(), scale.slice(),
            g.slice_mut(), wb.slice(), &pl.part)?;
    }
    Ok(())
}

/// Checks the operands of an input gradient; returns the kernels' dtype
/// suffix and the element count.
fn check_input_grad(
    g: &CudaBuffer,
    xhat: Option<&CudaBuffer>,
    geo: &NormGeom,
    scale: &CudaBuffer,
    w: Option<&CudaBuffer>,
    mode: GradMode,
) -> Result<(&'static str, usize)> {
    let op = "cuda norm backward";
    let sfx = float_suffix(op, g.dtype())?;
    let n = geo.numel();
    expect(op, g, g.dtype(), n, g)?;
    if let Some(xh) = xhat {
        expect(op, xh, g.dtype(), n, g)?;
    } else if mode != GradMode::Affine {
        return Err(crate::Error::Backward("cuda norm: x̂ missing".into()));
    }
    expect(op, scale, stat_dtype(g.dtype()), geo.s, g)?;
    if n > 0 {
        // An empty input has no parameter tiling to check.
        check_params(op, g, geo, [w])?;
    }
    Ok((sfx, n))
}

/// `norm_bwd_saved`'s mode codes.
fn mode_code(mode: GradMode) -> i32 {
    let code = match mode {
        GradMode::Centered => NormGradCode::Centered,
        GradMode::Uncentered => NormGradCode::Uncentered,
        GradMode::Affine => NormGradCode::Affine,
    };
    code.kernel_code()
}

/// The input gradient from the incoming gradient `g` and the saved `x̂`
/// (both contiguous, one shape; `x̂` is not read and may be `None` for
/// [`GradMode::Affine`]), `scale` per statistic (in [`stat_dtype`]) and
/// `w` per parameter (1 when absent).
pub(crate) fn norm_input_grad(
    g: &CudaBuffer,
    xhat: Option<&CudaBuffer>,
    geo: &NormGeom,
    scale: &CudaBuffer,
    w: Option<&CudaBuffer>,
    mode: GradMode,
) -> Result<CudaBuffer> {
    let (sfx, n) = check_input_grad(g, xhat, geo, scale, w, mode)?;
    let mut dx = CudaBuffer::alloc(g.device(), g.dtype(), n)?;
    if n > 0 && mode == GradMode::Affine {
        // No sums: element-wise runs over the whole grid.
        let hw = i32::from(w.is_some());
        let vec = i32::from(runs_aligned(&[Some(g), Some(&dx)]));
        launch!(g.device(), "norm.cu", format!("norm_bwd_affine_{sfx}"), runs_grid(n);
            geo, &hw, &vec, scale.slice(), g.slice(), w.unwrap_or(g).slice(), dx.slice_mut())?;
    } else if n > 0 {
        let dev = g.device();
        let code = mode_code(mode);
        let hw = i32::from(w.is_some());
        // Absent x̂ / w are never read: g stands in for them.
        let (xh, wb) = (xhat.unwrap_or(g), w.unwrap_or(g));
        let vec = i32::from(runs_aligned(&[Some(g), Some(xh), Some(&dx)]));
        let pl = Pieces::new(geo.s, geo.a, geo.b).launch(dev, geo.s)?;
        // The sums, then (with several pieces) the join and the apply.
        for pass in 0..=i32::from(pl.joined) {
            let join: i32 = pass;
            launch!(dev, "norm.cu", format!("norm_bwd_{sfx}"), pl.grid;
                geo, &pl.len, &pl.chunks, &join, &code, &hw, &vec, xh.slice(), scale.slice(),
                g.slice(), wb.slice(), &pl.part, dx.slice_mut())?;
        }
    }
    Ok(dx)
}

/// The weight (`Σ g·x̂`, when `xhat` is given) and bias (`Σ g`, when
/// `want_b`) gradients per parameter from contiguous `g` and the saved
/// `x̂`, summed in f64 and rounded once to `g`'s dtype.
pub(crate) fn norm_param_grads(
    g: &CudaBuffer,
    xhat: Option<&CudaBuffer>,
    geo: &NormGeom,
    want_b: bool,
) -> Result<(Option<CudaBuffer>, Option<CudaBuffer>)> {
    let op = "cuda norm param grads";
    let sfx = float_suffix(op, g.dtype())?;
    let n = geo.numel();
    expect(op, g, g.dtype(), n, g)?;
    if let Some(xh) = xhat {
        expect(op, xh, g.dtype(), n, g)?;
    }
    if n > 0 {
        check_params(op, g, geo, [])?;
    }
    let (dev, want_w) = (g.device(), xhat.is_some());
    // Zeros, so that an input with no elements gives zero gradients.
    let zeros = |want: bool| {
        want.then(|| CudaBuffer::zeros(dev, g.dtype(), geo.p))
            .transpose()
    };
    let (mut dw, mut db) = (zeros(want_w)?, zeros(want_b)?);
    if n > 0 && (want_w || want_b) {
        let mut spare_w = CudaBuffer::alloc(dev, g.dtype(), 1)?;
        let mut spare_b = CudaBuffer::alloc(dev, g.dtype(), 1)?;
        let (fw, fb) = (i32::from(want_w), i32::from(want_b));
        let xh = xhat.unwrap_or(g);
        let vec = i32::from(runs_aligned(&[Some(g), Some(xh)]));
        let ws = dw.as_mut().unwrap_or(&mut spare_w);
        let bs = db.as_mut().unwrap_or(&mut spare_b);
        // Parameter p's elements (o·P + p)·Lp + l as statistics of a batch
        // norm over [n / (P·Lp), P, Lp].
        let by_param: NormGeom = NormGeom::batch(n / (geo.p * geo.lp), geo.p, geo.lp);
        let pl = Pieces::new(geo.p, by_param.a, by_param.b).launch(dev, geo.p)?;
        launch!(dev, "norm.cu", format!("norm_param_sums_{sfx}"), pl.grid;
            &by_param, &pl.len, &pl.chunks, &fw, &fb, &vec, xh.slice(), g.slice(), &pl.part,
            ws.slice_mut(), bs.slice_mut())?;
        if pl.joined {
            let p64 = geo.p as i64;
            launch!(dev, "norm.cu", format!("norm_param_combine_{sfx}"), CudaDevice::grid_for(geo.p);
                &p64, &pl.chunks, &fw, &fb, &pl.part, ws.slice_mut(), bs.slice_mut())?;
        }
    }
    Ok((dw, db))
}

fn check_stats(
    op: &'static str,
    x: &CudaBuffer,
    geo: &NormGeom,
    mean: &CudaBuffer,
    rstd: &CudaBuffer,
) -> Result<()> {
    let sd: DType = stat_dtype(x.dtype());
    expect(op, mean, sd, geo.s, x)?;
    expect(op, rstd, sd, geo.s, x)
}

fn check_params<const K: usize>(
    op: &'static str,
    x: &CudaBuffer,
    geo: &NormGeom,
    params: [Option<&CudaBuffer>; K],
) -> Result<()> {
    if geo.p == 0 || geo.lp == 0 || !geo.numel().is_multiple_of(geo.p * geo.lp) {
        return Err(invalid(
            op,
            format!("{geo:?}: parameters do not tile the input"),
        ));
    }
    for b in params.into_iter().flatten() {
        expect(op, b, x.dtype(), geo.p, x)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::Pieces;
    use crate::cuda::check::RUN;

    /// Pieces cover each statistic exactly (none empty); a piece inside
    /// a row holds whole runs; few large statistics spread over many
    /// blocks, many small ones stay whole; rows are never cut when a
    /// statistic has several.
    #[test]
    fn pieces_cover_every_statistic() {
        for (stats, rows, row_len) in [
            (64, 64, 112 * 112),
            (512, 64, 49),
            (256, 64, 14 * 14),
            (64, 2, 16 * 16),
            (3, 2, 2025),
            (1, 1, 5),
            (3, 0, 7),
            (1024, 1, 768),
            (2, 1, 9001),
            (7, 1, 1 << 20),
        ] {
            let (p, count) = (Pieces::new(stats, rows, row_len), rows * row_len);
            let case = format!("{stats} × {rows} × {row_len}: {p:?}");
            assert!(p.chunks >= 1 && p.len >= 1, "{case}");
            assert!(p.len * p.chunks >= count, "{case}");
            assert!(
                count == 0 || (p.chunks - 1) * p.len < count,
                "{case}: an empty piece"
            );
            if rows > 1 && count > 0 {
                assert_eq!(p.len % row_len, 0, "{case}: a row cut");
            } else {
                assert_eq!(p.len % RUN, 0, "{case}: a run cut");
            }
        }
        assert_eq!(Pieces::new(64, 64, 112 * 112).chunks, 8);
        assert_eq!(
            Pieces::new(64, 64, 8 * 8).chunks,
            8,
            "the same at every size"
        );
        assert_eq!(Pieces::new(256, 64, 14 * 14).chunks, 2);
        assert_eq!(Pieces::new(512, 64, 49).chunks, 1);
        assert_eq!(Pieces::new(1024, 1, 768).chunks, 1);
        assert_eq!(Pieces::new(2, 1, 9001).chunks, 3);
    }
}
