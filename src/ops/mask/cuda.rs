//! The masks on CUDA: the glue from tensors to device buffers and the
//! launch wrappers of `relu_mask.cu`. A mask is the CPU's bit for bit (bit
//! `i` of word `i/32`, one warp per word by `__ballot_sync`), so a mask made
//! on either device reads the same.

use crate::cuda::check::{self, ballot_grid, expect, float_suffix, runs_aligned, runs_grid, RUN};
use crate::cuda::{launch, CudaBuffer, CudaDevice, Strided};
use crate::primitives::mask_words;
use crate::tensor::cuda as tensor;
use crate::{DType, Result, Tensor};

/// The packed mask of `x > 0` (any layout).
pub(super) fn positive(x: &Tensor) -> Result<Tensor> {
    tensor::map(x, &[mask_words(x.numel())], positive_mask)
}

/// The packed mask of `lo <= x <= hi` (any layout).
pub(super) fn within(x: &Tensor, lo: f64, hi: f64) -> Result<Tensor> {
    tensor::map(x, &[mask_words(x.numel())], |b, l| {
        within_mask(b, l, lo, hi)
    })
}

/// `g` (any layout) where the bit of `mask` is set, else `g · slope`.
pub(super) fn scale(g: &Tensor, mask: &Tensor, slope: f64) -> Result<Tensor> {
    let mask = tensor::dense(mask)?;
    tensor::map(g, g.shape(), |b, l| {
        relu_mask_backward(b, l, &*mask.storage().cuda()?, slope)
    })
}

/// [`scale`] written over `g` (exclusive and contiguous: the caller
/// checked).
pub(super) fn scale_in_place(g: &Tensor, mask: &Tensor, slope: f64) -> Result<()> {
    let mask = tensor::dense(mask)?;
    let mb = mask.storage().cuda()?;
    let mut gb = g.storage().cuda_mut()?;
    relu_mask_backward_in_place(&mut gb, g.numel(), &mb, slope)
}

/// ReLU of `x` and the mask of its output (`x > 0`) in one launch, for
/// `relu` under the lean policy: a new output (counted first, as the
/// unfused op's), or `x` itself written over when `in_place` (the caller
/// checked nothing else holds it), then the mask.
pub(super) fn relu_with_mask(x: &Tensor, in_place: bool) -> Result<(Tensor, Tensor)> {
    let words = [mask_words(x.numel())];
    if !in_place {
        let lx = tensor::strided(x.layout())?;
        let (y, mask) = relu_mask_forward(&*x.storage().cuda()?, &lx, 0.0)?;
        return Ok((tensor::wrap(y, x.shape())?, tensor::wrap(mask, &words)?));
    }
    let n = x.numel();
    let mask = {
        let mut xb = x.storage().cuda_mut()?;
        relu_mask_forward_in_place(&mut xb, n, 0.0, None)?
    };
    Ok((x.detach(), tensor::wrap(mask, &words)?))
}

/// ReLU of `x + b` written over `x` (both whole and contiguous, `x`
/// exclusive: the caller checked) and the mask of its positives, in one
/// launch: an in-place add followed by `relu_with_mask`'s in-place ReLU,
/// the same values and the same one allocation (the mask).
pub(super) fn add_relu_with_mask(x: &Tensor, b: &Tensor) -> Result<Tensor> {
    let n = x.numel();
    let mask = {
        let mut xb = x.storage().cuda_mut()?;
        relu_mask_forward_in_place(&mut xb, n, 0.0, Some(&*b.storage().cuda()?))?
    };
    tensor::wrap(mask, &[mask_words(n)])
}

/// ReLU (`slope` 0) or LeakyReLU forward of `x` (layout `lx`): returns the
/// contiguous output (`x > 0 ? x : x·slope`, exactly 0 for ReLU) and the
/// U32 mask of `ceil(n/32)` words with bit `i` set where `x[i] > 0`.
pub(crate) fn relu_mask_forward(
    x: &CudaBuffer,
    lx: &Strided,
    slope: f64,
) -> Result<(CudaBuffer, CudaBuffer)> {
    let op = "cuda relu";
    let sfx = float_suffix(op, x.dtype())?;
    check::input(op, x, x.dtype(), lx, x)?;
    let n = lx.numel();
    let mut y = CudaBuffer::alloc(x.device(), x.dtype(), n)?;
    let mut mask = CudaBuffer::alloc(x.device(), DType::U32, mask_words(n))?;
    if n > 0 {
        let (n64, lx) = (n as i64, lx.coalesced());
        launch!(x.device(), "relu_mask.cu", format!("relu_mask_fwd_{sfx}"), ballot_grid(n);
            &slope, &n64, y.slice_mut(), mask.slice_mut(), x.slice(), &lx)?;
    }
    Ok((y, mask))
}

/// [`relu_mask_forward`] written over the first `n` elements of the
/// contiguous `x` itself, or of `x + addend` (contiguous: an in-place add
/// first, the sum rounded to the dtype, in the same launch); returns the
/// mask.
pub(crate) fn relu_mask_forward_in_place(
    x: &mut CudaBuffer,
    n: usize,
    slope: f64,
    addend: Option<&CudaBuffer>,
) -> Result<CudaBuffer> {
    let op = "cuda relu";
    let sfx = float_suffix(op, x.dtype())?;
    expect(op, x, x.dtype(), n, x)?;
    if let Some(b) = addend {
        expect(op, b, x.dtype(), n, x)?;
    }
    let mut mask = CudaBuffer::alloc(x.device(), DType::U32, mask_words(n))?;
    if n > 0 {
        let (n64, dev, vec) = (
            n as i64,
            x.device().clone(),
            i32::from(runs_aligned(&[Some(x), addend])),
        );
        // One lane per run: a warp covers RUN mask words.
        let grid = ballot_grid(n.div_ceil(RUN));
        match addend {
            None => launch!(&dev, "relu_mask.cu", format!("relu_mask_fwd_inplace_{sfx}"), grid;
                &slope, &n64, x.slice_mut(), mask.slice_mut(), &vec)?,
            Some(b) => {
                launch!(&dev, "relu_mask.cu", format!("add_relu_mask_fwd_inplace_{sfx}"), grid;
                &slope, &n64, x.slice_mut(), mask.slice_mut(), &vec, b.slice())?
            }
        }
    }
    Ok(mask)
}

/// ReLU/LeakyReLU backward from the packed mask alone: `g` where the bit
/// is set, else `g·slope` rounded in the dtype (exactly 0 when `slope` is
/// 0); `g` may have any layout, the result is contiguous.
pub(crate) fn relu_mask_backward(
    g: &CudaBuffer,
    lg: &Strided,
    mask: &CudaBuffer,
    slope: f64,
) -> Result<CudaBuffer> {
    masked_map(
        "cuda relu backward",
        "relu_mask.cu",
        "relu_mask_bwd",
        g,
        lg,
        mask,
        slope,
    )
}

/// [`relu_mask_backward`] written over the first `n` elements of the
/// contiguous `g` itself.
pub(crate) fn relu_mask_backward_in_place(
    g: &mut CudaBuffer,
    n: usize,
    mask: &CudaBuffer,
    slope: f64,
) -> Result<()> {
    let op = "cuda relu backward";
    let sfx = float_suffix(op, g.dtype())?;
    expect(op, g, g.dtype(), n, g)?;
    expect(op, mask, DType::U32, mask_words(n), g)?;
    if n > 0 {
        let (n64, dev, vec) = (
            n as i64,
            g.device().clone(),
            i32::from(runs_aligned(&[Some(g)])),
        );
        let grid = runs_grid(n);
        launch!(&dev, "relu_mask.cu", format!("relu_mask_bwd_inplace_{sfx}"), grid;
            &slope, &n64, g.slice_mut(), mask.slice(), &vec)?;
    }
    Ok(())
}

/// The packed mask of `x > 0` alone (the CPU's `positive_mask`).
pub(crate) fn positive_mask(x: &CudaBuffer, lx: &Strided) -> Result<CudaBuffer> {
    let op = "cuda positive_mask";
    let sfx = float_suffix(op, x.dtype())?;
    check::input(op, x, x.dtype(), lx, x)?;
    let n = lx.numel();
    let mut mask = CudaBuffer::alloc(x.device(), DType::U32, mask_words(n))?;
    if n > 0 {
        let (n64, lx) = (n as i64, lx.coalesced());
        launch!(x.device(), "relu_mask.cu", format!("positive_mask_{sfx}"), ballot_grid(n);
            &n64, mask.slice_mut(), x.slice(), &lx)?;
    }
    Ok(mask)
}

/// The packed mask of `lo <= x <= hi` (clamp's rule; the CPU's
/// `mask_where` with that test, compared in f64).
pub(crate) fn within_mask(x: &CudaBuffer, lx: &Strided, lo: f64, hi: f64) -> Result<CudaBuffer> {
    let op = "cuda within_mask";
    let sfx = float_suffix(op, x.dtype())?;
    check::input(op, x, x.dtype(), lx, x)?;
    let n = lx.numel();
    let mut mask = CudaBuffer::alloc(x.device(), DType::U32, mask_words(n))?;
    if n > 0 {
        let (n64, lx) = (n as i64, lx.coalesced());
        // Parameters: (f64 lo, f64 hi, i64 n, u32* mask, const T* x,
        // Strided lx).
        launch!(x.device(), "relu_mask.cu", format!("within_mask_{sfx}"), ballot_grid(n);
            &lo, &hi, &n64, mask.slice_mut(), x.slice(), &lx)?;
    }
    Ok(mask)
}

/// Runs `{kernel}_{dtype}(scalar, n, out, x, lx, mask)` of `file`: a float
/// map of `x` (any layout) steered by the packed bit `mask` of its `n`
/// elements, into a new contiguous buffer (ReLU's backward).
fn masked_map(
    op: &'static str,
    file: &'static str,
    kernel: &str,
    x: &CudaBuffer,
    lx: &Strided,
    mask: &CudaBuffer,
    scalar: f64,
) -> Result<CudaBuffer> {
    let sfx = float_suffix(op, x.dtype())?;
    check::input(op, x, x.dtype(), lx, x)?;
    let n = lx.numel();
    expect(op, mask, DType::U32, mask_words(n), x)?;
    let mut out = CudaBuffer::alloc(x.device(), x.dtype(), n)?;
    if n > 0 {
        let (n64, lx) = (n as i64, lx.coalesced());
        launch!(x.device(), file, format!("{kernel}_{sfx}"), CudaDevice::grid_for(n);
            &scalar, &n64, out.slice_mut(), x.slice(), &lx, mask.slice())?;
    }
    Ok(out)
}
