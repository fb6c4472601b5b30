//! Normalisation kernels (batch, layer, group and RMS norm): statistics in
//! f64 (two passes), the normalised input `x̂`, the affine output, and the
//! gradients, parallel over segments/statistics.
//!
//! A contiguous input is cut into *segments*: runs of elements that share
//! one statistic and (for batch/group norm) one affine parameter. Batch norm
//! over `[outer, C, inner]` has segments of `inner` elements with channel
//! `k % C`; group norm over `[N, C, S]` has segments of `S`; layer/RMS norm
//! has one segment per row, whose parameter index runs along the row.

use super::elementwise::typed;
use super::softmax::Dense;
use super::PARALLEL_THRESHOLD;
use crate::meta::{backend, Backend};
use crate::tensor::{CpuData, Tensor};
use crate::{DType, Error, FloatDType, Result, WithDType};
use rayon::prelude::*;

/// How a norm's statistics and parameters are laid over a contiguous input.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Geo {
    /// Batch norm: `[outer, c, inner]`, one statistic per channel.
    Channel {
        outer: usize,
        c: usize,
        inner: usize,
    },
    /// Group norm: `[n, c, spatial]`, one statistic per (sample, group).
    Group {
        n: usize,
        c: usize,
        spatial: usize,
        groups: usize,
    },
    /// Layer / RMS norm: `rows` rows of `len`, one statistic per row.
    Row { rows: usize, len: usize },
}

impl Geo {
    /// Elements per segment.
    fn seg(&self) -> usize {
        match *self {
            Geo::Channel { inner, .. } => inner,
            Geo::Group { spatial, .. } => spatial,
            Geo::Row { len, .. } => len,
        }
    }

    /// Number of segments.
    fn nseg(&self) -> usize {
        match *self {
            Geo::Channel { outer, c, .. } => outer * c,
            Geo::Group { n, c, .. } => n * c,
            Geo::Row { rows, .. } => rows,
        }
    }

    /// Number of statistics.
    pub(crate) fn nstat(&self) -> usize {
        match *self {
            Geo::Channel { c, .. } => c,
            Geo::Group { n, groups, .. } => n * groups,
            Geo::Row { rows, .. } => rows,
        }
    }

    /// Number of affine parameters.
    pub(crate) fn nparam(&self) -> usize {
        match *self {
            Geo::Channel { c, .. } | Geo::Group { c, .. } => c,
            Geo::Row { len, .. } => len,
        }
    }

    /// The statistic of segment `k`.
    fn stat_of(&self, k: usize) -> usize {
        match *self {
            Geo::Channel { c, .. } => k % c,
            Geo::Group { c, groups, .. } => (k / c) * groups + (k % c) / (c / groups),
            Geo::Row { .. } => k,
        }
    }

    /// The first parameter of segment `k` and whether it advances per element.
    fn param_of(&self, k: usize) -> (usize, bool) {
        match *self {
            Geo::Channel { c, .. } | Geo::Group { c, .. } => (k % c, false),
            Geo::Row { .. } => (0, true),
        }
    }

    /// Segments of statistic `s`: `start + i·stride` for `i < count`.
    fn segs_of_stat(&self, s: usize) -> (usize, usize, usize) {
        match *self {
            Geo::Channel { outer, c, .. } => (s, outer, c),
            Geo::Group { c, groups, .. } => {
                let cpg = c / groups;
                ((s / groups) * c + (s % groups) * cpg, cpg, 1)
            }
            Geo::Row { .. } => (s, 1, 1),
        }
    }

    /// Elements per statistic.
    pub(crate) fn count(&self) -> usize {
        self.segs_of_stat(0).1 * self.seg()
    }
}

/// Output and x̂ slices of one task (absent when not wanted).
type SegPair<'a, T> = (Option<&'a mut [T]>, Option<&'a mut [T]>);

/// Weight (`Σ g·x̂`) and bias (`Σ g`) gradients, when wanted.
pub(crate) type ParamGrads = (Option<Vec<f64>>, Option<Vec<f64>>);

/// The dtype statistics are kept in: f64 for f64 inputs, else f32.
pub(crate) fn stat_dtype(d: DType) -> DType {
    if d == DType::F64 {
        DType::F64
    } else {
        DType::F32
    }
}

/// Rounds `v` to the statistics dtype for inputs of dtype `d`.
pub(crate) fn round_stat(d: DType, v: f64) -> f64 {
    if stat_dtype(d) == DType::F64 {
        v
    } else {
        v as f32 as f64
    }
}

#[inline(always)]
fn f<T: WithDType>(v: T) -> f64 {
    WithDType::to_f64(v)
}

/// Maps `0..n` in parallel when `work` (elements touched) is large.
fn par_map<R: Send>(n: usize, work: usize, g: impl Fn(usize) -> R + Sync + Send) -> Vec<R> {
    if work >= PARALLEL_THRESHOLD {
        (0..n).into_par_iter().map(g).collect()
    } else {
        (0..n).map(g).collect()
    }
}

/// Per statistic: the mean (0 when not `centered`) and the biased variance
/// (the mean square when not `centered`), in f64.
pub(crate) fn norm_stats(x: &Tensor, geo: Geo, centered: bool) -> Result<(Vec<f64>, Vec<f64>)> {
    match backend("norm", &[x])? {
        // Per-statistic vectors are small; their values are never used on meta.
        Backend::Meta => return Ok((vec![0.0; geo.nstat()], vec![0.0; geo.nstat()])),
        Backend::Cuda(n) => return Err(crate::meta::not_on_cuda("norm", n)),
        Backend::Cpu => {}
    }
    let dense = Dense::new(x)?;
    let (data, range) = dense.parts();
    fn go<T: FloatDType>(x: &[T], geo: Geo, centered: bool) -> Vec<(f64, f64)> {
        let seg = geo.seg();
        let cnt = geo.count().max(1) as f64;
        par_map(geo.nstat(), x.len(), |s| {
            let (start, count, stride) = geo.segs_of_stat(s);
            let segs = || (0..count).map(|i| &x[(start + i * stride) * seg..][..seg]);
            let mean = if centered {
                segs().flatten().map(|v| f(*v)).sum::<f64>() / cnt
            } else {
                0.0
            };
            let var = segs()
                .flatten()
                .map(|v| (f(*v) - mean) * (f(*v) - mean))
                .sum::<f64>()
                / cnt;
            (mean, var)
        })
    }
    let r = crate::match_float_data!(data, "norm", v => go(&v[range], geo, centered));
    Ok(r.into_iter().unzip())
}

/// `x̂ = (x − mean)·rstd` per statistic, and optionally `y = x̂·w + b` per
/// parameter (`w`, `b` default to 1 and 0). Returns (y, x̂) as requested,
/// contiguous, in `x`'s dtype; `x̂` is rounded to that dtype.
#[allow(clippy::too_many_arguments)]
pub(crate) fn normalize(
    x: &Tensor,
    geo: Geo,
    mean: &[f64],
    rstd: &[f64],
    w: Option<&[f64]>,
    b: Option<&[f64]>,
    want_y: bool,
    want_xhat: bool,
) -> Result<(Option<Tensor>, Option<Tensor>)> {
    match backend("norm", &[x])? {
        Backend::Meta => {
            crate::meta::float("norm", x.dtype())?;
            let out = |want: bool| {
                want.then(|| crate::meta::empty(x.shape(), x.dtype()))
                    .transpose()
            };
            return Ok((out(want_y)?, out(want_xhat)?));
        }
        Backend::Cuda(n) => return Err(crate::meta::not_on_cuda("norm", n)),
        Backend::Cpu => {}
    }
    let dense = Dense::new(x)?;
    let (data, range) = dense.parts();
    #[allow(clippy::too_many_arguments)]
    fn go<T: FloatDType>(
        x: &[T],
        geo: Geo,
        mean: &[f64],
        rstd: &[f64],
        w: Option<&[f64]>,
        b: Option<&[f64]>,
        want_y: bool,
        want_xhat: bool,
    ) -> (Option<CpuData>, Option<CpuData>) {
        let seg = geo.seg();
        let n = x.len();
        let mut y = if want_y { vec![T::zero(); n] } else { vec![] };
        let mut xh = if want_xhat {
            vec![T::zero(); n]
        } else {
            vec![]
        };
        // tasks of `per` whole segments (at least ~4096 elements each)
        let (nseg, per) = (geo.nseg(), 4096usize.div_ceil(seg.max(1)));
        let body = |t: usize, ys: &mut [T], xs: &mut [T]| {
            for k in t * per..((t + 1) * per).min(nseg) {
                let (s, (p0, step)) = (geo.stat_of(k), geo.param_of(k));
                let o = (k - t * per) * seg;
                for (j, v) in x[k * seg..(k + 1) * seg].iter().enumerate() {
                    let h = (f(*v) - mean[s]) * rstd[s];
                    if !xs.is_empty() {
                        xs[o + j] = T::from_f64(h);
                    }
                    if !ys.is_empty() {
                        let p = if step { p0 + j } else { p0 };
                        let wv = w.map_or(1.0, |w| w[p]);
                        let bv = b.map_or(0.0, |b| b[p]);
                        ys[o + j] = T::from_f64(h * wv + bv);
                    }
                }
            }
        };
        fn tasks<T>(buf: &mut [T], block: usize, n: usize) -> Vec<Option<&mut [T]>> {
            if buf.is_empty() {
                (0..n).map(|_| None).collect()
            } else {
                buf.chunks_mut(block).map(Some).collect()
            }
        }
        let ntask = nseg.div_ceil(per);
        let block = (per * seg).max(1);
        let (ya, xa) = (tasks(&mut y, block, ntask), tasks(&mut xh, block, ntask));
        let run = |(t, (yo, xo)): (usize, SegPair<'_, T>)| {
            body(t, yo.unwrap_or(&mut []), xo.unwrap_or(&mut []))
        };
        if n >= PARALLEL_THRESHOLD {
            ya.into_par_iter()
                .zip(xa.into_par_iter())
                .enumerate()
                .for_each(run);
        } else {
            ya.into_iter().zip(xa).enumerate().for_each(run);
        }
        (want_y.then(|| T::wrap(y)), want_xhat.then(|| T::wrap(xh)))
    }
    let (y, xh) = crate::match_float_data!(data, "norm", v =>
        go(&v[range], geo, mean, rstd, w, b, want_y, want_xhat));
    drop(dense);
    let wrap = |d: Option<CpuData>| d.map(|d| Tensor::from_cpu_data(d, x.shape())).transpose();
    Ok((wrap(y)?, wrap(xh)?))
}

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

/// Parameter gradients: `Σ g·x̂` (when `xhat` is given) and `Σ g` (when
/// `want_b`) per affine parameter, in f64, summed in a fixed order.
pub(crate) fn param_grads(
    g: &Tensor,
    xhat: Option<&Tensor>,
    geo: Geo,
    want_b: bool,
) -> Result<ParamGrads> {
    let with_xhat: Vec<&Tensor> = std::iter::once(g).chain(xhat).collect();
    match backend("norm_backward", &with_xhat)? {
        Backend::Meta => {
            let np = geo.nparam();
            return Ok((xhat.map(|_| vec![0.0; np]), want_b.then(|| vec![0.0; np])));
        }
        Backend::Cuda(n) => return Err(crate::meta::not_on_cuda("norm_backward", n)),
        Backend::Cpu => {}
    }
    let dg = Dense::new(g)?;
    let dx = xhat.map(Dense::new).transpose()?;
    let (gdata, gr) = dg.parts();
    fn go<T: FloatDType>(g: &[T], xh: Option<&[T]>, geo: Geo, want_b: bool) -> ParamGrads {
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
        Backend::Cuda(n) => return Err(crate::meta::not_on_cuda("norm_backward", n)),
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

/// Overwrites the contiguous tensor `t` with `values` (rounded to its
/// dtype); bumps its version. Used for running statistics.
pub(crate) fn write_values(t: &Tensor, values: &[f64]) -> Result<()> {
    let range = t
        .layout()
        .contiguous_range()
        .ok_or(Error::InvalidArgument {
            op: "norm",
            msg: "running statistics must be contiguous".into(),
        })?;
    if range.len() != values.len() {
        return Err(Error::ShapeMismatch {
            op: "norm",
            lhs: t.shape().to_vec(),
            rhs: vec![values.len()],
        });
    }
    match backend("norm", &[t])? {
        Backend::Meta => {
            crate::meta::touch(t);
            return Ok(());
        }
        Backend::Cuda(n) => return Err(crate::meta::not_on_cuda("norm", n)),
        Backend::Cpu => {}
    }
    let mut data = t.storage().cpu_mut()?;
    fn go<T: WithDType>(d: &mut [T], values: &[f64]) {
        d.iter_mut()
            .zip(values)
            .for_each(|(d, v)| *d = T::from_f64(*v));
    }
    crate::match_cpu_data!(&mut *data, d => go(&mut d[range.clone()], values));
    Ok(())
}
