//! The CPU kernels of the norms (batch, layer, group and RMS norm), called
//! by the dispatch seam in `norm/mod.rs` for CPU tensors: statistics in f64
//! (two passes), the normalised input `x̂`, the affine output, the input
//! and parameter gradients, and the running statistics' write-back;
//! parallel over segments/statistics, in a fixed summation order.
//!
//! A contiguous input is cut into *segments* ([`NormGeom::seg`]): runs of
//! elements that share one statistic and (for batch/group norm) one affine
//! parameter. Batch norm over `[outer, C, inner]` has segments of `inner`
//! elements with channel `k % C`; group norm over `[N, C, S]` has segments
//! of `S`; layer/RMS norm has one segment per row, whose parameter index
//! runs along the row.

use super::{GradMode, GradScale, NormGeom, Normalize, Prep, Prepared};
use crate::dtype::{stat_dtype, CpuData};
use crate::memory::host::try_for_overwrite;
use crate::memory::uncounted;
use crate::primitives::{as_f32, parallel, typed, widest_vectors, Dense};
use crate::tensor::Tensor;
use crate::{DType, Device, FloatDType, Result, WithDType};
use rayon::prelude::*;
use std::ops::Range;

/// The CPU's walk over the geometry, in segments.
impl NormGeom {
    /// Number of segments (none when the input is empty).
    fn nseg(&self) -> usize {
        self.numel().checked_div(self.seg).unwrap_or(0)
    }

    /// The statistic of segment `k`.
    fn stat_of(&self, k: usize) -> usize {
        (k * self.seg / self.b.max(1)) % self.s.max(1)
    }

    /// The first parameter of segment `k` and whether it advances per
    /// element (a segment holds one parameter, or walks a row of them).
    fn param_of(&self, k: usize) -> (usize, bool) {
        debug_assert!(self.seg == self.lp || self.lp == 1);
        (
            (k * self.seg / self.lp.max(1)) % self.p.max(1),
            self.seg > self.lp,
        )
    }

    /// The segments of statistic `i`, in element order: each of its `a`
    /// runs of `b` elements is `b / seg` consecutive segments.
    fn segs_of(&self, i: usize) -> impl Iterator<Item = usize> {
        let per_run = self.b.checked_div(self.seg).unwrap_or(0);
        let (s, a) = (self.s, self.a);
        (0..a).flat_map(move |r| (r * s + i) * per_run..(r * s + i + 1) * per_run)
    }
}

/// Output and x̂ slices of one task (absent when not wanted).
type SegPair<'a, T> = (Option<&'a mut [T]>, Option<&'a mut [T]>);

/// Weight (`Σ g·x̂`) and bias (`Σ g`) gradients as f64 sums, when wanted.
type ParamSums = (Option<Vec<f64>>, Option<Vec<f64>>);

#[inline(always)]
fn f<T: WithDType>(v: T) -> f64 {
    WithDType::to_f64(v)
}

/// Maps `0..n` in parallel when `work` (elements touched) is large.
fn par_map<R: Send>(n: usize, work: usize, g: impl Fn(usize) -> R + Sync + Send) -> Vec<R> {
    if parallel(work) {
        (0..n).into_par_iter().map(g).collect()
    } else {
        (0..n).map(g).collect()
    }
}

/// `(Σ term(x_i, y_i).0, Σ term(x_i, y_i).1)` in f64 over two slices of
/// one length, each sum in [`LANES`] interleaved partial sums (element `i`
/// of the whole chunks into lane `i % LANES`, the tail in order) added
/// pairwise at the end: a fixed order whose adds do not wait on each
/// other, so the loop runs at the vector units' throughput rather than one
/// add's latency per element.
#[inline(always)]
fn lane_sums<T: Copy>(x: &[T], y: &[T], term: impl Fn(T, T) -> (f64, f64)) -> (f64, f64) {
    let n = x.len().min(y.len());
    let (x, y) = (&x[..n], &y[..n]);
    let (mut a, mut b) = ([0.0f64; LANES], [0.0f64; LANES]);
    let (xc, yc) = (x.chunks_exact(LANES), y.chunks_exact(LANES));
    let (xr, yr) = (xc.remainder(), yc.remainder());
    for (xs, ys) in xc.zip(yc) {
        for l in 0..LANES {
            let (u, v) = term(xs[l], ys[l]);
            a[l] += u;
            b[l] += v;
        }
    }
    let (mut ta, mut tb) = (0.0, 0.0);
    for (&u, &v) in xr.iter().zip(yr) {
        let (u, v) = term(u, v);
        ta += u;
        tb += v;
    }
    (fold_lanes(a) + ta, fold_lanes(b) + tb)
}

/// The partial sums of [`lane_sums`] added pairwise, in its fixed order.
#[inline(always)]
fn fold_lanes(s: [f64; LANES]) -> f64 {
    ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]))
}

/// `Σ term(x_i)` over one slice, in [`lane_sums`]'s order.
#[inline(always)]
fn lane_sum<T: Copy>(x: &[T], term: impl Fn(T) -> f64) -> f64 {
    lane_sums(x, x, |u, _| (term(u), 0.0)).0
}

/// Partial sums of [`lane_sums`].
const LANES: usize = 8;

/// Per segment of one statistic and one parameter: `(Σ g·w, Σ g·w·x̂)`
/// over the segment's `g` and `x̂` slices (one length), in [`lane_sums`]'s
/// order.
#[inline(always)]
fn seg_grad_sums<T: FloatDType>(g: &[T], xh: &[T], w: f64) -> (f64, f64) {
    #[cfg(target_arch = "x86_64")]
    if let (Some(g), Some(xh), true) = (as_f32(g), as_f32(xh), avx::present()) {
        // SAFETY: AVX2 is present.
        return unsafe { avx::grad_sums(g, xh, w) };
    }
    lane_sums(g, xh, |g, x| {
        let gw = f(g) * w;
        (gw, gw * f(x))
    })
}

/// `Σ x` over one segment in f64, in [`lane_sums`]'s order.
#[inline(always)]
fn seg_sum<T: FloatDType>(x: &[T]) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if let (Some(x), true) = (as_f32(x), avx::present()) {
        // SAFETY: AVX2 is present.
        return unsafe { avx::sum(x) };
    }
    lane_sum(x, f)
}

/// `Σ (x − mean)²` over one segment in f64, in [`lane_sums`]'s order.
#[inline(always)]
fn seg_square_deviations<T: FloatDType>(x: &[T], mean: f64) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if let (Some(x), true) = (as_f32(x), avx::present()) {
        // SAFETY: AVX2 is present.
        return unsafe { avx::square_deviations(x, mean) };
    }
    lane_sum(x, |v| {
        let d = f(v) - mean;
        d * d
    })
}

/// The f32 segment sums on AVX2, bit for bit [`lane_sums`]: an 8-float
/// chunk's lanes 0–3 and 4–7 are two f64×4 vectors, each lane's sum adds
/// its terms in the same order with the same roundings (separate
/// multiplies and adds: no FMA), and the tail and the final fold are the
/// scalar code's. The compiler vectorises the generic loop poorly (scalar
/// converts and inserts): in a ResNet-18 224² step these sums fell from
/// 3.2–3.5% of the time to 2.1%.
#[cfg(target_arch = "x86_64")]
mod avx {
    use super::{fold_lanes, lane_sums, LANES};
    use std::arch::x86_64::*;

    /// Whether the CPU runs this module.
    pub(super) fn present() -> bool {
        crate::primitives::avx2_fma()
    }

    /// [`lane_sums`] over f32 slices with the term on f64×4 vectors
    /// (`vector`) and on single values for the tail (`scalar`): the two
    /// must compute the same thing.
    #[inline(always)]
    unsafe fn sums(
        (x, y): (&[f32], &[f32]),
        vector: impl Fn(__m256d, __m256d) -> (__m256d, __m256d),
        scalar: impl Fn(f32, f32) -> (f64, f64),
    ) -> (f64, f64) {
        let n = x.len().min(y.len());
        let whole = n / LANES * LANES;
        let zero = _mm256_setzero_pd();
        let (mut a, mut b) = ([zero; 2], [zero; 2]);
        for i in (0..whole).step_by(LANES) {
            // SAFETY: 8 floats from i < whole ≤ n of both slices.
            let (xv, yv) = unsafe {
                (
                    _mm256_loadu_ps(x.as_ptr().add(i)),
                    _mm256_loadu_ps(y.as_ptr().add(i)),
                )
            };
            let halves = [
                (_mm256_castps256_ps128(xv), _mm256_castps256_ps128(yv)),
                (
                    _mm256_extractf128_ps::<1>(xv),
                    _mm256_extractf128_ps::<1>(yv),
                ),
            ];
            for (h, (xh, yh)) in halves.into_iter().enumerate() {
                let (u, v) = vector(_mm256_cvtps_pd(xh), _mm256_cvtps_pd(yh));
                a[h] = _mm256_add_pd(a[h], u);
                b[h] = _mm256_add_pd(b[h], v);
            }
        }
        let lanes = |s: [__m256d; 2]| {
            let mut out = [0.0f64; LANES];
            // SAFETY: 8 f64 into an array of 8.
            unsafe {
                _mm256_storeu_pd(out.as_mut_ptr(), s[0]);
                _mm256_storeu_pd(out.as_mut_ptr().add(4), s[1]);
            }
            out
        };
        let (la, lb) = (lanes(a), lanes(b));
        // The tail (fewer than 8 elements: `lane_sums` adds them in order
        // from zero), then the lanes folded and the tail added, as there.
        let (ta, tb) = lane_sums(&x[whole..n], &y[whole..n], scalar);
        (fold_lanes(la) + ta, fold_lanes(lb) + tb)
    }

    /// `seg_grad_sums` for f32.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn grad_sums(g: &[f32], xh: &[f32], w: f64) -> (f64, f64) {
        let wv = _mm256_set1_pd(w);
        let vector = |g, x| {
            let gw = _mm256_mul_pd(g, wv);
            (gw, _mm256_mul_pd(gw, x))
        };
        let scalar = |g: f32, x: f32| {
            let gw = f64::from(g) * w;
            (gw, gw * f64::from(x))
        };
        // SAFETY: AVX2 is present (this function's feature).
        unsafe { sums((g, xh), vector, scalar) }
    }

    /// `seg_sum` for f32.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn sum(x: &[f32]) -> f64 {
        let vector = |x, _| (x, _mm256_setzero_pd());
        // SAFETY: AVX2 is present (this function's feature).
        unsafe { sums((x, x), vector, |x, _| (f64::from(x), 0.0)).0 }
    }

    /// `seg_square_deviations` for f32.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn square_deviations(x: &[f32], mean: f64) -> f64 {
        let m = _mm256_set1_pd(mean);
        let vector = |x, _| {
            let d = _mm256_sub_pd(x, m);
            (_mm256_mul_pd(d, d), _mm256_setzero_pd())
        };
        let scalar = |x: f32, _| {
            let d = f64::from(x) - mean;
            (d * d, 0.0)
        };
        // SAFETY: AVX2 is present (this function's feature).
        unsafe { sums((x, x), vector, scalar).0 }
    }
}

/// Per statistic: the mean (0 when not `centered`) and the biased variance
/// (the mean square when not `centered`), in f64.
pub(super) fn norm_stats(x: &Tensor, geo: NormGeom, centered: bool) -> Result<(Tensor, Tensor)> {
    let dense = Dense::new(x)?;
    let (data, range) = dense.parts();
    fn go<T: FloatDType>(x: &[T], geo: NormGeom, centered: bool) -> Vec<(f64, f64)> {
        let seg = geo.seg;
        let cnt = geo.count().max(1) as f64;
        // Each segment's sum in lanes, the segments' sums in element order.
        par_map(geo.nstat(), x.len(), |s| {
            let segs = || geo.segs_of(s).map(|k| &x[k * seg..][..seg]);
            let mean = if centered {
                segs().map(seg_sum).sum::<f64>() / cnt
            } else {
                0.0
            };
            let var = segs().map(|x| seg_square_deviations(x, mean)).sum::<f64>() / cnt;
            (mean, var)
        })
    }
    let r = crate::match_float_data!(data, "norm", v => go(&v[range], geo, centered));
    let (mean, var): (Vec<f64>, Vec<f64>) = r.into_iter().unzip();
    uncounted(|| {
        let s = [geo.nstat()];
        Ok((
            Tensor::from_vec(mean, &s, Device::Cpu)?,
            Tensor::from_vec(var, &s, Device::Cpu)?,
        ))
    })
}

/// Rounds `v` to the statistics dtype for inputs of dtype `d`.
fn round_stat(d: DType, v: f64) -> f64 {
    if stat_dtype(d) == DType::F64 {
        v
    } else {
        v as f32 as f64
    }
}

/// Host values as a statistics tensor (of the statistics dtype for inputs
/// of `dtype`; the values are already rounded to it).
fn stat_values(values: &[f64], dtype: DType) -> Result<Tensor> {
    Tensor::from_f64_slice(values, &[values.len()], stat_dtype(dtype), Device::Cpu)
}

/// The seam's [`Prep`] on host values: rounded mean, `rstd = 1/√(var +
/// eps)` and `scale = w·rstd`, and the running statistics' update (in f64,
/// from the unrounded moments, then rounded to their dtype).
pub(super) fn prepare(p: &Prep<'_>) -> Result<Prepared> {
    let var = p.var.small_values()?;
    let mean = match p.mean {
        Some(m) => m.small_values()?,
        None => crate::memory::host::try_zeroed(var.len())?,
    };
    if let Some(u) = &p.update {
        let upd = |old: &Tensor, new: &[f64], k: f64| -> Result<()> {
            let values: Vec<f64> = old
                .small_values()?
                .iter()
                .zip(new)
                .map(|(o, n)| (1.0 - u.momentum) * o + u.momentum * n * k)
                .collect();
            write_values(old, &values)
        };
        upd(u.mean, &mean, 1.0)?;
        upd(u.var, &var, u.unbias)?;
        if let Some(c) = u.counter {
            let count = c.small_values()?;
            write_values(c, &[count.first().copied().unwrap_or(0.0) + 1.0])?;
        }
    }
    let rstd: Vec<f64> = var
        .iter()
        .map(|v| round_stat(p.dtype, 1.0 / (v + p.eps).sqrt()))
        .collect();
    let w = p.weight.map(|w| w.small_values()).transpose()?;
    uncounted(|| {
        let mean = p
            .want_mean
            .then(|| {
                let m: Vec<f64> = mean.iter().map(|m| round_stat(p.dtype, *m)).collect();
                stat_values(&m, p.dtype)
            })
            .transpose()?;
        let scale = p
            .want_scale
            .then(|| stat_values(&scale_values(w.as_deref(), &rstd, p.dtype), p.dtype))
            .transpose()?;
        let rstd = p
            .want_rstd
            .then(|| stat_values(&rstd, p.dtype))
            .transpose()?;
        Ok(Prepared { mean, rstd, scale })
    })
}

/// `w·rstd` per statistic (or `rstd`), rounded to the statistics dtype.
fn scale_values(w: Option<&[f64]>, rstd: &[f64], dtype: DType) -> Vec<f64> {
    match w {
        Some(w) => w
            .iter()
            .zip(rstd)
            .map(|(w, s)| round_stat(dtype, w * s))
            .collect(),
        None => rstd.to_vec(),
    }
}

/// The seam's `scale_tensor` on the CPU: a new tensor counted under the
/// current category.
pub(super) fn scale_tensor(w: Option<&Tensor>, rstd: &Tensor) -> Result<Tensor> {
    let dtype = w.map_or(rstd.dtype(), |w| w.dtype());
    let w = w.map(|w| w.small_values()).transpose()?;
    stat_values(
        &scale_values(w.as_deref(), &rstd.small_values()?, dtype),
        dtype,
    )
}

/// [`Normalize`]'s statistics and parameters as host values.
struct HostNorm {
    mean: Vec<f64>,
    rstd: Vec<f64>,
    w: Option<Vec<f64>>,
    b: Option<Vec<f64>>,
    want_y: bool,
    want_xhat: bool,
}

impl HostNorm {
    fn of(n: &Normalize<'_>) -> Result<HostNorm> {
        let rstd = n.rstd.small_values()?;
        let mean = match n.mean {
            Some(m) => m.small_values()?,
            None => crate::memory::host::try_zeroed(rstd.len())?,
        };
        let values = |t: Option<&Tensor>| t.map(|t| t.small_values()).transpose();
        Ok(HostNorm {
            mean,
            rstd,
            w: values(n.w)?,
            b: values(n.b)?,
            want_y: n.want_y,
            want_xhat: n.want_xhat,
        })
    }
}

/// `x̂ = (x − mean)·rstd` per statistic, and optionally `y = x̂·w + b` per
/// parameter (`w`, `b` default to 1 and 0). Returns (y, x̂) as requested,
/// contiguous, in `x`'s dtype; `x̂` is rounded to that dtype. Tasks of whole
/// segments write disjoint slices of the outputs.
pub(super) fn normalize(
    x: &Tensor,
    geo: NormGeom,
    norm: &Normalize<'_>,
) -> Result<(Option<Tensor>, Option<Tensor>)> {
    let n = &HostNorm::of(norm)?;
    if norm.y_over_x {
        // `x` is exclusive (the seam checked it): y is written over it.
        let xh = {
            let range = dense_range(x)?;
            let mut data = x.storage().cpu_mut()?;
            crate::match_float_data!(&mut *data, "norm", v =>
                normalize_into(None, &mut v[range], geo, n)?)
        };
        let xh = xh
            .map(|d| Tensor::from_cpu_data(d, x.shape()))
            .transpose()?;
        return Ok((Some(x.detach()), xh));
    }
    let dense = Dense::new(x)?;
    let (data, range) = dense.parts();
    let (y, xh) = crate::match_float_data!(data, "norm", v => {
        let xs = &v[range];
        normalize_fresh(xs, geo, n)?
    });
    drop(dense);
    let wrap = |d: Option<CpuData>| d.map(|d| Tensor::from_cpu_data(d, x.shape())).transpose();
    Ok((wrap(y)?, wrap(xh)?))
}

/// `normalize_into` into a new `y` (when wanted): (y, x̂).
fn normalize_fresh<T: FloatDType>(
    xs: &[T],
    geo: NormGeom,
    n: &HostNorm,
) -> Result<(Option<CpuData>, Option<CpuData>)> {
    // Every element is written (tasks of whole segments) before any read.
    let mut y = try_for_overwrite::<T>(if n.want_y { xs.len() } else { 0 })?;
    let xh = normalize_into(Some(xs), &mut y, geo, n)?;
    Ok((n.want_y.then(|| T::wrap(y)), xh))
}

/// The whole contiguous range of an exclusive tensor's storage.
fn dense_range(x: &Tensor) -> Result<Range<usize>> {
    x.layout()
        .contiguous_range()
        .ok_or_else(|| crate::Error::Backward("norm: in-place output must be contiguous".into()))
}

/// Computes `y` into `ys` (empty when not wanted) and returns `x̂` when
/// wanted. The input is `x`, or `ys` itself when `x` is `None` (y written
/// over x: each element is read before its slot is written, by one task).
fn normalize_into<T: FloatDType>(
    x: Option<&[T]>,
    ys: &mut [T],
    geo: NormGeom,
    n: &HostNorm,
) -> Result<Option<CpuData>> {
    let (mean, rstd, want_xhat) = (&n.mean[..], &n.rstd[..], n.want_xhat);
    let (w, b) = (n.w.as_deref(), n.b.as_deref());
    let seg = geo.seg;
    let len = x.map_or(ys.len(), |x| x.len());
    let mut xh = try_for_overwrite::<T>(if want_xhat { len } else { 0 })?;
    // tasks of `per` whole segments (at least ~4096 elements each)
    let (nseg, per) = (geo.nseg(), 4096usize.div_ceil(seg.max(1)));
    let body = |t: usize, ys: &mut [T], xs: &mut [T]| {
        for k in t * per..((t + 1) * per).min(nseg) {
            let (s, (p0, step)) = (geo.stat_of(k), geo.param_of(k));
            let o = (k - t * per) * seg;
            let x = x.map(|x| &x[k * seg..][..seg]);
            let (yo, xo) = (part(ys, o, seg), part(xs, o, seg));
            let mr = (mean[s], rstd[s]);
            if step {
                let params = (w.map(|w| &w[p0..p0 + seg]), b.map(|b| &b[p0..p0 + seg]));
                normalize_row(x, yo, xo, mr, params);
            } else {
                let affine = (w.map_or(1.0, |w| w[p0]), b.map_or(0.0, |b| b[p0]));
                normalize_params(x, yo, xo, mr, std::iter::repeat(affine));
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
    let (ya, xa) = (tasks(ys, block, ntask), tasks(&mut xh, block, ntask));
    let run = |(t, (yo, xo)): (usize, SegPair<'_, T>)| {
        body(t, yo.unwrap_or(&mut []), xo.unwrap_or(&mut []))
    };
    if parallel(len) {
        ya.into_par_iter()
            .zip(xa.into_par_iter())
            .enumerate()
            .for_each(run);
    } else {
        ya.into_iter().zip(xa).enumerate().for_each(run);
    }
    Ok(want_xhat.then(|| T::wrap(xh)))
}

/// Elements `o..o + n` of `buf`, or `buf` itself when it is empty (an
/// output that is not wanted).
#[inline(always)]
fn part<T>(buf: &mut [T], o: usize, n: usize) -> &mut [T] {
    if buf.is_empty() {
        buf
    } else {
        &mut buf[o..o + n]
    }
}

/// Overwrites the contiguous tensor `t` (checked by the seam) with `values`
/// rounded to its dtype; bumps its version.
fn write_values(t: &Tensor, values: &[f64]) -> Result<()> {
    let range = t.layout().contiguous_range().ok_or_else(|| {
        crate::Error::Backward("norm: running statistics must be contiguous".into())
    })?;
    let mut data = t.storage().cpu_mut()?;
    fn go<T: WithDType>(d: &mut [T], values: &[f64]) {
        d.iter_mut()
            .zip(values)
            .for_each(|(d, v)| *d = T::from_f64(*v));
    }
    crate::match_cpu_data!(&mut *data, d => go(&mut d[range.clone()], values));
    Ok(())
}

/// Parameter gradients as f64 sums per affine parameter: `Σ g·x̂` (when
/// `xhat` is given) and `Σ g` (when `want_b`), in blocks of whole segments
/// whose partial sums are added in block order (a fixed order).
pub(super) fn param_sums(
    g: &Tensor,
    xhat: Option<&Tensor>,
    geo: NormGeom,
    want_b: bool,
) -> Result<ParamSums> {
    let dg = Dense::new(g)?;
    let dx = xhat.map(Dense::new).transpose()?;
    let (gdata, gr) = dg.parts();
    fn go<T: FloatDType>(g: &[T], xh: Option<&[T]>, geo: NormGeom, want_b: bool) -> ParamSums {
        let (seg, nseg, np) = (geo.seg, geo.nseg(), geo.nparam());
        let blocks = 64.min(nseg.max(1));
        let per = nseg.div_ceil(blocks).max(1);
        let parts = par_map(nseg.div_ceil(per), g.len(), |bi| {
            let mut gw = vec![0.0; if xh.is_some() { np } else { 0 }];
            let mut gb = vec![0.0; if want_b { np } else { 0 }];
            for k in bi * per..((bi + 1) * per).min(nseg) {
                let (p0, step) = geo.param_of(k);
                if !step {
                    // One parameter per segment: its sums in lanes.
                    let g = &g[k * seg..][..seg];
                    match xh {
                        Some(xh) => {
                            let (sg, sgx) = seg_grad_sums(g, &xh[k * seg..][..seg], 1.0);
                            gw[p0] += sgx;
                            if want_b {
                                gb[p0] += sg;
                            }
                        }
                        None if want_b => gb[p0] += seg_sum(g),
                        None => {}
                    }
                    continue;
                }
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

/// The input gradient, with `scale` per statistic and `w` per parameter
/// (1 when absent); `xhat` (checked by the seam against `g`) is read unless
/// `mode` is `Affine`.
pub(super) fn input_grad(
    g: &Tensor,
    xhat: Option<&Tensor>,
    geo: NormGeom,
    mode: GradMode,
    by: GradScale<'_>,
    sums: Option<&[(f64, f64)]>,
) -> Result<Tensor> {
    let (scale, w) = host_scale(by)?;
    let grad = InputGrad {
        geo,
        mode,
        scale: &scale,
        w: w.as_deref(),
        sums,
    };
    let dg = Dense::new(g)?;
    let dx = xhat.map(Dense::new).transpose()?;
    let (gdata, gr) = dg.parts();
    let out = crate::match_float_data!(gdata, "norm_backward", v => {
        let gs = &v[gr];
        grad.fresh(gs, xhat_slice(dx.as_ref())?)?
    });
    drop((dg, dx));
    Tensor::from_cpu_data(out, g.shape())
}

/// [`input_grad`] written over `g` itself, which nothing else holds (the
/// seam checked): the same values, no new buffer.
pub(super) fn input_grad_in_place(
    g: &Tensor,
    xhat: Option<&Tensor>,
    geo: NormGeom,
    mode: GradMode,
    by: GradScale<'_>,
    sums: Option<&[(f64, f64)]>,
) -> Result<()> {
    let (scale, w) = host_scale(by)?;
    let grad = InputGrad {
        geo,
        mode,
        scale: &scale,
        w: w.as_deref(),
        sums,
    };
    let dx = xhat.map(Dense::new).transpose()?;
    let range = g.layout().contiguous_range().ok_or_else(|| {
        crate::Error::Backward("norm: in-place gradient must be contiguous".into())
    })?;
    let mut data = g.storage().cpu_mut()?;
    crate::match_float_data!(&mut *data, "norm_backward", v =>
        grad.run(None, &mut v[range], xhat_slice(dx.as_ref())?)?);
    Ok(())
}

/// The input gradient's scale and weight as host values.
fn host_scale(by: GradScale<'_>) -> Result<(Vec<f64>, Option<Vec<f64>>)> {
    Ok((
        by.scale.small_values()?,
        by.w.map(|w| w.small_values()).transpose()?,
    ))
}

/// Per statistic `(Σ g, Σ g·x̂)`: the sums [`input_grad`] makes without
/// weights, in its order (each segment in lanes, the segments of a
/// statistic in element order).
pub(super) fn stat_sums(g: &Tensor, xhat: &Tensor, geo: NormGeom) -> Result<Vec<(f64, f64)>> {
    let dg = Dense::new(g)?;
    let dx = Dense::new(xhat)?;
    let (gdata, gr) = dg.parts();
    fn go<T: FloatDType>(g: &[T], xh: &[T], geo: NormGeom) -> Vec<(f64, f64)> {
        let seg = geo.seg;
        par_map(geo.nstat(), g.len(), |s| {
            let (mut a, mut b) = (0.0, 0.0);
            for k in geo.segs_of(s) {
                let r = k * seg..(k + 1) * seg;
                let (sa, sb) = seg_grad_sums(&g[r.clone()], &xh[r], 1.0);
                a += sa;
                b += sb;
            }
            (a, b)
        })
    }
    Ok(crate::match_float_data!(gdata, "norm_backward", v => {
        let xs = xhat_slice(Some(&dx))?.unwrap_or_default();
        go(&v[gr], xs, geo)
    }))
}

/// The saved `x̂` as a typed slice.
fn xhat_slice<'a, T: FloatDType>(dx: Option<&'a Dense<'a>>) -> Result<Option<&'a [T]>> {
    dx.map(|d| {
        let (xd, xr) = d.parts();
        Ok(&typed(xd, "norm_backward")?[xr])
    })
    .transpose()
}

/// What the input gradient of a norm is computed from, besides `g`, `x̂`.
struct InputGrad<'a> {
    geo: NormGeom,
    mode: GradMode,
    scale: &'a [f64],
    w: Option<&'a [f64]>,
    /// [`stat_sums`] of `g` and `x̂`, when already computed (`w` absent).
    sums: Option<&'a [(f64, f64)]>,
}

impl InputGrad<'_> {
    /// The input gradient into a new buffer.
    fn fresh<T: FloatDType>(&self, g: &[T], xh: Option<&[T]>) -> Result<CpuData> {
        let mut out = try_for_overwrite::<T>(g.len())?;
        self.run(Some(g), &mut out, xh)?;
        Ok(T::wrap(out))
    }

    /// Writes the input gradient into `out`, reading `g`, or `out` itself
    /// when `g` is `None` (in place: the sums read every element first, then
    /// each task reads and writes only its own segments).
    fn run<T: FloatDType>(&self, g: Option<&[T]>, out: &mut [T], xh: Option<&[T]>) -> Result<()> {
        let InputGrad {
            geo,
            mode,
            scale,
            w,
            sums: known,
        } = *self;
        let seg = geo.seg;
        let len = out.len();
        let cnt = geo.count().max(1) as f64;
        let sums: Vec<(f64, f64)> = {
            let gs: &[T] = g.unwrap_or(&*out);
            match (mode, xh, known) {
                (GradMode::Affine, _, _) | (_, None, _) => vec![(0.0, 0.0); geo.nstat()],
                (_, Some(_), Some(known)) => {
                    known.iter().map(|(a, b)| (a / cnt, b / cnt)).collect()
                }
                (_, Some(xh), None) => par_map(geo.nstat(), len, |s| {
                    let (mut a, mut b) = (0.0, 0.0);
                    for k in geo.segs_of(s) {
                        let ps = geo.param_of(k);
                        if !ps.1 {
                            let wv = w.map_or(1.0, |w| w[ps.0]);
                            let r = k * seg..(k + 1) * seg;
                            let (sa, sb) = seg_grad_sums(&gs[r.clone()], &xh[r], wv);
                            a += sa;
                            b += sb;
                            continue;
                        }
                        let r = k * seg..(k + 1) * seg;
                        let w = w.map(|w| &w[ps.0..ps.0 + seg]);
                        (a, b) = row_grad_sums(&gs[r.clone()], &xh[r], w, (a, b));
                    }
                    (a / cnt, b / cnt)
                }),
            }
        };
        let body = |(k, o): (usize, &mut [T])| {
            let s = geo.stat_of(k);
            let (ma, mb) = sums[s];
            let ps = geo.param_of(k);
            let g = g.map(|g| &g[k * seg..][..o.len()]);
            let xh = xh.map(|xh| &xh[k * seg..][..o.len()]);
            if ps.1 {
                let w = w.map(|w| &w[ps.0..ps.0 + o.len()]);
                grad_row(o, g, xh, mode, (scale[s], w), (ma, mb));
            } else {
                let wv = std::iter::repeat(w.map_or(1.0, |w| w[ps.0]));
                grad_params(o, (g, xh), mode, (scale[s], wv), (ma, mb));
            }
        };
        if parallel(len) {
            out.par_chunks_mut(seg.max(1)).enumerate().for_each(body);
        } else {
            out.chunks_mut(seg.max(1)).enumerate().for_each(body);
        }
        Ok(())
    }
}

/// One row of a row norm (layer or RMS norm, whose affine parameters
/// advance along the row: `w`, `b` are the row's, `None` meaning 1 and 0)
/// through [`normalize_params`].
fn normalize_row<T: FloatDType>(
    x: Option<&[T]>,
    ys: &mut [T],
    xs: &mut [T],
    mr: (f64, f64),
    (w, b): (Option<&[f64]>, Option<&[f64]>),
) {
    use std::iter::repeat;
    let (w, b) = (w.map(|w| w.iter().copied()), b.map(|b| b.iter().copied()));
    match (w, b) {
        (Some(w), Some(b)) => normalize_params(x, ys, xs, mr, w.zip(b)),
        (Some(w), None) => normalize_params(x, ys, xs, mr, w.zip(repeat(0.0))),
        (None, Some(b)) => normalize_params(x, ys, xs, mr, repeat(1.0).zip(b)),
        (None, None) => normalize_params(x, ys, xs, mr, repeat((1.0, 0.0))),
    }
}

widest_vectors! {
    /// One segment of [`normalize_into`] with one statistic `(m, r)` and
    /// its parameters as `(w, b)` pairs (one pair repeated for a batch or
    /// group norm segment, the row's for a row norm): `h = (x − m)·r`,
    /// `x̂ = h` into `xs`, `y = h·w + b` into `ys` (each skipped when
    /// empty), all in f64 rounded to `T`. `x` is `None` when `ys` holds
    /// the input (in place). The general per-element values bit for bit,
    /// in the widest vector form the CPU runs.
    fn normalize_params<T: FloatDType, P: Iterator<Item = (f64, f64)>>(
        x: Option<&[T]>,
        ys: &mut [T],
        xs: &mut [T],
        mr: (f64, f64),
        params: P,
    ) => normalize_row_with
}

#[inline(always)]
fn normalize_row_with<T: FloatDType, P: Iterator<Item = (f64, f64)>>(
    x: Option<&[T]>,
    ys: &mut [T],
    xs: &mut [T],
    (m, r): (f64, f64),
    params: P,
) {
    let h = |v: T| (f(v) - m) * r;
    let y = |h: f64, (w, b): (f64, f64)| T::from_f64(h * w + b);
    match (x, ys.is_empty(), xs.is_empty()) {
        (Some(x), false, false) => {
            let outs = ys.iter_mut().zip(xs.iter_mut());
            for ((v, (yo, xo)), p) in x.iter().zip(outs).zip(params) {
                let h = h(*v);
                *xo = T::from_f64(h);
                *yo = y(h, p);
            }
        }
        (Some(x), false, true) => {
            for ((v, yo), p) in x.iter().zip(ys.iter_mut()).zip(params) {
                *yo = y(h(*v), p);
            }
        }
        (Some(x), true, false) => {
            for (v, xo) in x.iter().zip(xs.iter_mut()) {
                *xo = T::from_f64(h(*v));
            }
        }
        (None, false, false) => {
            for ((yo, xo), p) in ys.iter_mut().zip(xs.iter_mut()).zip(params) {
                let h = h(*yo);
                *xo = T::from_f64(h);
                *yo = y(h, p);
            }
        }
        (None, false, true) => {
            for (yo, p) in ys.iter_mut().zip(params) {
                *yo = y(h(*yo), p);
            }
        }
        (_, true, _) => {}
    }
}

/// Adds one row's `Σ g·w` and `Σ g·w·x̂` (`w`: the row's weights, `None`
/// meaning 1) to `(a, b)`, element by element in order: the general
/// loop's sums, bit for bit.
fn row_grad_sums<T: FloatDType>(
    g: &[T],
    xh: &[T],
    w: Option<&[f64]>,
    (mut a, mut b): (f64, f64),
) -> (f64, f64) {
    let mut add = |gv: T, x: T, w: f64| {
        let v = f(gv) * w;
        a += v;
        b += v * f(x);
    };
    match w {
        Some(w) => g
            .iter()
            .zip(xh)
            .zip(w)
            .for_each(|((gv, x), w)| add(*gv, *x, *w)),
        None => g.iter().zip(xh).for_each(|(gv, x)| add(*gv, *x, 1.0)),
    }
    (a, b)
}

/// The input gradient of one row of a row norm (the weights `w` advancing
/// along the row, `None` meaning 1) through [`grad_params`].
fn grad_row<T: FloatDType>(
    out: &mut [T],
    g: Option<&[T]>,
    xh: Option<&[T]>,
    mode: GradMode,
    (scale, w): (f64, Option<&[f64]>),
    means: (f64, f64),
) {
    match w {
        Some(w) => grad_params(out, (g, xh), mode, (scale, w.iter().copied()), means),
        None => grad_params(out, (g, xh), mode, (scale, std::iter::repeat(1.0)), means),
    }
}

widest_vectors! {
    /// The input gradient of one segment with one statistic, its weights
    /// as an iterator (one weight repeated, or the row's):
    /// `scale·(g·w − ma − x̂·mb)` (centered), `scale·(g·w − x̂·mb)`
    /// (uncentered) or `scale·g·w` (affine, or without `x̂`), in f64
    /// rounded to `T`; `g` is `None` when `out` holds it (in place). The
    /// general per-element values bit for bit, in the widest vector form
    /// the CPU runs.
    fn grad_params<T: FloatDType, W: Iterator<Item = f64>>(
        out: &mut [T],
        ins: (Option<&[T]>, Option<&[T]>),
        mode: GradMode,
        sw: (f64, W),
        means: (f64, f64),
    ) => grad_row_with
}

#[inline(always)]
fn grad_row_with<T: FloatDType, W: Iterator<Item = f64>>(
    out: &mut [T],
    (g, xh): (Option<&[T]>, Option<&[T]>),
    mode: GradMode,
    (scale, w): (f64, W),
    (ma, mb): (f64, f64),
) {
    let v = |gv: T, w: f64| f(gv) * w;
    match (mode, xh, g) {
        (GradMode::Centered, Some(xh), Some(g)) => {
            for ((d, (gv, x)), w) in out.iter_mut().zip(g.iter().zip(xh)).zip(w) {
                *d = T::from_f64(scale * (v(*gv, w) - ma - f(*x) * mb));
            }
        }
        (GradMode::Centered, Some(xh), None) => {
            for ((d, x), w) in out.iter_mut().zip(xh).zip(w) {
                *d = T::from_f64(scale * (v(*d, w) - ma - f(*x) * mb));
            }
        }
        (GradMode::Uncentered, Some(xh), Some(g)) => {
            for ((d, (gv, x)), w) in out.iter_mut().zip(g.iter().zip(xh)).zip(w) {
                *d = T::from_f64(scale * (v(*gv, w) - f(*x) * mb));
            }
        }
        (GradMode::Uncentered, Some(xh), None) => {
            for ((d, x), w) in out.iter_mut().zip(xh).zip(w) {
                *d = T::from_f64(scale * (v(*d, w) - f(*x) * mb));
            }
        }
        (_, _, Some(g)) => {
            for ((d, gv), w) in out.iter_mut().zip(g).zip(w) {
                *d = T::from_f64(scale * v(*gv, w));
            }
        }
        (_, _, None) => {
            for (d, w) in out.iter_mut().zip(w) {
                *d = T::from_f64(scale * v(*d, w));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::NormGeom;

    /// The f32 fast paths of the segment sums give the generic sums' bits,
    /// for lengths with and without a tail.
    #[test]
    fn f32_segment_sums_match_the_generic_order_bit_for_bit() {
        use super::{f, lane_sum, lane_sums};
        use crate::primitives::test_values as values;
        for (k, n) in [0usize, 1, 7, 8, 9, 23, 64, 1000, 3137]
            .into_iter()
            .enumerate()
        {
            let (g, x) = (values(n, 2 * k as u64), values(n, 2 * k as u64 + 1));
            let (w, mean) = (0.37, 0.11);
            let want = lane_sums(&g, &x, |g, x| {
                let gw = f(g) * w;
                (gw, gw * f(x))
            });
            let got = super::seg_grad_sums(&g, &x, w);
            assert_eq!(
                (got.0.to_bits(), got.1.to_bits()),
                (want.0.to_bits(), want.1.to_bits()),
                "n {n}"
            );
            assert_eq!(
                super::seg_sum(&g).to_bits(),
                lane_sum(&g, f).to_bits(),
                "n {n}"
            );
            let sq = lane_sum(&g, |v| (f(v) - mean) * (f(v) - mean));
            assert_eq!(
                super::seg_square_deviations(&g, mean).to_bits(),
                sq.to_bits(),
                "n {n}"
            );
        }
    }

    /// The segment walk agrees with the kernels' per-element rule (element
    /// `e`: statistic `(e / b) % s`, parameter `(e / lp) % p`), visits each
    /// statistic's elements in element order, and cuts segments as the CPU
    /// always has (its parameter-gradient rounding depends on it).
    #[test]
    fn segments_follow_the_shared_geometry() {
        let geos = [
            (NormGeom::batch(3, 4, 5), 5),
            (NormGeom::batch(6, 3, 1), 1),
            (NormGeom::group(2, 6, 4, 3).unwrap(), 4),
            (NormGeom::group(5, 4, 1, 1).unwrap(), 1),
            (NormGeom::row(7, 9), 9),
            (NormGeom::row(4, 1), 1),
        ];
        for (geo, seg) in geos {
            assert_eq!(geo.seg, seg, "{geo:?}");
            assert_eq!(geo.nseg() * geo.seg, geo.numel(), "{geo:?}");
            for k in 0..geo.nseg() {
                let (p0, step) = geo.param_of(k);
                for j in 0..geo.seg {
                    let e = k * geo.seg + j;
                    assert_eq!(geo.stat_of(k), e / geo.b % geo.s, "{geo:?} e={e}");
                    let p = if step { p0 + j } else { p0 };
                    assert_eq!(p, e / geo.lp % geo.p, "{geo:?} e={e}");
                }
            }
            for i in 0..geo.nstat() {
                let walked: Vec<usize> = geo
                    .segs_of(i)
                    .flat_map(|k| k * geo.seg..(k + 1) * geo.seg)
                    .collect();
                let want: Vec<usize> = (0..geo.numel())
                    .filter(|e| e / geo.b % geo.s == i)
                    .collect();
                assert_eq!(walked, want, "{geo:?} stat {i}");
                assert_eq!(walked.len(), geo.count());
            }
        }
        assert!(NormGeom::group(2, 6, 4, 4).is_err());
    }
}
