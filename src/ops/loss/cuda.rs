//! Cross-entropy on CUDA: the glue from tensors to device buffers and the
//! launch wrappers of `loss.cu` (one block per sample; the CPU's formulas).
//! The per-sample losses, the count and the target check come back to the
//! host, as the CPU has them there; the targets' device copy, the weights
//! and the status buffer stay out of the ledger, so both devices count the
//! same bytes.

use super::{sample_weights, CrossEntropyForward, CrossEntropyOptions};
use crate::cuda::check::{self, float_suffix};
use crate::cuda::{launch, CudaBuffer, CudaDevice, Strided};
use crate::memory::Category;
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

/// Cross-entropy forward: per-sample losses read back to the host, the
/// count of samples not ignored, and the probabilities (counted, as on the
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
        Ok((ce.losses.to_vec::<f64>()?, ce.count, ce.probs))
    })?;
    let probs = probs.map(|p| adopt(p, x.shape())).transpose()?;
    Ok(CrossEntropyForward {
        losses,
        count,
        probs,
    })
}

/// Cross-entropy backward from the saved probabilities and targets, with
/// the per-sample (or one shared) weights read from the incoming `g`.
pub(super) fn backward(
    g: Tensor,
    probs: &Tensor,
    targets: &Tensor,
    class_dim: usize,
    opts: &CrossEntropyOptions,
    count: usize,
) -> Result<Tensor> {
    let (ignore_index, eps) = (opts.ignore_index, opts.label_smoothing);
    let weights = sample_weights(g, opts.reduction, count)?;
    let p = dense(probs)?;
    let dev = p.storage().cuda()?.device().clone();
    // Host values on the CPU: the targets' copy and the weights stay out
    // of the ledger.
    let (t, w) = uncounted(|| {
        let t = targets_i64("cross_entropy", targets)?;
        Ok((t, CudaBuffer::from_slice(&dev, &weights)?))
    })?;
    let (dp, dt) = (p.storage().cuda()?, t.storage().cuda()?);
    let out = cross_entropy_backward(&dp, p.shape(), class_dim, &dt, &w, ignore_index, eps)?;
    wrap(out, p.shape())
}

/// What [`cross_entropy_forward`] computes.
#[derive(Debug)]
pub(crate) struct CrossEntropy {
    /// The loss of every sample, f64 (0 where the target is ignored).
    pub losses: CudaBuffer,
    /// How many samples are not ignored.
    pub count: usize,
    /// The softmax probabilities (logits' dtype and shape), when asked for.
    pub probs: Option<CudaBuffer>,
}

/// Reads back a status buffer and turns a recorded bad index into an error.
fn status(op: &'static str, s: &CudaBuffer, size: usize) -> Result<Vec<i64>> {
    let v = s.to_vec::<i64>()?;
    let (index, bad) = (v[v.len() - 2], v[v.len() - 1]);
    if bad != 0 {
        return Err(Error::IndexOutOfRange { op, index, size });
    }
    Ok(v)
}

/// Per-sample cross-entropy of contiguous `logits` of `shape` (classes on
/// `class_dim`) against i64 `targets` (one per sample, row-major), label
/// smoothing `eps`; as the CPU's (`cpu.rs`). Waits for the result (the count
/// and the target check come back to the host).
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
    let mut st = CudaBuffer::zeros_in(dev, DType::I64, 3, Category::Workspace)?;
    if samples > 0 {
        let null = 0u64;
        let cfg = CudaDevice::grid_per_row(samples);
        let name = format!("cross_entropy_fwd_{sfx}");
        match probs.as_mut() {
            Some(p) => launch!(dev, "loss.cu", name, cfg; &geom, &ignore_index, &eps,
                logits.slice(), targets.slice(), losses.slice_mut(), p.slice_mut(), st.slice_mut())?,
            None => launch!(dev, "loss.cu", name, cfg; &geom, &ignore_index, &eps,
                logits.slice(), targets.slice(), losses.slice_mut(), &null, st.slice_mut())?,
        }
    }
    let count = status(op, &st, geom.classes)?[0] as usize;
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
