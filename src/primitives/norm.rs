//! Normalisation kernels (batch, layer, group and RMS norm): statistics in
//! f64 (two passes), the normalised input `x̂`, the affine output, and the
//! gradients, parallel over segments/statistics.
//!
//! A contiguous input is cut into *segments*: runs of elements that share
//! one statistic and (for batch/group norm) one affine parameter. Batch norm
//! over `[outer, C, inner]` has segments of `inner` elements with channel
//! `k % C`; group norm over `[N, C, S]` has segments of `S`; layer/RMS norm
//! has one segment per row, whose parameter index runs along the row.

use super::softmax::Dense;
use super::PARALLEL_THRESHOLD;
use crate::dtype::CpuData;
use crate::meta::{backend, Backend};
use crate::tensor::Tensor;
use crate::{DType, Error, FloatDType, Result, WithDType};
use rayon::prelude::*;

pub(crate) use super::norm_grad::{input_grad, param_grads, GradMode};

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
    pub(super) fn seg(&self) -> usize {
        match *self {
            Geo::Channel { inner, .. } => inner,
            Geo::Group { spatial, .. } => spatial,
            Geo::Row { len, .. } => len,
        }
    }

    /// Number of segments.
    pub(super) fn nseg(&self) -> usize {
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
    pub(super) fn stat_of(&self, k: usize) -> usize {
        match *self {
            Geo::Channel { c, .. } => k % c,
            Geo::Group { c, groups, .. } => (k / c) * groups + (k % c) / (c / groups),
            Geo::Row { .. } => k,
        }
    }

    /// The first parameter of segment `k` and whether it advances per element.
    pub(super) fn param_of(&self, k: usize) -> (usize, bool) {
        match *self {
            Geo::Channel { c, .. } | Geo::Group { c, .. } => (k % c, false),
            Geo::Row { .. } => (0, true),
        }
    }

    /// Segments of statistic `s`: `start + i·stride` for `i < count`.
    pub(super) fn segs_of_stat(&self, s: usize) -> (usize, usize, usize) {
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
pub(super) fn f<T: WithDType>(v: T) -> f64 {
    WithDType::to_f64(v)
}

/// Maps `0..n` in parallel when `work` (elements touched) is large.
pub(super) fn par_map<R: Send>(
    n: usize,
    work: usize,
    g: impl Fn(usize) -> R + Sync + Send,
) -> Vec<R> {
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
        Backend::Cuda(_) => return super::norm_cuda::norm_stats(x, geo, centered),
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
        Backend::Cuda(_) => {
            return super::norm_cuda::normalize(x, geo, mean, rstd, w, b, want_y, want_xhat)
        }
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
        Backend::Cuda(_) => return super::norm_cuda::write_values(t, range, values),
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
