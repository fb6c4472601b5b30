//! Launch wrappers for normalization layers (`norm.cu`), as `cpu::norm`:
//! per-statistic mean / variance / rstd, normalize + affine, eval-mode
//! batch norm from running statistics (nothing saved), the input gradient
//! (x̂ recomputed from x and the saved statistics) and the weight / bias
//! gradients. Reductions run in f64 with a fixed order (deterministic);
//! statistics are kept in f32 (f64 for f64 inputs).
//!
//! The layers (through `cpu::norm`'s CUDA arms) use `norm_forward` and the
//! wrappers of [`saved`]-path kernels re-exported here (`norm_moments`,
//! `norm_input_grad_saved`, `norm_param_grads_saved`), which read the saved
//! `x̂` so that CUDA saves what the CPU saves; the recomputing wrappers,
//! `norm_eval` and `norm_running_update` are standalone kernels (tested in
//! `tests/cuda_layers.rs`) that the layers do not call.

use super::check::float_suffix;
use super::layers_util::{expect, invalid, stat_dtype};
use super::{CudaBuffer, CudaDevice};
use crate::{DType, Result};

pub mod saved;
pub use saved::{norm_input_grad_saved, norm_moments, norm_param_grads_saved};

/// How statistics and affine parameters lie over a contiguous input: the
/// input is `[a, s, b]` with one statistic per index of `s` (over `a·b`
/// elements), and element `e` uses parameter `(e / lp) % p`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NormGeom {
    /// Outer extent of a statistic's elements.
    pub a: usize,
    /// Number of statistics.
    pub s: usize,
    /// Inner (contiguous) extent of a statistic's elements.
    pub b: usize,
    /// Number of affine parameters.
    pub p: usize,
    /// Elements sharing one parameter in a row.
    pub lp: usize,
}

impl NormGeom {
    /// Batch norm over `[outer, c, inner]`: one statistic per channel.
    pub fn batch(outer: usize, c: usize, inner: usize) -> NormGeom {
        NormGeom {
            a: outer,
            s: c,
            b: inner,
            p: c,
            lp: inner,
        }
    }

    /// Group norm over `[n, c, spatial]` with `groups` groups (dividing `c`).
    pub fn group(n: usize, c: usize, spatial: usize, groups: usize) -> Result<NormGeom> {
        if groups == 0 || !c.is_multiple_of(groups) {
            return Err(invalid(
                "cuda group_norm",
                format!("{c} channels in {groups} groups"),
            ));
        }
        Ok(NormGeom {
            a: 1,
            s: n * groups,
            b: c / groups * spatial,
            p: c,
            lp: spatial,
        })
    }

    /// Layer / RMS norm over `rows` rows of `len`.
    pub fn row(rows: usize, len: usize) -> NormGeom {
        NormGeom {
            a: 1,
            s: rows,
            b: len,
            p: len,
            lp: 1,
        }
    }

    /// Elements of the input.
    pub fn numel(&self) -> usize {
        self.a * self.s * self.b
    }
}

/// Per-statistic mean (0 unless `centered`), biased variance and
/// `rstd = 1/sqrt(var + eps)` of contiguous `x`, in [`stat_dtype`].
pub fn norm_stats(
    x: &CudaBuffer,
    geo: &NormGeom,
    centered: bool,
    eps: f64,
) -> Result<(CudaBuffer, CudaBuffer, CudaBuffer)> {
    let op = "cuda norm stats";
    let sfx = float_suffix(op, x.dtype())?;
    expect(op, x, x.dtype(), geo.numel(), x)?;
    let (dev, sd) = (x.device(), stat_dtype(x.dtype()));
    let mut mean = CudaBuffer::alloc(dev, sd, geo.s)?;
    let mut var = CudaBuffer::alloc(dev, sd, geo.s)?;
    let mut rstd = CudaBuffer::alloc(dev, sd, geo.s)?;
    if geo.s > 0 {
        let (a, s, b, c) = (
            geo.a as i64,
            geo.s as i64,
            geo.b as i64,
            i32::from(centered),
        );
        launch!(dev, "norm.cu", format!("norm_stats_{sfx}"), CudaDevice::grid_per_row(geo.s);
            &a, &s, &b, &c, &eps, mean.slice_mut(), var.slice_mut(), rstd.slice_mut(), x.slice())?;
    }
    Ok((mean, var, rstd))
}

/// Normalizes contiguous `x` with the statistics: returns
/// `y = x̂·w + b` (when `want_y`; `w`, `b` default to 1 and 0) and
/// `x̂ = (x − mean)·rstd` (when `want_xhat`), both rounded to `x`'s dtype.
#[allow(clippy::too_many_arguments)]
pub fn norm_forward(
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
        let (n64, s, bb, p, lp) = (
            n as i64,
            geo.s as i64,
            geo.b as i64,
            geo.p as i64,
            geo.lp as i64,
        );
        let flags = [
            i32::from(want_y),
            i32::from(want_xhat),
            i32::from(w.is_some()),
            i32::from(b.is_some()),
        ];
        let (wb, bb_) = (w.unwrap_or(x), b.unwrap_or(x));
        let ys = y.as_mut().unwrap_or(&mut spare_y);
        let xs = xh.as_mut().unwrap_or(&mut spare_x);
        launch!(dev, "norm.cu", format!("norm_fwd_{sfx}"), CudaDevice::grid_for(n);
            &n64, &s, &bb, &p, &lp, &flags[0], &flags[1], &flags[2], &flags[3], x.slice(),
            mean.slice(), rstd.slice(), wb.slice(), bb_.slice(), ys.slice_mut(), xs.slice_mut())?;
    }
    Ok((y, xh))
}

/// Eval-mode batch norm: `(x − rmean)·rstd·w + b` per parameter with
/// `rstd = 1/sqrt(rvar + eps)`; the running statistics are `x`'s dtype.
pub fn norm_eval(
    x: &CudaBuffer,
    geo: &NormGeom,
    rmean: &CudaBuffer,
    rvar: &CudaBuffer,
    w: Option<&CudaBuffer>,
    b: Option<&CudaBuffer>,
    eps: f64,
) -> Result<CudaBuffer> {
    let op = "cuda batch_norm eval";
    let sfx = float_suffix(op, x.dtype())?;
    let n = geo.numel();
    expect(op, x, x.dtype(), n, x)?;
    check_params(op, x, geo, [Some(rmean), Some(rvar), w, b])?;
    let mut y = CudaBuffer::alloc(x.device(), x.dtype(), n)?;
    if n > 0 {
        let (n64, p, lp) = (n as i64, geo.p as i64, geo.lp as i64);
        let (hw, hb) = (i32::from(w.is_some()), i32::from(b.is_some()));
        let (wb, bb) = (w.unwrap_or(x), b.unwrap_or(x));
        launch!(x.device(), "norm.cu", format!("norm_eval_{sfx}"), CudaDevice::grid_for(n);
            &n64, &p, &lp, &eps, &hw, &hb, x.slice(), rmean.slice(), rvar.slice(),
            wb.slice(), bb.slice(), y.slice_mut())?;
    }
    Ok(y)
}

/// What the input gradient of a norm is (`cpu::norm::GradMode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormGradMode {
    /// `rstd·(g·w − mean(g·w) − x̂·mean(g·w·x̂))`: batch/layer/group norm.
    Centered,
    /// `rstd·(g·w − x̂·mean(g·w·x̂))`: RMS norm.
    Uncentered,
    /// `rstd·g·w`: an affine map (no reductions).
    Affine,
}

/// The input gradient from contiguous `x`, the saved statistics and the
/// incoming gradient `g` (contiguous, `x`'s shape); `w` per parameter.
pub fn norm_input_grad(
    x: &CudaBuffer,
    g: &CudaBuffer,
    geo: &NormGeom,
    mean: &CudaBuffer,
    rstd: &CudaBuffer,
    w: Option<&CudaBuffer>,
    mode: NormGradMode,
) -> Result<CudaBuffer> {
    let op = "cuda norm backward";
    let sfx = float_suffix(op, x.dtype())?;
    let n = geo.numel();
    expect(op, x, x.dtype(), n, x)?;
    expect(op, g, x.dtype(), n, x)?;
    check_stats(op, x, geo, mean, rstd)?;
    check_params(op, x, geo, [w])?;
    let mut dx = CudaBuffer::alloc(x.device(), x.dtype(), n)?;
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
        launch!(x.device(), "norm.cu", format!("norm_bwd_{sfx}"), CudaDevice::grid_per_row(geo.s);
            &code, &a, &s, &b, &p, &lp, &hw, x.slice(), mean.slice(), rstd.slice(), g.slice(),
            w.unwrap_or(x).slice(), dx.slice_mut())?;
    }
    Ok(dx)
}

/// The weight (`Σ g·x̂`, when `want_w`) and bias (`Σ g`, when `want_b`)
/// gradients per parameter, summed in f64, in `x`'s dtype.
pub fn norm_param_grads(
    x: &CudaBuffer,
    g: &CudaBuffer,
    geo: &NormGeom,
    mean: &CudaBuffer,
    rstd: &CudaBuffer,
    want_w: bool,
    want_b: bool,
) -> Result<(Option<CudaBuffer>, Option<CudaBuffer>)> {
    let op = "cuda norm param grads";
    let sfx = float_suffix(op, x.dtype())?;
    let n = geo.numel();
    expect(op, x, x.dtype(), n, x)?;
    expect(op, g, x.dtype(), n, x)?;
    check_stats(op, x, geo, mean, rstd)?;
    let dev = x.device();
    let zeros = |want: bool| {
        want.then(|| CudaBuffer::zeros(dev, x.dtype(), geo.p))
            .transpose()
    };
    let (mut dw, mut db) = (zeros(want_w)?, zeros(want_b)?);
    if geo.p > 0 && (want_w || want_b) {
        let mut spare_w = CudaBuffer::alloc(dev, x.dtype(), 1)?;
        let mut spare_b = CudaBuffer::alloc(dev, x.dtype(), 1)?;
        let (n64, s, b, p, lp) = (
            n as i64,
            geo.s as i64,
            geo.b as i64,
            geo.p as i64,
            geo.lp as i64,
        );
        let (fw, fb) = (i32::from(want_w), i32::from(want_b));
        let ws = dw.as_mut().unwrap_or(&mut spare_w);
        let bs = db.as_mut().unwrap_or(&mut spare_b);
        launch!(dev, "norm.cu", format!("norm_param_grad_{sfx}"), CudaDevice::grid_per_row(geo.p);
            &n64, &s, &b, &p, &lp, &fw, &fb, x.slice(), mean.slice(), rstd.slice(), g.slice(),
            ws.slice_mut(), bs.slice_mut())?;
    }
    Ok((dw, db))
}

/// Updates batch norm's running statistics in place from a train-mode
/// [`norm_stats`] over `count` elements per channel:
/// `r ← (1 − momentum)·r + momentum·s`, the variance unbiased by
/// `count/(count − 1)` (`count` must exceed 1).
pub fn norm_running_update(
    rmean: &mut CudaBuffer,
    rvar: &mut CudaBuffer,
    mean: &CudaBuffer,
    var: &CudaBuffer,
    count: usize,
    momentum: f64,
) -> Result<()> {
    let op = "cuda batch_norm running stats";
    let sfx = float_suffix(op, rmean.dtype())?;
    let c = rmean.len();
    if count <= 1 {
        return Err(invalid(op, format!("{count} values per channel")));
    }
    expect(op, rvar, rmean.dtype(), c, rmean)?;
    let sd = stat_dtype(rmean.dtype());
    expect(op, mean, sd, c, rmean)?;
    expect(op, var, sd, c, rmean)?;
    if c == 0 {
        return Ok(());
    }
    let (c64, unbias) = (c as i64, count as f64 / (count as f64 - 1.0));
    let dev = rmean.device().clone();
    launch!(&dev, "norm.cu", format!("norm_running_update_{sfx}"), CudaDevice::grid_for(c);
        &c64, &momentum, &unbias, rmean.slice_mut(), rvar.slice_mut(), mean.slice(), var.slice())
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
