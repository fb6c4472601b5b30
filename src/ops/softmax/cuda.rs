//! Softmax on CUDA: the glue from tensors to device buffers and the launch
//! wrappers of `softmax.cu` (one block per lane; math in f32, f64 for f64,
//! with the lane maximum subtracted). Inputs of any layout are made dense
//! first (a counted copy, as the CPU's gather).

use super::LaneGeom;
use crate::cuda::check::{self, float_suffix};
use crate::cuda::{launch, CudaBuffer, CudaDevice, Strided};
use crate::tensor::cuda::{dense, wrap};
use crate::{Error, Result, Tensor};

// SAFETY: LaneGeom is #[repr(C)] plain data (three usizes), laid out as
// `struct LaneGeom` of softmax.cu and loss.cu.
unsafe impl cudarc::driver::DeviceRepr for LaneGeom {}

/// Softmax (or log-softmax) of `x` along `dim`.
pub(super) fn forward(x: &Tensor, dim: usize, log: bool) -> Result<Tensor> {
    let x = dense(x)?;
    let out = softmax(&*x.storage().cuda()?, x.shape(), dim, log)?;
    wrap(out, x.shape())
}

/// The gradient of softmax from its output `y` and the incoming `g`.
pub(super) fn backward(y: &Tensor, g: &Tensor, dim: usize, log: bool) -> Result<Tensor> {
    let (y, g) = (dense(y)?, dense(g)?);
    let (dy, dg) = (y.storage().cuda()?, g.storage().cuda()?);
    wrap(softmax_backward(&dy, &dg, y.shape(), dim, log)?, y.shape())
}

/// The lanes around `dim` ([`LaneGeom::around`]), checking that `x` is a
/// contiguous buffer of `shape`. Shared with cross-entropy's launch
/// wrappers.
pub(crate) fn lanes(
    op: &'static str,
    x: &CudaBuffer,
    shape: &[usize],
    dim: usize,
) -> Result<LaneGeom> {
    check::dim(op, dim, shape.len())?;
    if x.len() != shape.iter().product::<usize>() {
        return Err(Error::ShapeMismatch {
            op,
            lhs: vec![x.len()],
            rhs: shape.to_vec(),
        });
    }
    Ok(LaneGeom::around(shape, dim))
}

/// Softmax (or log-softmax when `log`) over `dim` of the contiguous float
/// buffer `x` of `shape`.
pub(crate) fn softmax(
    x: &CudaBuffer,
    shape: &[usize],
    dim: usize,
    log: bool,
) -> Result<CudaBuffer> {
    let sfx = float_suffix("cuda softmax", x.dtype())?;
    let geom = lanes("cuda softmax", x, shape, dim)?;
    let mut y = CudaBuffer::alloc(x.device(), x.dtype(), x.len())?;
    if x.is_empty() {
        return Ok(y);
    }
    let mode = i32::from(log);
    let cfg = CudaDevice::grid_per_row(geom.lanes());
    launch!(x.device(), "softmax.cu", format!("softmax_fwd_{sfx}"), cfg;
        &mode, &geom, y.slice_mut(), x.slice())?;
    Ok(y)
}

/// The gradient of [`softmax`] from its output `y` and the incoming
/// gradient `g` (both contiguous of `shape`).
pub(crate) fn softmax_backward(
    y: &CudaBuffer,
    g: &CudaBuffer,
    shape: &[usize],
    dim: usize,
    log: bool,
) -> Result<CudaBuffer> {
    let sfx = float_suffix("cuda softmax_backward", y.dtype())?;
    let geom = lanes("cuda softmax_backward", y, shape, dim)?;
    check::input(
        "cuda softmax_backward",
        g,
        y.dtype(),
        &Strided::contiguous(shape)?,
        y,
    )?;
    let mut dx = CudaBuffer::alloc(y.device(), y.dtype(), y.len())?;
    if y.is_empty() {
        return Ok(dx);
    }
    let mode = i32::from(log);
    let cfg = CudaDevice::grid_per_row(geom.lanes());
    launch!(y.device(), "softmax.cu", format!("softmax_bwd_{sfx}"), cfg;
        &mode, &geom, dx.slice_mut(), y.slice(), g.slice())?;
    Ok(dx)
}
