//! Dropout on CUDA: the glue from tensors to device buffers and the launch
//! wrappers of `dropout.cu`. The keep rule is `crate::rng::dropout_keep`'s
//! (`lg_keep` in `common.cuh`), so a mask is replayed from (seed, offset)
//! bit for bit as on the CPU and every product is rounded in the dtype as
//! there. Nothing is saved by the lean path; `SaveAll` keeps the U8 mask.

use super::DropoutDraw;
use crate::cuda::check::{ballot_grid, expect, float_suffix, input, mask_words, same_shape};
use crate::cuda::{launch, CudaBuffer, CudaDevice, Strided};
use crate::tensor::cuda as tensor;
use crate::{DType, Error, Result, Tensor};
use std::sync::Arc;

/// Forward (and lean backward) of `x` (any layout): the keep rule replayed
/// from Philox on the device.
pub(super) fn apply(x: &Tensor, draw: DropoutDraw) -> Result<Tensor> {
    let (seed, offset, p, scale) = (draw.seed, draw.offset, draw.p, draw.scale());
    tensor::map(x, x.shape(), |b, l| dropout(b, l, seed, offset, p, scale))
}

/// [`apply`] written over `x` (exclusive and contiguous: the caller
/// checked).
pub(super) fn apply_in_place(x: &Tensor, draw: DropoutDraw) -> Result<()> {
    let n = x.numel();
    let mut b = x.storage().cuda_mut()?;
    dropout_in_place(&mut b, n, draw.seed, draw.offset, draw.p, draw.scale())
}

/// The U8 keep-mask of `draw` over `shape` on `Cuda(n)`.
pub(super) fn mask(shape: &[usize], draw: DropoutDraw, n: usize) -> Result<Tensor> {
    let dev = tensor::device(n)?;
    let len = shape.iter().product();
    let mask = dropout_mask(&dev, draw.seed, draw.offset, draw.p, len)?;
    tensor::wrap(mask, shape)
}

/// Backward from the saved byte mask: `mask ? g · scale : +0` in one kernel
/// (the product rounded in `g`'s dtype, as on the CPU), so the only buffer
/// it allocates is the gradient, as the CPU's.
pub(super) fn apply_mask(g: &Tensor, mask: &Tensor, scale: f64) -> Result<Tensor> {
    if mask.dtype() != DType::U8 || mask.shape() != g.shape() {
        return Err(Error::Backward(
            "dropout: the saved mask does not match the gradient".into(),
        ));
    }
    let lm = tensor::strided(mask.layout())?;
    let m = mask.storage().cuda()?;
    tensor::map(g, g.shape(), |b, l| {
        dropout_byte_masked(b, l, &m, &lm, scale)
    })
}

/// Dropout: element `i` (row-major over `lx`) of `x` times `scale` where
/// `crate::rng::dropout_keep(seed, offset, i, p)`, else 0; the product is
/// rounded in `x`'s dtype as on the CPU. Used for forward and (on the
/// incoming gradient) backward alike: the mask is never stored.
pub(crate) fn dropout(
    x: &CudaBuffer,
    lx: &Strided,
    seed: u64,
    offset: u64,
    p: f64,
    scale: f64,
) -> Result<CudaBuffer> {
    let sfx = float_suffix("cuda dropout", x.dtype())?;
    input("cuda dropout", x, x.dtype(), lx, x)?;
    let n = lx.numel();
    let mut out = CudaBuffer::alloc(x.device(), x.dtype(), n)?;
    if n > 0 {
        let n64 = n as i64;
        let lx = lx.coalesced();
        launch!(x.device(), "dropout.cu", format!("dropout_{sfx}"), CudaDevice::grid_for(n);
            &seed, &offset, &p, &scale, &n64, out.slice_mut(), x.slice(), &lx)?;
    }
    Ok(out)
}

/// [`dropout`] over the first `n` elements of the contiguous `x` itself.
pub(crate) fn dropout_in_place(
    x: &mut CudaBuffer,
    n: usize,
    seed: u64,
    offset: u64,
    p: f64,
    scale: f64,
) -> Result<()> {
    let sfx = float_suffix("cuda dropout", x.dtype())?;
    expect("cuda dropout", x, x.dtype(), n, x)?;
    if n > 0 {
        let (n64, dev) = (n as i64, x.device().clone());
        launch!(&dev, "dropout.cu", format!("dropout_inplace_{sfx}"), CudaDevice::grid_for(n);
            &seed, &offset, &p, &scale, &n64, x.slice_mut())?;
    }
    Ok(())
}

/// The keep-mask of a dropout draw over `n` elements as u8 (1 = kept):
/// what the save-everything policy stores, as the CPU does.
pub(crate) fn dropout_mask(
    device: &Arc<CudaDevice>,
    seed: u64,
    offset: u64,
    p: f64,
    n: usize,
) -> Result<CudaBuffer> {
    let mut out = CudaBuffer::alloc(device, DType::U8, n)?;
    if n > 0 {
        let n64 = n as i64;
        launch!(device, "dropout.cu", "dropout_mask", CudaDevice::grid_for(n);
            &seed, &offset, &p, &n64, out.slice_mut())?;
    }
    Ok(out)
}

/// `x·scale` where the U8 `mask` (read through `lm`, of `x`'s shape) is
/// non-zero, else `+0`: dropout's backward from the byte mask the
/// save-all policy keeps, into one new contiguous buffer.
pub(crate) fn dropout_byte_masked(
    x: &CudaBuffer,
    lx: &Strided,
    mask: &CudaBuffer,
    lm: &Strided,
    scale: f64,
) -> Result<CudaBuffer> {
    let op = "cuda dropout_byte_masked";
    let sfx = float_suffix(op, x.dtype())?;
    same_shape(op, lx, lm)?;
    input(op, x, x.dtype(), lx, x)?;
    input(op, mask, DType::U8, lm, x)?;
    let n = lx.numel();
    let mut out = CudaBuffer::alloc(x.device(), x.dtype(), n)?;
    if n > 0 {
        let (n64, lx, lm) = (n as i64, lx.coalesced(), lm.coalesced());
        launch!(x.device(), "dropout.cu", format!("dropout_byte_masked_{sfx}"), CudaDevice::grid_for(n);
            &scale, &n64, out.slice_mut(), x.slice(), &lx, mask.slice(), &lm)?;
    }
    Ok(out)
}

/// The keep mask of a dropout draw over `n` elements, packed 1 bit per
/// element (U32 words, bit set = kept). No layer stores a packed dropout
/// mask today (lean replays, `SaveAll` keeps bytes as PyTorch); kept, and
/// tested, for one that would.
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) fn dropout_bits(
    device: &Arc<CudaDevice>,
    seed: u64,
    offset: u64,
    p: f64,
    n: usize,
) -> Result<CudaBuffer> {
    let mut mask = CudaBuffer::alloc(device, DType::U32, mask_words(n))?;
    if n > 0 {
        let n64 = n as i64;
        launch!(device, "dropout.cu", "dropout_bits", ballot_grid(n);
            &seed, &offset, &p, &n64, mask.slice_mut())?;
    }
    Ok(mask)
}

/// `x·scale` where the packed `mask` bit is set, else 0 (dropout applied
/// from a stored packed mask, e.g. [`dropout_bits`]); `x` may have any
/// layout, the result is contiguous.
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) fn dropout_masked(
    x: &CudaBuffer,
    lx: &Strided,
    mask: &CudaBuffer,
    scale: f64,
) -> Result<CudaBuffer> {
    let op = "cuda dropout_masked";
    let sfx = float_suffix(op, x.dtype())?;
    input(op, x, x.dtype(), lx, x)?;
    let n = lx.numel();
    expect(op, mask, DType::U32, mask_words(n), x)?;
    let mut out = CudaBuffer::alloc(x.device(), x.dtype(), n)?;
    if n > 0 {
        let (n64, lx) = (n as i64, lx.coalesced());
        launch!(x.device(), "dropout.cu", format!("dropout_masked_{sfx}"), CudaDevice::grid_for(n);
            &scale, &n64, out.slice_mut(), x.slice(), &lx, mask.slice())?;
    }
    Ok(out)
}
