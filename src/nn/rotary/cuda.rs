//! The rotary embedding on CUDA: one launch of `rotary.cu`'s kernel, which
//! reads the operand in place through its strides and writes a new
//! contiguous buffer; nothing goes through the host.

use super::{RotaryGeom, OP};
use crate::cuda::check::{float_suffix, input};
use crate::cuda::{launch, CudaBuffer, CudaDevice};
use crate::tensor::cuda as tensor;
use crate::{Result, Tensor};

// SAFETY: RotaryGeom is #[repr(C)] plain data (seven i64 with a View4 of
// five i64 inside, then two f64), laid out as rotary.cu's `struct
// RotaryGeom`.
unsafe impl cudarc::driver::DeviceRepr for RotaryGeom {}

/// [`super::rotate`] on CUDA: `t` rotated by `g` into a new contiguous
/// tensor of `t`'s shape.
pub(super) fn rotate(t: &Tensor, g: &RotaryGeom) -> Result<Tensor> {
    let op = "cuda rotary_embedding";
    let x = t.storage().cuda()?;
    let sfx = float_suffix(OP, x.dtype())?;
    input(op, &x, t.dtype(), &tensor::strided(t.layout())?, &x)?;
    let mut out = CudaBuffer::alloc(x.device(), x.dtype(), g.numel())?;
    if !out.is_empty() {
        let geom: RotaryGeom = *g;
        let pairs = g.len as usize * g.half();
        launch!(x.device(), "rotary.cu", format!("rotary_{sfx}"), CudaDevice::grid_for(pairs);
            &geom, x.slice(), out.slice_mut())?;
    }
    drop(x);
    tensor::wrap(out, t.shape())
}
