//! Normalisation gradients (the backward half of `cpu::norm`): the weight
//! and bias sums and the input gradient, from the saved `x̂` and per-statistic
//! scales; CUDA tensors go to `norm_cuda`.

use super::elementwise::typed;
use super::norm::{f, par_map, Geo};
use super::softmax::Dense;
use super::PARALLEL_THRESHOLD;
use crate::dtype::CpuData;
use crate::meta::{backend, Backend};
use crate::tensor::Tensor;
use crate::{DType, Error, FloatDType, Result};
use rayon::prelude::*;

/// Checks that `g` matches `like` in shape and dtype.
fn check_like(op: &'static str, g: &Tensor, like: &[usize], dtype: DType) -> Result<()> {
    if g.shape() != like {
        return Err(Error::ShapeMismatch {
            op,
            lhs: like.to_vec(),
            rhs: g.shape().to_vec(),
        });
    }
    if g.dtype() != dtype {
        return Err(Error::DTypeMismatch {
            op,
            expected: dtype,
            got: g.dtype(),
        });
    }
    Ok(())
}

/// Weight (`Σ g·x̂`) and bias (`Σ g`) gradients as f64 sums, when wanted.
type ParamSums = (Option<Vec<f64>>, Option<Vec<f64>>);

/// Weight (`Σ g·x̂`) and bias (`Σ g`) gradient tensors, when wanted.
pub(crate) type ParamGrads = (Option<Tensor>, Option<Tensor>);

/// Parameter gradients: `Σ g·x̂` (when `xhat` is given) and `Σ g` (when
/// `want_b`) per affine parameter, summed in f64 in a fixed order and
/// rounded once to `g`'s dtype, shaped `shape`, on `g`'s device.
pub(crate) fn param_grads(
    g: &Tensor,
    xhat: Option<&Tensor>,
    geo: Geo,
    want_b: bool,
    shape: &[usize],
) -> Result<ParamGrads> {
    if let Some(xh) = xhat {
        check_like("norm_backward", xh, g.shape(), g.dtype())?;
    }
    let with_xhat: Vec<&Tensor> = std::iter::once(g).chain(xhat).collect();
    let (gw, gb) = match backend("norm_backward", &with_xhat)? {
        Backend::Meta => {
            let np = geo.nparam();
            (xhat.map(|_| vec![0.0; np]), want_b.then(|| vec![0.0; np]))
        }
        Backend::Cuda(_) => return super::norm_cuda::param_grads(g, xhat, geo, want_b, shape),
        Backend::Cpu => param_sums(g, xhat, geo, want_b)?,
    };
    let wrap = |v: Option<Vec<f64>>| {
        v.map(|v| Tensor::from_host_f64(&v, shape, g.dtype(), g.device()))
            .transpose()
    };
    Ok((wrap(gw)?, wrap(gb)?))
}

/// The CPU sums of [`param_grads`].
fn param_sums(g: &Tensor, xhat: Option<&Tensor>, geo: Geo, want_b: bool) -> Result<ParamSums> {
    let dg = Dense::new(g)?;
    let dx = xhat.map(Dense::new).transpose()?;
    let (gdata, gr) = dg.parts();
    fn go<T: FloatDType>(g: &[T], xh: Option<&[T]>, geo: Geo, want_b: bool) -> ParamSums {
        let (seg, nseg, np) = (geo.seg(), geo.nseg(), geo.nparam());
        let blocks = 64.min(nseg.max(1));
        let per = nseg.div_ceil(blocks).max(1);
        let parts = par_map(nseg.div_ceil(per), g.len(), |bi| {
            let mut gw = vec![0.0; if xh.is_some() { np } else { 0 }];
            let mut gb = vec![0.0; if want_b { np } else { 0 }];
            for k in bi * per..((bi + 1) * per).min(nseg) {
                let (p0, step) = geo.param_of(k);
                for j in 0..seg {
                    let p = if step { p0 + j } else { p0 };
                    let gv = f(g[k * seg + j]);
                    if let Some(xh) = xh {
                        gw[p] += gv * f(xh[k * seg + j]);
                    }
                    if want_b {
                        gb[p] += gv;
                    }
                }
            }
            (gw, gb)
        });
        let mut gw = xh.map(|_| vec![0.0; np]);
        let mut gb = want_b.then(|| vec![0.0; np]);
        for (pw, pb) in parts {
            if let Some(gw) = gw.as_mut() {
                gw.iter_mut().zip(pw).for_each(|(a, v)| *a += v);
            }
            if let Some(gb) = gb.as_mut() {
                gb.iter_mut().zip(pb).for_each(|(a, v)| *a += v);
            }
        }
        (gw, gb)
    }
    Ok(crate::match_float_data!(gdata, "norm_backward", v => {
        let xs = match &dx {
            Some(d) => {
                let (xd, xr) = d.parts();
                Some(&typed(xd, "norm_backward")?[xr])
            }
            None => None,
        };
        go(&v[gr], xs, geo, want_b)
    }))
}

/// What the input gradient's formula subtracts.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum GradMode {
    /// `scale·(g·w − mean(g·w) − x̂·mean(g·w·x̂))` (batch/layer/group norm).
    Centered,
    /// `scale·(g·w − x̂·mean(g·w·x̂))` (RMS norm).
    Uncentered,
    /// `scale·g·w`: an affine map (batch norm in eval mode); no `x̂`.
    Affine,
}

/// The input gradient, with `scale` per statistic and `w` per parameter
/// (1 when absent); `xhat` is needed unless `mode` is `Affine`.
pub(crate) fn input_grad(
    g: &Tensor,
    xhat: Option<&Tensor>,
    geo: Geo,
    mode: GradMode,
    scale: &[f64],
    w: Option<&[f64]>,
) -> Result<Tensor> {
    if let Some(xh) = xhat {
        check_like("norm_backward", xh, g.shape(), g.dtype())?;
    } else if mode != GradMode::Affine {
        return Err(Error::Backward("norm: x̂ missing".into()));
    }
    let with_xhat: Vec<&Tensor> = std::iter::once(g).chain(xhat).collect();
    match backend("norm_backward", &with_xhat)? {
        Backend::Meta => {
            crate::meta::float("norm_backward", g.dtype())?;
            return crate::meta::empty(g.shape(), g.dtype());
        }
        Backend::Cuda(_) => {
            return super::norm_cuda::input_grad(g, xhat, geo, mode, scale, w);
        }
        Backend::Cpu => {}
    }
    let dg = Dense::new(g)?;
    let dx = xhat.map(Dense::new).transpose()?;
    let (gdata, gr) = dg.parts();
    fn go<T: FloatDType>(
        g: &[T],
        xh: Option<&[T]>,
        geo: Geo,
        mode: GradMode,
        scale: &[f64],
        w: Option<&[f64]>,
    ) -> CpuData {
        let seg = geo.seg();
        let gw = |k: usize, j: usize| {
            let (p0, step) = geo.param_of(k);
            let p = if step { p0 + j } else { p0 };
            f(g[k * seg + j]) * w.map_or(1.0, |w| w[p])
        };
        let cnt = geo.count().max(1) as f64;
        let sums: Vec<(f64, f64)> = match (mode, xh) {
            (GradMode::Affine, _) | (_, None) => vec![(0.0, 0.0); geo.nstat()],
            (_, Some(xh)) => par_map(geo.nstat(), g.len(), |s| {
                let (start, count, stride) = geo.segs_of_stat(s);
                let (mut a, mut b) = (0.0, 0.0);
                for i in 0..count {
                    let k = start + i * stride;
                    for j in 0..seg {
                        let v = gw(k, j);
                        a += v;
                        b += v * f(xh[k * seg + j]);
                    }
                }
                (a / cnt, b / cnt)
            }),
        };
        let mut out = vec![T::zero(); g.len()];
        let body = |(k, o): (usize, &mut [T])| {
            let s = geo.stat_of(k);
            let (ma, mb) = sums[s];
            for (j, d) in o.iter_mut().enumerate() {
                let v = gw(k, j);
                let r = match (mode, xh) {
                    (GradMode::Centered, Some(xh)) => v - ma - f(xh[k * seg + j]) * mb,
                    (GradMode::Uncentered, Some(xh)) => v - f(xh[k * seg + j]) * mb,
                    _ => v,
                };
                *d = T::from_f64(scale[s] * r);
            }
        };
        if g.len() >= PARALLEL_THRESHOLD {
            out.par_chunks_mut(seg.max(1)).enumerate().for_each(body);
        } else {
            out.chunks_mut(seg.max(1)).enumerate().for_each(body);
        }
        T::wrap(out)
    }
    let out = crate::match_float_data!(gdata, "norm_backward", v => {
        let xs = match &dx {
            Some(d) => {
                let (xd, xr) = d.parts();
                Some(&typed(xd, "norm_backward")?[xr])
            }
            None => None,
        };
        go(&v[gr], xs, geo, mode, scale, w)
    });
    drop((dg, dx));
    Tensor::from_cpu_data(out, g.shape())
}
