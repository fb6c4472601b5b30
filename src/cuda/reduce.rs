//! Launch wrappers for reductions (`reduce.cu`) and cross-entropy
//! (`loss.cu`).

use super::check::{self, float_suffix};
use super::{CudaBuffer, CudaDevice, Strided};
use crate::memory::Category;
use crate::{DType, Error, Result};

/// What a reduction computes over the reduced elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    /// Their sum.
    Sum = 0,
    /// Their mean.
    Mean = 1,
    /// Their maximum (NaN if one of them is, as on the CPU).
    Max = 2,
    /// Their minimum (NaN if one of them is, as on the CPU).
    Min = 3,
}

/// `lx` reordered so that the kept dims come first and the reduced ones
/// last, with (outputs, elements per output) and the output shape.
fn split_dims(
    op: &'static str,
    lx: &Strided,
    dims: &[usize],
) -> Result<(Strided, usize, usize, Vec<usize>)> {
    let (shape, strides) = (lx.shape(), lx.strides());
    for &d in dims {
        check::dim(op, d, shape.len())?;
    }
    let reduced = |d: &usize| dims.contains(d);
    let order: Vec<usize> = (0..shape.len())
        .filter(|d| !reduced(d))
        .chain((0..shape.len()).filter(reduced))
        .collect();
    let kept: Vec<usize> = (0..shape.len())
        .filter(|d| !reduced(d))
        .map(|d| shape[d])
        .collect();
    let inner: usize = dims
        .iter()
        .collect::<std::collections::BTreeSet<_>>()
        .iter()
        .map(|&&d| shape[d])
        .product();
    let outer: usize = kept.iter().product();
    let permuted = Strided::new(
        &order.iter().map(|&d| shape[d]).collect::<Vec<_>>(),
        &order.iter().map(|&d| strides[d]).collect::<Vec<_>>(),
        lx.offset(),
    )?;
    Ok((permuted, outer, inner, kept))
}

/// Reduces dims `dims` of the float buffer `x` (layout `lx`). The result is
/// contiguous with the kept dims' shape (reduced dims removed; a keepdim
/// result is the same buffer with 1s put back in the shape).
pub fn reduce(op: ReduceOp, x: &CudaBuffer, lx: &Strided, dims: &[usize]) -> Result<CudaBuffer> {
    let sfx = float_suffix("cuda reduce", x.dtype())?;
    check::input("cuda reduce", x, x.dtype(), lx, x)?;
    let (permuted, outer, inner, _) = split_dims("cuda reduce", lx, dims)?;
    // Same element order, fewer dims for the kernel to divide through.
    let permuted = permuted.coalesced();
    if inner == 0 && matches!(op, ReduceOp::Max | ReduceOp::Min) {
        return Err(Error::InvalidArgument {
            op: "cuda reduce",
            msg: format!("max/min over dims {dims:?} of size 0"),
        });
    }
    let mut out = CudaBuffer::alloc(x.device(), x.dtype(), outer)?;
    if outer == 0 {
        return Ok(out);
    }
    let (code, o64, i64_) = (op as i32, outer as i64, inner as i64);
    launch!(x.device(), "reduce.cu", format!("reduce_{sfx}"), CudaDevice::grid_per_row(outer);
        &code, &o64, &i64_, out.slice_mut(), x.slice(), &permuted)?;
    Ok(out)
}

/// The index along `dim` of the largest (`max`) or smallest element of
/// each lane, as i64, with `dim` removed: the first on ties, the first NaN
/// if a lane holds one (as the CPU). Every dtype (integers compare exactly).
pub fn arg_reduce(x: &CudaBuffer, lx: &Strided, dim: usize, max: bool) -> Result<CudaBuffer> {
    let sfx = check::suffix(x.dtype());
    check::input("cuda argmax", x, x.dtype(), lx, x)?;
    let (permuted, outer, inner, _) = split_dims("cuda argmax", lx, &[dim])?;
    let permuted = permuted.coalesced();
    if inner == 0 {
        return Err(Error::InvalidArgument {
            op: "cuda argmax",
            msg: format!("dim {dim} has size 0"),
        });
    }
    let mut out = CudaBuffer::alloc(x.device(), DType::I64, outer)?;
    if outer == 0 {
        return Ok(out);
    }
    let (want, o64, i64_) = (i32::from(max), outer as i64, inner as i64);
    launch!(x.device(), "reduce.cu", format!("argreduce_{sfx}"), CudaDevice::grid_per_row(outer);
        &want, &o64, &i64_, out.slice_mut(), x.slice(), &permuted)?;
    Ok(out)
}

/// `(outer, classes, inner)` around `dim`, checking that `x` is a
/// contiguous buffer of `shape`.
fn lanes(op: &'static str, x: &CudaBuffer, shape: &[usize], dim: usize) -> Result<(i64, i64, i64)> {
    check::dim(op, dim, shape.len())?;
    if x.len() != shape.iter().product::<usize>() {
        return Err(Error::ShapeMismatch {
            op,
            lhs: vec![x.len()],
            rhs: shape.to_vec(),
        });
    }
    let outer: usize = shape[..dim].iter().product();
    let inner: usize = shape[dim + 1..].iter().product();
    Ok((outer as i64, shape[dim] as i64, inner as i64))
}

/// What [`cross_entropy_forward`] computes.
#[derive(Debug)]
pub struct CrossEntropy {
    /// The loss of every sample, f64 (0 where the target is ignored).
    pub losses: CudaBuffer,
    /// How many samples are not ignored.
    pub count: usize,
    /// The softmax probabilities (logits' dtype and shape), when asked for.
    pub probs: Option<CudaBuffer>,
}

/// Reads back a status buffer and turns a recorded bad index into an error.
fn status(op: &'static str, s: &CudaBuffer, size: i64) -> Result<Vec<i64>> {
    let v = s.to_vec::<i64>()?;
    let (index, bad) = (v[v.len() - 2], v[v.len() - 1]);
    if bad != 0 {
        return Err(Error::IndexOutOfRange {
            op,
            index,
            size: size as usize,
        });
    }
    Ok(v)
}

/// Per-sample cross-entropy of contiguous `logits` of `shape` (classes on
/// `class_dim`) against i64 `targets` (one per sample, row-major), label
/// smoothing `eps`; as `src/cpu/loss.rs`. Waits for the result (the count
/// and the target check come back to the host).
pub fn cross_entropy_forward(
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
    let (outer, classes, inner) = lanes(op, logits, shape, class_dim)?;
    let samples = (outer * inner) as usize;
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
            Some(p) => {
                launch!(dev, "loss.cu", name, cfg; &outer, &classes, &inner, &ignore_index, &eps,
                logits.slice(), targets.slice(), losses.slice_mut(), p.slice_mut(), st.slice_mut())?
            }
            None => {
                launch!(dev, "loss.cu", name, cfg; &outer, &classes, &inner, &ignore_index, &eps,
                logits.slice(), targets.slice(), losses.slice_mut(), &null, st.slice_mut())?
            }
        }
    }
    let count = status(op, &st, classes)?[0] as usize;
    Ok(CrossEntropy {
        losses,
        count,
        probs,
    })
}

/// The gradient with respect to the logits from the saved probabilities
/// (contiguous of `shape`): `w·(p − ε/C − (1−ε)·[c = t])`, 0 where ignored.
/// `weights` is f64, one per sample or a single one for all.
pub fn cross_entropy_backward(
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
    let (outer, classes, inner) = lanes(op, probs, shape, class_dim)?;
    let samples = (outer * inner) as usize;
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
        &outer, &classes, &inner, &ignore_index, &eps, probs.slice(), targets.slice(),
        weights.slice(), &n_weights, dx.slice_mut())?;
    Ok(dx)
}
