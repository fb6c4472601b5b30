//! Launch wrappers for the layers' norm path (`cpu::norm`'s CUDA arms):
//! unrounded f64 statistics, and gradients that read the saved `x̂` (the
//! CPU's lean saved tensor, or SaveAll's recomputed one) instead of
//! recomputing it from `x`, so the CUDA path saves exactly what the CPU
//! saves.

use super::{check_params, NormGeom, NormGradMode};
use crate::cuda::check::float_suffix;
use crate::cuda::layers_util::{expect, stat_dtype};
use crate::cuda::{CudaBuffer, CudaDevice};
use crate::{DType, Result};

/// Per-statistic mean (0 unless `centered`) and biased variance (the mean
/// square when not `centered`) of contiguous `x`, as unrounded f64 buffers
/// (what `cpu::norm::norm_stats` returns before the caller rounds).
pub fn norm_moments(
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
        let (a, s, b, c) = (
            geo.a as i64,
            geo.s as i64,
            geo.b as i64,
            i32::from(centered),
        );
        launch!(dev, "norm.cu", format!("norm_moments_{sfx}"), CudaDevice::grid_per_row(geo.s);
            &a, &s, &b, &c, mean.slice_mut(), var.slice_mut(), x.slice())?;
    }
    Ok((mean, var))
}

/// The input gradient from the incoming gradient `g` and the saved `x̂`
/// (both contiguous, one shape; `x̂` is not read and may be `None` for
/// [`NormGradMode::Affine`]), `scale` per statistic (in [`stat_dtype`]) and
/// `w` per parameter (1 when absent).
pub fn norm_input_grad_saved(
    g: &CudaBuffer,
    xhat: Option<&CudaBuffer>,
    geo: &NormGeom,
    scale: &CudaBuffer,
    w: Option<&CudaBuffer>,
    mode: NormGradMode,
) -> Result<CudaBuffer> {
    let op = "cuda norm backward";
    let sfx = float_suffix(op, g.dtype())?;
    let n = geo.numel();
    expect(op, g, g.dtype(), n, g)?;
    if let Some(xh) = xhat {
        expect(op, xh, g.dtype(), n, g)?;
    } else if mode != NormGradMode::Affine {
        return Err(crate::Error::Backward("cuda norm: x̂ missing".into()));
    }
    expect(op, scale, stat_dtype(g.dtype()), geo.s, g)?;
    if n > 0 {
        // An empty input has no parameter tiling to check.
        check_params(op, g, geo, [w])?;
    }
    let mut dx = CudaBuffer::alloc(g.device(), g.dtype(), n)?;
    if n > 0 {
        let code = match mode {
            NormGradMode::Centered => 0i32,
            NormGradMode::Uncentered => 1,
            NormGradMode::Affine => 2,
        };
        let (a, s, b, p, lp) = (
            geo.a as i64,
            geo.s as i64,
            geo.b as i64,
            geo.p as i64,
            geo.lp as i64,
        );
        let hw = i32::from(w.is_some());
        // Absent x̂ / w are never read: g stands in for them.
        launch!(g.device(), "norm.cu", format!("norm_bwd_saved_{sfx}"), CudaDevice::grid_per_row(geo.s);
            &code, &a, &s, &b, &p, &lp, &hw, xhat.unwrap_or(g).slice(), scale.slice(), g.slice(),
            w.unwrap_or(g).slice(), dx.slice_mut())?;
    }
    Ok(dx)
}

/// The weight (`Σ g·x̂`, when `xhat` is given) and bias (`Σ g`, when
/// `want_b`) gradients per parameter from contiguous `g` and the saved
/// `x̂`, summed in f64 and rounded once to `g`'s dtype.
pub fn norm_param_grads_saved(
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
        let (n64, p, lp) = (n as i64, geo.p as i64, geo.lp as i64);
        let (fw, fb) = (i32::from(want_w), i32::from(want_b));
        let ws = dw.as_mut().unwrap_or(&mut spare_w);
        let bs = db.as_mut().unwrap_or(&mut spare_b);
        launch!(dev, "norm.cu", format!("norm_param_grad_saved_{sfx}"), CudaDevice::grid_per_row(geo.p);
            &n64, &p, &lp, &fw, &fb, xhat.unwrap_or(g).slice(), g.slice(),
            ws.slice_mut(), bs.slice_mut())?;
    }
    Ok((dw, db))
}
