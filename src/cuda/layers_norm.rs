//! Launch wrappers for normalization layers (`norm.cu`), as `cpu::norm`:
//! the unrounded f64 moments per statistic ([`saved`]: `norm_moments`),
//! normalize + affine (`norm_forward`), and the input and weight / bias
//! gradients from the saved `x̂` (`norm_input_grad_saved`,
//! `norm_param_grads_saved`), so that CUDA saves what the CPU saves.
//! Reductions run in f64 with a fixed order (deterministic); statistics
//! passed to the forward are in the statistics dtype (f32, f64 for f64).

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
