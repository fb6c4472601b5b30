//! Bilinear interpolation on CUDA: one launch of `upsample.cu`'s forward or
//! backward kernel, each reading its operand in place through the
//! geometry's view and writing a new contiguous buffer; nothing goes
//! through the host.

use super::{InterpGeom, OP};
use crate::cuda::check::{float_suffix, input};
use crate::cuda::{launch, CudaBuffer, CudaDevice};
use crate::tensor::cuda as tensor;
use crate::{Result, Tensor};

// SAFETY: InterpGeom is #[repr(C)] plain data (six i64, a View4 of five
// i64, two f64, three i64), laid out as upsample.cu's `struct InterpGeom`.
unsafe impl cudarc::driver::DeviceRepr for InterpGeom {}

/// [`super::forward`] on CUDA: `x` interpolated into a new contiguous
/// `[N, C, oh, ow]` tensor.
pub(super) fn forward(x: &Tensor, g: &InterpGeom) -> Result<Tensor> {
    let op = "cuda interpolate_bilinear";
    let xs = x.storage().cuda()?;
    let sfx = float_suffix(OP, xs.dtype())?;
    input(op, &xs, x.dtype(), &tensor::strided(x.layout())?, &xs)?;
    let n = g.output_len();
    let mut out = CudaBuffer::alloc(xs.device(), xs.dtype(), n)?;
    if n > 0 {
        let geom: InterpGeom = *g;
        launch!(xs.device(), "upsample.cu", format!("upsample_bilinear_fwd_{sfx}"),
            CudaDevice::grid_for(n); &geom, xs.slice(), out.slice_mut())?;
    }
    drop(xs);
    tensor::wrap(out, &g.output_shape())
}

/// [`super::backward`] on CUDA: the `[N, C, H, W]` input gradient from the
/// output's gradient `grad`, gathered per input element (no atomics).
pub(super) fn backward(grad: &Tensor, g: &InterpGeom) -> Result<Tensor> {
    let op = "cuda interpolate_bilinear backward";
    let gs = grad.storage().cuda()?;
    let sfx = float_suffix(OP, gs.dtype())?;
    input(op, &gs, grad.dtype(), &tensor::strided(grad.layout())?, &gs)?;
    let n = g.input_len();
    let mut dx = CudaBuffer::alloc(gs.device(), gs.dtype(), n)?;
    if n > 0 {
        let geom: InterpGeom = *g;
        launch!(gs.device(), "upsample.cu", format!("upsample_bilinear_bwd_{sfx}"),
            CudaDevice::grid_for(n); &geom, gs.slice(), dx.slice_mut())?;
    }
    drop(gs);
    tensor::wrap(dx, &g.input_shape())
}
