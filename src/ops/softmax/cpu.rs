//! Softmax and log-softmax on the CPU (and their meta forms), forward and
//! backward, computed in f64 with the lane maximum subtracted (numerically
//! stable).
//!
//! A tensor is viewed as [`LaneGeom`]'s `[outer, classes, inner]` around the
//! softmax dim; each outer block is one independent task. The lane helpers
//! ([`for_blocks`], [`lane_stats`]) are shared with cross-entropy's CPU
//! kernels (`ops::loss`), which read logits the same way.

use super::LaneGeom;
use crate::dtype::CpuData;
use crate::memory::host::try_zeroed;
use crate::meta::{self, backend, not_on_cuda, Backend};
use crate::primitives::{Dense, PARALLEL_THRESHOLD};
use crate::tensor::Tensor;
use crate::{Error, FloatDType, Result, WithDType};
use rayon::prelude::*;
use std::ops::Range;

/// Runs `f(block index, output block)` over `out` in blocks of `block`
/// elements, in parallel when the whole is large.
pub(crate) fn for_blocks<T: Send>(
    out: &mut [T],
    block: usize,
    f: impl Fn(usize, &mut [T]) + Sync + Send,
) {
    if block == 0 {
        return;
    }
    if out.len() >= PARALLEL_THRESHOLD {
        out.par_chunks_mut(block)
            .enumerate()
            .for_each(|(o, d)| f(o, d));
    } else {
        out.chunks_mut(block).enumerate().for_each(|(o, d)| f(o, d));
    }
}

/// Per lane of one outer block `src` (`inner` lanes of `classes` elements,
/// strided by `inner`): the maximum and the log of Σ exp(x − max). NaN
/// propagates.
pub(crate) fn lane_stats<T: FloatDType>(src: &[T], g: LaneGeom) -> (Vec<f64>, Vec<f64>) {
    let (len, inner) = (g.classes, g.inner);
    let mut m = vec![f64::NEG_INFINITY; inner];
    for r in 0..len {
        for (mj, v) in m.iter_mut().zip(&src[r * inner..(r + 1) * inner]) {
            let v = WithDType::to_f64(*v);
            if v > *mj || v.is_nan() {
                *mj = v;
            }
        }
    }
    let mut sum = vec![0.0; inner];
    for r in 0..len {
        for ((sj, mj), v) in sum.iter_mut().zip(&m).zip(&src[r * inner..(r + 1) * inner]) {
            *sj += (WithDType::to_f64(*v) - mj).exp();
        }
    }
    (m, sum.into_iter().map(f64::ln).collect())
}

/// Softmax (or log-softmax when `log`) of `x` along `dim`: a new contiguous
/// tensor of `x`'s shape and dtype.
pub(super) fn forward(x: &Tensor, dim: usize, log: bool) -> Result<Tensor> {
    match backend("softmax", &[x])? {
        Backend::Meta => {
            meta::float("softmax", x.dtype())?;
            return meta::empty(x.shape(), x.dtype());
        }
        Backend::Cuda(n) => return Err(not_on_cuda("softmax", n)),
        Backend::Cpu => {}
    }
    let geom = LaneGeom::around(x.shape(), dim);
    let dense = Dense::new(x)?;
    let (data, range) = dense.parts();
    fn go<T: FloatDType>(s: &[T], g: LaneGeom, log: bool) -> Result<CpuData> {
        let mut out = try_zeroed::<T>(s.len())?;
        let block = g.block();
        for_blocks(&mut out, block, |o, dst| {
            let src = &s[o * block..(o + 1) * block];
            let (m, log_sum) = lane_stats(src, g);
            for (i, (d, v)) in dst.iter_mut().zip(src).enumerate() {
                let j = i % g.inner;
                let shifted = WithDType::to_f64(*v) - m[j] - log_sum[j];
                *d = T::from_f64(if log { shifted } else { shifted.exp() });
            }
        });
        Ok(T::wrap(out))
    }
    let out = crate::match_float_data!(data, "softmax", v => go(&v[range], geom, log)?);
    drop(dense);
    Tensor::from_cpu_data(out, x.shape())
}

/// The gradient of softmax (`log == false`) or log-softmax along `dim` from
/// the op's output `y` and the output gradient `g` (same shape and dtype):
/// `y·(g − Σ g·y)` or `g − exp(y)·Σ g`, the sums along `dim` (shapes
/// checked by the caller).
pub(super) fn backward(y: &Tensor, g: &Tensor, dim: usize, log: bool) -> Result<Tensor> {
    match backend("softmax_backward", &[y, g])? {
        Backend::Meta => return meta::empty(y.shape(), y.dtype()),
        Backend::Cuda(n) => return Err(not_on_cuda("softmax_backward", n)),
        Backend::Cpu => {}
    }
    let geom = LaneGeom::around(y.shape(), dim);
    let (dy, dg) = (Dense::new(y)?, Dense::new(g)?);
    let ((ydata, yr), (gdata, gr)) = (dy.parts(), dg.parts());
    fn go<T: FloatDType>(
        y: &[T],
        g: &CpuData,
        gr: Range<usize>,
        geom: LaneGeom,
        log: bool,
    ) -> Result<CpuData> {
        let g = &T::cpu_slice(g).ok_or(Error::DTypeMismatch {
            op: "softmax_backward",
            expected: T::DTYPE,
            got: g.dtype(),
        })?[gr];
        let mut out = try_zeroed::<T>(y.len())?;
        let (block, inner) = (geom.block(), geom.inner);
        for_blocks(&mut out, block, |o, dst| {
            let (yb, gb) = (
                &y[o * block..(o + 1) * block],
                &g[o * block..(o + 1) * block],
            );
            let mut s = vec![0.0; inner];
            for (i, (yv, gv)) in yb.iter().zip(gb).enumerate() {
                s[i % inner] += if log {
                    WithDType::to_f64(*gv)
                } else {
                    WithDType::to_f64(*gv) * WithDType::to_f64(*yv)
                };
            }
            for (i, (d, (yv, gv))) in dst.iter_mut().zip(yb.iter().zip(gb)).enumerate() {
                let (yv, gv, sj) = (WithDType::to_f64(*yv), WithDType::to_f64(*gv), s[i % inner]);
                *d = T::from_f64(if log {
                    gv - yv.exp() * sj
                } else {
                    yv * (gv - sj)
                });
            }
        });
        Ok(T::wrap(out))
    }
    let out =
        crate::match_float_data!(ydata, "softmax_backward", v => go(&v[yr], gdata, gr, geom, log)?);
    drop((dy, dg));
    Tensor::from_cpu_data(out, y.shape())
}
