//! All CUDA code of the norms: the glue the dispatch seam calls for CUDA
//! tensors, and the launch wrappers of `norm.cu`.
//!
//! The glue takes and returns what the CPU kernels do (host f64 statistics
//! that the ops round as on the CPU, and tensors of the input's dtype), so
//! every op saves on CUDA exactly the tensors it saves on the CPU. The
//! small per-statistic and per-parameter vectors cross to and from the
//! device outside the ledger (`cuda::tensor::uncounted`), as their host
//! counterparts are outside it on the CPU; a non-contiguous operand is
//! copied first, also outside the ledger, as the CPU reads views in place.
//!
//! The launch wrappers: the unrounded f64 moments per statistic
//! ([`norm_moments`]), normalise + affine ([`norm_forward`]), and the input
//! and weight / bias gradients from the saved `x̂` ([`norm_input_grad`],
//! [`norm_param_grads`]) — the saved `x̂` is read rather than recomputed
//! from `x`, so CUDA saves what the CPU saves. Reductions run in f64 in a
//! fixed order (deterministic); statistics passed to the kernels are in
//! the statistics dtype (f32, f64 for f64).

use super::{GradMode, NormGeom, Normalize};
use crate::cuda::check::{expect, float_suffix, invalid};
use crate::cuda::launch;
use crate::cuda::{CudaBuffer, CudaDevice};
use crate::dtype::stat_dtype;
use crate::tensor::cuda::{adopt, uncounted, wrap};
use crate::tensor::Tensor;
use crate::{DType, Result, WithDType};
use cudarc::driver::DeviceRepr;
use std::ops::Range;
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

/// Host values as a device buffer of `dtype` (callers run it uncounted:
/// the CPU keeps these as host vectors), converted as the CPU's
/// `WithDType::from_f64`; exact for statistics (already rounded to `dtype`)
/// and parameters (read from `dtype`).
fn host_buffer(dev: &Arc<CudaDevice>, values: &[f64], dtype: DType) -> Result<CudaBuffer> {
    fn typed<T: WithDType>(dev: &Arc<CudaDevice>, values: &[f64]) -> Result<CudaBuffer> {
        let host: Vec<T> = values.iter().map(|v| T::from_f64(*v)).collect();
        CudaBuffer::from_slice(dev, &host)
    }
    match dtype {
        DType::F32 => typed::<f32>(dev, values),
        DType::F64 => typed::<f64>(dev, values),
        DType::F16 => typed::<half::f16>(dev, values),
        DType::BF16 => typed::<half::bf16>(dev, values),
        // `num_batches_tracked` (i64) goes through `write_values` too.
        DType::I64 => typed::<i64>(dev, values),
        DType::U32 => typed::<u32>(dev, values),
        DType::U8 => typed::<u8>(dev, values),
    }
}

/// Per statistic: the unrounded mean and biased variance, read back to the
/// host as the CPU's `norm_stats` returns them.
pub(super) fn norm_stats(
    x: &Tensor,
    geo: NormGeom,
    centered: bool,
) -> Result<(Vec<f64>, Vec<f64>)> {
    let xd = dense(x)?;
    let xb = xd.storage().cuda()?;
    uncounted(|| {
        let (mean, var) = norm_moments(&xb, &geo, centered)?;
        Ok((mean.to_vec::<f64>()?, var.to_vec::<f64>()?))
    })
}

/// The CPU's `normalize` on CUDA: `y` and/or `x̂` as new contiguous tensors
/// counted under the current category, as the CPU's.
pub(super) fn normalize(
    x: &Tensor,
    geo: NormGeom,
    n: &Normalize<'_>,
) -> Result<(Option<Tensor>, Option<Tensor>)> {
    let Normalize {
        mean,
        rstd,
        w,
        b,
        want_y,
        want_xhat,
        y_over_x,
    } = *n;
    if y_over_x {
        // `x` is exclusive and contiguous (the seam checked): y goes over it.
        let xh = {
            let mut xb = x.storage().cuda_mut()?;
            let (dev, dt) = (xb.device().clone(), x.dtype());
            uncounted(|| {
                let sd = stat_dtype(dt);
                let (mb, rb) = (host_buffer(&dev, mean, sd)?, host_buffer(&dev, rstd, sd)?);
                let wb = w.map(|v| host_buffer(&dev, v, dt)).transpose()?;
                let bb = b.map(|v| host_buffer(&dev, v, dt)).transpose()?;
                let params = NormParams {
                    mean: &mb,
                    rstd: &rb,
                    w: wb.as_ref(),
                    b: bb.as_ref(),
                };
                norm_forward_in_place(&mut xb, &geo, &params, want_xhat)
            })?
        };
        let xh = xh.map(|t| adopt(t, x.shape())).transpose()?;
        return Ok((Some(x.detach()), xh));
    }
    let xd = dense(x)?;
    let (y, xh) = {
        let xb = xd.storage().cuda()?;
        let (dev, dt) = (xb.device().clone(), x.dtype());
        // Statistics, parameters and the kernel's 1-element stand-ins are
        // host-side values on the CPU; the outputs are adopted below.
        uncounted(|| {
            if x.numel() == 0 {
                let none = |want: bool| want.then(|| CudaBuffer::alloc(&dev, dt, 0)).transpose();
                return Ok((none(want_y)?, none(want_xhat)?));
            }
            let sd = stat_dtype(dt);
            let (mb, rb) = (host_buffer(&dev, mean, sd)?, host_buffer(&dev, rstd, sd)?);
            let wb = w.map(|v| host_buffer(&dev, v, dt)).transpose()?;
            let bb = b.map(|v| host_buffer(&dev, v, dt)).transpose()?;
            norm_forward(
                &xb,
                &geo,
                &mb,
                &rb,
                wb.as_ref(),
                bb.as_ref(),
                want_y,
                want_xhat,
            )
        })?
    };
    let own = |t: Option<CudaBuffer>| t.map(|t| adopt(t, x.shape())).transpose();
    Ok((own(y)?, own(xh)?))
}

/// The CPU's `input_grad` on CUDA from the saved `x̂` (checked by the seam
/// against `g`), `scale` per statistic and `w` per parameter.
pub(super) fn input_grad(
    g: &Tensor,
    xhat: Option<&Tensor>,
    geo: NormGeom,
    mode: GradMode,
    scale: &[f64],
    w: Option<&[f64]>,
) -> Result<Tensor> {
    let gd = dense(g)?;
    let xd = xhat.map(dense).transpose()?;
    let dev = device_of(&gd)?;
    let (sb, wb) = uncounted(|| {
        let sb = host_buffer(&dev, scale, stat_dtype(g.dtype()))?;
        Ok((sb, w.map(|v| host_buffer(&dev, v, g.dtype())).transpose()?))
    })?;
    let dx = {
        let gb = gd.storage().cuda()?;
        let xg = xd.as_ref().map(|t| t.storage().cuda()).transpose()?;
        norm_input_grad(&gb, xg.as_deref(), &geo, &sb, wb.as_ref(), mode)?
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
    scale: &[f64],
    w: Option<&[f64]>,
) -> Result<()> {
    let xd = xhat.map(dense).transpose()?;
    let dev = device_of(g)?;
    let (sb, wb) = uncounted(|| {
        let sb = host_buffer(&dev, scale, stat_dtype(g.dtype()))?;
        Ok((sb, w.map(|v| host_buffer(&dev, v, g.dtype())).transpose()?))
    })?;
    let xg = xd.as_ref().map(|t| t.storage().cuda()).transpose()?;
    let mut gb = g.storage().cuda_mut()?;
    uncounted(|| norm_input_grad_in_place(&mut gb, xg.as_deref(), &geo, &sb, wb.as_ref(), mode))
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

/// The CPU's `write_values` on CUDA: overwrites elements `range` of `t`'s
/// buffer with `values` rounded to its dtype (bumps its version).
pub(super) fn write_values(t: &Tensor, range: Range<usize>, values: &[f64]) -> Result<()> {
    let dev = device_of(t)?;
    let src = uncounted(|| host_buffer(&dev, values, t.dtype()))?;
    t.storage()
        .cuda_mut()?
        .copy_range_from(range.start, &src, 0, range.len())
}

// ---- launch wrappers (`norm.cu`) ----

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
        let c = i32::from(centered);
        launch!(dev, "norm.cu", format!("norm_moments_{sfx}"), CudaDevice::grid_per_row(geo.s);
            geo, &c, mean.slice_mut(), var.slice_mut(), x.slice())?;
    }
    Ok((mean, var))
}

/// Normalises contiguous `x` with the statistics: returns
/// `y = x̂·w + b` (when `want_y`; `w`, `b` default to 1 and 0) and
/// `x̂ = (x − mean)·rstd` (when `want_xhat`), both rounded to `x`'s dtype.
#[allow(clippy::too_many_arguments)]
pub(crate) fn norm_forward(
    x: &CudaBuffer,
    geo: &NormGeom,
    mean: &CudaBuffer,
    rstd: &CudaBuffer,
    w: Option<&CudaBuffer>,
    b: Option<&CudaBuffer>,
    want_y: bool,
    want_xhat: bool,
) -> Result<(Option<CudaBuffer>, Option<CudaBuffer>)> {
    let op = "cuda norm";
    let sfx = float_suffix(op, x.dtype())?;
    let n = geo.numel();
    expect(op, x, x.dtype(), n, x)?;
    check_stats(op, x, geo, mean, rstd)?;
    check_params(op, x, geo, [w, b])?;
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
            i32::from(w.is_some()),
            i32::from(b.is_some()),
        ];
        let (wb, bb) = (w.unwrap_or(x), b.unwrap_or(x));
        let ys = y.as_mut().unwrap_or(&mut spare_y);
        let xs = xh.as_mut().unwrap_or(&mut spare_x);
        launch!(dev, "norm.cu", format!("norm_fwd_{sfx}"), CudaDevice::grid_for(n);
            geo, &flags[0], &flags[1], &flags[2], &flags[3], x.slice(), mean.slice(),
            rstd.slice(), wb.slice(), bb.slice(), ys.slice_mut(), xs.slice_mut())?;
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
    let op = "cuda norm";
    let sfx = float_suffix(op, x.dtype())?;
    let n = geo.numel();
    expect(op, x, x.dtype(), n, x)?;
    check_stats(op, x, geo, p.mean, p.rstd)?;
    check_params(op, x, geo, [p.w, p.b])?;
    let dev = x.device().clone();
    let mut xh = want_xhat
        .then(|| CudaBuffer::alloc(&dev, x.dtype(), n))
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
        let xs = xh.as_mut().unwrap_or(&mut spare_x);
        launch!(&dev, "norm.cu", format!("norm_fwd_inplace_{sfx}"), CudaDevice::grid_for(n);
            geo, &flags[0], &flags[1], &flags[2], x.slice_mut(), p.mean.slice(),
            p.rstd.slice(), wb.slice(), bb.slice(), xs.slice_mut())?;
    }
    Ok(xh)
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
    launch!(&dev, "norm.cu", format!("norm_bwd_saved_inplace_{sfx}"), CudaDevice::grid_per_row(geo.s);
        geo, &code, &hw, xhat.unwrap_or(&spare).slice(), scale.slice(), g.slice_mut(),
        w.unwrap_or(&spare).slice())?;
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
    match mode {
        GradMode::Centered => 0,
        GradMode::Uncentered => 1,
        GradMode::Affine => 2,
    }
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
    if n > 0 {
        let code = mode_code(mode);
        let hw = i32::from(w.is_some());
        // Absent x̂ / w are never read: g stands in for them.
        launch!(g.device(), "norm.cu", format!("norm_bwd_saved_{sfx}"), CudaDevice::grid_per_row(geo.s);
            geo, &code, &hw, xhat.unwrap_or(g).slice(), scale.slice(), g.slice(),
            w.unwrap_or(g).slice(), dx.slice_mut())?;
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
        let ws = dw.as_mut().unwrap_or(&mut spare_w);
        let bs = db.as_mut().unwrap_or(&mut spare_b);
        launch!(dev, "norm.cu", format!("norm_param_grad_saved_{sfx}"), CudaDevice::grid_per_row(geo.p);
            geo, &fw, &fb, xhat.unwrap_or(g).slice(), g.slice(), ws.slice_mut(), bs.slice_mut())?;
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
