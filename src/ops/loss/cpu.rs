//! Cross-entropy on the CPU (and its meta form): logits viewed as
//! `[outer, classes, inner]` around the class dim (the lanes of
//! `ops::softmax`), one integer target per `(outer, inner)` sample;
//! computed in f64 with the lane maximum subtracted.

use super::{sample_weights, CrossEntropyForward, CrossEntropyOptions, SampleLosses};
use crate::dtype::CpuData;
use crate::memory::host::try_zeroed;
use crate::meta::{self, backend, not_on_cuda, Backend};
use crate::ops::softmax::{for_blocks, lane_stats, LaneGeom};
use crate::primitives::Dense;
use crate::tensor::Tensor;
use crate::{Error, FloatDType, Result, WithDType};

/// Cross-entropy forward: the I64 `targets` are read to the host (not on
/// meta, where every sample counts as a valid, non-ignored target and no
/// loss is computed).
pub(super) fn forward(
    logits: &Tensor,
    class_dim: usize,
    targets: &Tensor,
    ignore_index: i64,
    eps: f64,
    want_probs: bool,
) -> Result<CrossEntropyForward> {
    match backend("cross_entropy", &[logits, targets])? {
        Backend::Meta => {
            return Ok(CrossEntropyForward {
                stats: SampleLosses::Host {
                    losses: Vec::new(),
                    count: targets.numel(),
                },
                probs: want_probs
                    .then(|| meta::empty(logits.shape(), logits.dtype()))
                    .transpose()?,
            })
        }
        Backend::Cuda(n) => return Err(not_on_cuda("cross_entropy", n)),
        Backend::Cpu => {}
    }
    let t = targets.to_vec::<i64>()?;
    sample_losses(logits, class_dim, &t, ignore_index, eps, want_probs)
}

/// Cross-entropy backward from the saved probabilities and targets and the
/// incoming gradient `g`, read into the per-sample weights (on meta, `g` is
/// dropped before the gradient is allocated, as the CPU drops it there).
pub(super) fn backward(
    g: Tensor,
    probs: &Tensor,
    targets: &Tensor,
    class_dim: usize,
    opts: &CrossEntropyOptions,
    count: usize,
) -> Result<Tensor> {
    match backend("cross_entropy", &[&g, probs])? {
        Backend::Meta => {
            drop(g); // as on the CPU: the incoming gradient goes first
            return meta::empty(probs.shape(), probs.dtype());
        }
        Backend::Cuda(n) => return Err(not_on_cuda("cross_entropy", n)),
        Backend::Cpu => {}
    }
    let t = targets.to_vec::<i64>()?;
    let w = sample_weights(g, opts.reduction, count)?;
    logit_grad(
        probs,
        class_dim,
        &t,
        &w,
        opts.ignore_index,
        opts.label_smoothing,
    )
}

/// Checks every target that is not `ignore_index` against `classes`;
/// returns how many those are.
fn count_targets(targets: &[i64], classes: usize, ignore_index: i64) -> Result<usize> {
    let mut count = 0;
    for &t in targets {
        if t == ignore_index {
            continue;
        }
        if t < 0 || t as u64 >= classes as u64 {
            return Err(Error::IndexOutOfRange {
                op: "cross_entropy",
                index: t,
                size: classes,
            });
        }
        count += 1;
    }
    Ok(count)
}

/// Per-sample cross-entropy of `logits` (class dim `class_dim`) against
/// `targets` (one per sample, row-major), with label smoothing `eps`:
/// `lse − (1−ε)·x_t − ε/C·Σ_c x_c`, where `lse` = log Σ exp x. Gives the
/// softmax probabilities too when `want_probs`.
fn sample_losses(
    logits: &Tensor,
    class_dim: usize,
    targets: &[i64],
    ignore_index: i64,
    eps: f64,
    want_probs: bool,
) -> Result<CrossEntropyForward> {
    let geom = LaneGeom::around(logits.shape(), class_dim);
    if targets.len() != geom.lanes() {
        return Err(Error::InvalidArgument {
            op: "cross_entropy",
            msg: format!("{} targets for {} samples", targets.len(), geom.lanes()),
        });
    }
    let count = count_targets(targets, geom.classes, ignore_index)?;
    let dense = Dense::new(logits)?;
    let (data, range) = dense.parts();
    type Out = (Vec<f64>, Option<CpuData>);
    fn go<T: FloatDType>(
        s: &[T],
        t: &[i64],
        g: LaneGeom,
        ignore: i64,
        eps: f64,
        want: bool,
    ) -> Result<Out> {
        let (c, inner, block) = (g.classes, g.inner, g.block());
        let mut losses = try_zeroed::<f64>(t.len())?;
        let lane_losses = |o: usize, loss: &mut [f64]| {
            if block == 0 {
                return;
            }
            let src = &s[o * block..(o + 1) * block];
            let (m, log_sum) = lane_stats(src, g);
            for (j, l) in loss.iter_mut().enumerate() {
                let target = t[o * inner + j];
                if target == ignore {
                    continue;
                }
                let lse = m[j] + log_sum[j];
                let x_t = src[target as usize * inner + j].to_f64();
                let x_sum: f64 = if eps != 0.0 {
                    (0..c).map(|r| src[r * inner + j].to_f64()).sum()
                } else {
                    0.0
                };
                *l = lse - (1.0 - eps) * x_t - eps / c as f64 * x_sum;
            }
        };
        for_blocks(&mut losses, inner, lane_losses);
        let probs = want.then(|| -> Result<CpuData> {
            let mut p = try_zeroed::<T>(s.len())?;
            for_blocks(&mut p, block, |o, dst| {
                let src = &s[o * block..(o + 1) * block];
                let (m, log_sum) = lane_stats(src, g);
                for (i, (d, v)) in dst.iter_mut().zip(src).enumerate() {
                    let j = i % inner;
                    *d = T::from_f64((WithDType::to_f64(*v) - m[j] - log_sum[j]).exp());
                }
            });
            Ok(T::wrap(p))
        });
        Ok((losses, probs.transpose()?))
    }
    let (losses, probs) = crate::match_float_data!(data, "cross_entropy", v => {
        go(&v[range], targets, geom, ignore_index, eps, want_probs)?
    });
    drop(dense);
    let probs = probs
        .map(|p| Tensor::from_cpu_data(p, logits.shape()))
        .transpose()?;
    Ok(CrossEntropyForward {
        stats: SampleLosses::Host { losses, count },
        probs,
    })
}

/// The gradient with respect to the logits, from the saved probabilities:
/// `w·(p − ε/C − (1−ε)·[c = t])` for each sample, 0 where the target is
/// ignored. `weights` holds one weight per sample, or a single one for all.
fn logit_grad(
    probs: &Tensor,
    class_dim: usize,
    targets: &[i64],
    weights: &[f64],
    ignore_index: i64,
    eps: f64,
) -> Result<Tensor> {
    let geom = LaneGeom::around(probs.shape(), class_dim);
    if targets.len() != geom.lanes() || (weights.len() != 1 && weights.len() != targets.len()) {
        return Err(Error::InvalidArgument {
            op: "cross_entropy_backward",
            msg: "targets or weights do not match the samples".into(),
        });
    }
    let dense = Dense::new(probs)?;
    let (data, range) = dense.parts();
    fn go<T: FloatDType>(
        p: &[T],
        t: &[i64],
        w: &[f64],
        g: LaneGeom,
        ignore: i64,
        eps: f64,
    ) -> Result<CpuData> {
        let mut out = try_zeroed::<T>(p.len())?;
        let (c, inner, block) = (g.classes, g.inner, g.block());
        let smooth = eps / c as f64;
        for_blocks(&mut out, block, |o, dst| {
            let src = &p[o * block..(o + 1) * block];
            for (i, (d, pv)) in dst.iter_mut().zip(src).enumerate() {
                let (class, j) = (i / inner, i % inner);
                let sample = o * inner + j;
                let target = t[sample];
                if target == ignore {
                    continue;
                }
                let w = if w.len() == 1 { w[0] } else { w[sample] };
                let hit = if target == class as i64 {
                    1.0 - eps
                } else {
                    0.0
                };
                *d = T::from_f64(w * (WithDType::to_f64(*pv) - smooth - hit));
            }
        });
        Ok(T::wrap(out))
    }
    let out = crate::match_float_data!(data, "cross_entropy_backward", v => {
        go(&v[range], targets, weights, geom, ignore_index, eps)?
    });
    drop(dense);
    Tensor::from_cpu_data(out, probs.shape())
}
