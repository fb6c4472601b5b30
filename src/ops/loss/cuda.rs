//! Cross-entropy on CUDA: the glue from tensors to device buffers and the
//! launch wrappers of `loss.cu` (one block per sample; the CPU's formulas).
//! Nothing comes back to the host: the per-sample losses and the count stay
//! on the device (outside the ledger, as the CPU's host values), the loss
//! is reduced there in the CPU's order, the gradient's weights are made
//! there from the incoming gradient, and a target out of range is recorded
//! in the device's check record (`cuda::checks`), reported by the next read
//! from the device. The targets' device copy and the weights stay out of
//! the ledger too, so both devices count the same bytes.

use super::{CrossEntropyForward, CrossEntropyOptions, Reduction, SampleCount, SampleLosses};
use crate::cuda::check::{self, float_suffix};
use crate::cuda::{launch, CudaBuffer, CudaDevice, Strided};
use crate::ops::softmax::{lanes, LaneGeom};
use crate::tensor::cuda::{adopt, dense, uncounted, wrap};
use crate::{DType, Error, Result, Tensor};

/// The I64 targets as a dense device tensor (a typed error for other dtypes).
fn targets_i64(op: &'static str, targets: &Tensor) -> Result<Tensor> {
    if targets.dtype() != DType::I64 {
        return Err(Error::DTypeMismatch {
            op,
            expected: DType::I64,
            got: targets.dtype(),
        });
    }
    dense(targets)
}

/// Cross-entropy forward: the per-sample losses and the count on the
/// device (outside the ledger), and the probabilities (counted, as on the
/// CPU) when `want_probs`.
pub(super) fn forward(
    logits: &Tensor,
    class_dim: usize,
    targets: &Tensor,
    ignore_index: i64,
    eps: f64,
    want_probs: bool,
) -> Result<CrossEntropyForward> {
    let x = dense(logits)?;
    let (losses, count, probs) = uncounted(|| {
        let t = targets_i64("cross_entropy", targets)?;
        let (dx, dt) = (x.storage().cuda()?, t.storage().cuda()?);
        let ce = cross_entropy_forward(
            &dx,
            x.shape(),
            class_dim,
            &dt,
            ignore_index,
            eps,
            want_probs,
        )?;
        let samples = ce.losses.len();
        Ok((
            wrap(ce.losses, &[samples])?,
            wrap(ce.count, &[1])?,
            ce.probs,
        ))
    })?;
    let probs = probs.map(|p| adopt(p, x.shape())).transpose()?;
    Ok(CrossEntropyForward {
        stats: SampleLosses::Device { losses, count },
        probs,
    })
}

/// Chunks' per-sample losses (f64) one after another and the total of
/// their counts (one i64 each), on the device and outside the ledger (as
/// the chunks'), for one reduction over all of their samples.
pub(super) fn join(losses: &[Tensor], counts: &[Tensor]) -> Result<(Tensor, Tensor)> {
    uncounted(|| {
        let all = Tensor::cat(&losses.iter().collect::<Vec<_>>(), 0)?;
        let each = dense(&Tensor::cat(&counts.iter().collect::<Vec<_>>(), 0)?)?;
        let cb = each.storage().cuda()?;
        let dev = cb.device().clone();
        let mut total = CudaBuffer::alloc(&dev, DType::I64, 1)?;
        let n = cb.len() as i64;
        launch!(&dev, "loss.cu", "cross_entropy_count_total", CudaDevice::grid_for(1);
            &n, cb.slice(), total.slice_mut())?;
        Ok((all, wrap(total, &[1])?))
    })
}

/// The loss as `reduction` asks from the per-sample f64 `losses` and the
/// device's `count`, in `dtype` (one launch; a new tensor counted under the
/// current category, shaped `shape` for no reduction, a scalar otherwise).
pub(super) fn reduce(
    losses: &Tensor,
    count: &Tensor,
    reduction: Reduction,
    shape: &[usize],
    dtype: DType,
) -> Result<Tensor> {
    let op = "cuda cross_entropy";
    let sfx = float_suffix(op, dtype)?;
    let (lb, cb) = (losses.storage().cuda()?, count.storage().cuda()?);
    let dev = lb.device().clone();
    let samples = lb.len();
    let code: i32 = match reduction {
        Reduction::None => 0,
        Reduction::Sum => 1,
        Reduction::Mean => 2,
    };
    let out_shape: &[usize] = if code == 0 { shape } else { &[] };
    let mut out = CudaBuffer::alloc(&dev, dtype, out_shape.iter().product())?;
    let cfg = if code == 0 {
        CudaDevice::grid_for(samples)
    } else {
        CudaDevice::grid_for(1)
    };
    let n = samples as i64;
    launch!(&dev, "loss.cu", format!("cross_entropy_reduce_{sfx}"), cfg;
        &n, &code, lb.slice(), cb.slice(), out.slice_mut())?;
    wrap(out, out_shape)
}

/// Cross-entropy backward from the saved probabilities and targets, with
/// the per-sample (or one shared) weights made on the device from the
/// incoming `g`, which goes before the gradient is allocated (as the CPU's).
pub(super) fn backward(
    g: Tensor,
    probs: &Tensor,
    targets: &Tensor,
    class_dim: usize,
    opts: &CrossEntropyOptions,
    count: &SampleCount,
) -> Result<Tensor> {
    let (ignore_index, eps) = (opts.ignore_index, opts.label_smoothing);
    let p = dense(probs)?;
    // Host values on the CPU: the targets' copy and the weights stay out
    // of the ledger.
    let (t, w) = uncounted(|| {
        let t = targets_i64("cross_entropy", targets)?;
        Ok((t, device_weights(g, opts.reduction, count)?))
    })?;
    let (dp, dt) = (p.storage().cuda()?, t.storage().cuda()?);
    let out = cross_entropy_backward(&dp, p.shape(), class_dim, &dt, &w, ignore_index, eps)?;
    wrap(out, p.shape())
}

/// The CPU's `sample_weights` on the device: `g` as f64 weights, one per
/// sample for no reduction, one for all otherwise, divided by the count of
/// samples not ignored for the mean; `g` is dropped once they are made.
fn device_weights(g: Tensor, reduction: Reduction, count: &SampleCount) -> Result<CudaBuffer> {
    let op = "cuda cross_entropy_backward";
    let expected = match reduction {
        Reduction::None => g.numel(),
        _ => 1,
    };
    if g.numel() != expected {
        return Err(Error::InvalidArgument {
            op,
            msg: format!(
                "incoming gradient {:?} for {reduction:?} reduction",
                g.shape()
            ),
        });
    }
    let sfx = float_suffix(op, g.dtype())?;
    let gd = dense(&g)?;
    let gb = gd.storage().cuda()?;
    let dev = gb.device().clone();
    let mut w = CudaBuffer::alloc(&dev, DType::F64, expected)?;
    let mean = i32::from(reduction == Reduction::Mean);
    let (count_host, count_dev) = match count {
        SampleCount::Host(n) => (*n as i64, None),
        SampleCount::Device(t) => (0, Some(t.storage().cuda()?)),
    };
    let n = expected as i64;
    let null = 0u64;
    let name = format!("cross_entropy_weights_{sfx}");
    match &count_dev {
        Some(c) => launch!(&dev, "loss.cu", name, CudaDevice::grid_for(expected);
            &n, gb.slice(), &mean, c.slice(), &count_host, w.slice_mut())?,
        None => launch!(&dev, "loss.cu", name, CudaDevice::grid_for(expected);
            &n, gb.slice(), &mean, &null, &count_host, w.slice_mut())?,
    }
    Ok(w)
}

/// What [`cross_entropy_forward`] computes.
#[derive(Debug)]
pub(crate) struct CrossEntropy {
    /// The loss of every sample, f64 (0 where the target is ignored).
    pub losses: CudaBuffer,
    /// How many samples are not ignored: one i64.
    pub count: CudaBuffer,
    /// The softmax probabilities (logits' dtype and shape), when asked for.
    pub probs: Option<CudaBuffer>,
}

/// Per-sample cross-entropy of contiguous `logits` of `shape` (classes on
/// `class_dim`) against i64 `targets` (one per sample, row-major), label
/// smoothing `eps`; as the CPU's (`cpu.rs`). Nothing is read back: a target
/// out of range is recorded for the next read from the device to report.
pub(crate) fn cross_entropy_forward(
    logits: &CudaBuffer,
    shape: &[usize],
    class_dim: usize,
    targets: &CudaBuffer,
    ignore_index: i64,
    eps: f64,
    want_probs: bool,
) -> Result<CrossEntropy> {
    let op = "cuda cross_entropy";
    let sfx = float_suffix(op, logits.dtype())?;
    let geom: LaneGeom = lanes(op, logits, shape, class_dim)?;
    let samples = geom.lanes();
    check::input(
        op,
        targets,
        DType::I64,
        &Strided::contiguous(&[samples])?,
        logits,
    )?;
    let dev = logits.device();
    let mut losses = CudaBuffer::alloc(dev, DType::F64, samples)?;
    let mut probs = want_probs
        .then(|| CudaBuffer::alloc(dev, logits.dtype(), logits.len()))
        .transpose()?;
    let mut count = CudaBuffer::zeros(dev, DType::I64, 1)?;
    if samples > 0 {
        let null = 0u64;
        let record = dev.check_record("cross_entropy")?;
        let check: u64 = record.0;
        let check_op: i64 = record.1;
        let cfg = CudaDevice::grid_per_row(samples);
        let name = format!("cross_entropy_fwd_{sfx}");
        match probs.as_mut() {
            Some(p) => launch!(dev, "loss.cu", name, cfg; &geom, &ignore_index, &eps,
                logits.slice(), targets.slice(), losses.slice_mut(), p.slice_mut(),
                count.slice_mut(), &check, &check_op)?,
            None => launch!(dev, "loss.cu", name, cfg; &geom, &ignore_index, &eps,
                logits.slice(), targets.slice(), losses.slice_mut(), &null,
                count.slice_mut(), &check, &check_op)?,
        }
    }
    Ok(CrossEntropy {
        losses,
        count,
        probs,
    })
}

/// The gradient with respect to the logits from the saved probabilities
/// (contiguous of `shape`): `w·(p − ε/C − (1−ε)·[c = t])`, 0 where ignored.
/// `weights` is f64, one per sample or a single one for all.
pub(crate) fn cross_entropy_backward(
    probs: &CudaBuffer,
    shape: &[usize],
    class_dim: usize,
    targets: &CudaBuffer,
    weights: &CudaBuffer,
    ignore_index: i64,
    eps: f64,
) -> Result<CudaBuffer> {
    let op = "cuda cross_entropy_backward";
    let sfx = float_suffix(op, probs.dtype())?;
    let geom: LaneGeom = lanes(op, probs, shape, class_dim)?;
    let samples = geom.lanes();
    check::input(
        op,
        targets,
        DType::I64,
        &Strided::contiguous(&[samples])?,
        probs,
    )?;
    if weights.len() != 1 && weights.len() != samples {
        return Err(Error::InvalidArgument {
            op,
            msg: format!("{} weights for {samples} samples", weights.len()),
        });
    }
    check::input(
        op,
        weights,
        DType::F64,
        &Strided::contiguous(&[weights.len()])?,
        probs,
    )?;
    let mut dx = CudaBuffer::alloc(probs.device(), probs.dtype(), probs.len())?;
    if probs.is_empty() {
        return Ok(dx);
    }
    let n_weights = weights.len() as i64;
    launch!(probs.device(), "loss.cu", format!("cross_entropy_bwd_{sfx}"), CudaDevice::grid_for(probs.len());
        &geom, &ignore_index, &eps, probs.slice(), targets.slice(),
        weights.slice(), &n_weights, dx.slice_mut())?;
    Ok(dx)
}
