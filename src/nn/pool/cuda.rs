//! Pooling on CUDA: the glue from tensors to device buffers and the launch
//! wrappers of `pool.cu` over contiguous `[planes, h, w]` data (planes =
//! N·C), with the CPU kernels' semantics: max pooling saving a u8
//! in-window argmax (`ki·kw + kj`), average and adaptive average pooling.
//! Backward kernels gather, so gradients are deterministic and equal the
//! CPU's bit for bit.

use super::{AvgMode, PoolGeom, WindowPositions};
use crate::cuda::check::{expect, float_suffix};
use crate::cuda::{launch, CudaBuffer, CudaDevice};
use crate::memory::{with_category, Category};
use crate::op_code::AvgPoolCode;
use crate::tensor::cuda as tensor;
use crate::{DType, Result, Tensor};

// SAFETY: `PoolGeom` is `repr(C)` with only `usize` fields, laid out as
// `struct PoolGeo` (all `long long`) in `pool.cu` on 64-bit targets.
unsafe impl cudarc::driver::DeviceRepr for PoolGeom {}

impl PoolGeom {
    /// Elements of the input.
    fn input_len(&self) -> usize {
        self.planes * self.h * self.w
    }

    /// Elements of the output.
    fn output_len(&self) -> usize {
        self.planes * self.oh * self.ow
    }
}

/// The kernels' code for an average mode.
fn mode_code(mode: AvgMode) -> i32 {
    let code = match mode {
        AvgMode::Fixed {
            count_include_pad: false,
        } => AvgPoolCode::Fixed,
        AvgMode::Fixed {
            count_include_pad: true,
        } => AvgPoolCode::FixedCountPad,
        AvgMode::Adaptive => AvgPoolCode::Adaptive,
    };
    code.kernel_code()
}

/// Max pooling's U8 window positions as the kernel wrote them: a device
/// buffer outside the ledger (as the CPU's host vector) until it is saved.
pub(super) struct Positions(CudaBuffer);

impl Positions {
    /// As a U8 tensor of `shape`, counted now.
    pub(super) fn into_tensor(self, shape: &[usize]) -> Result<Tensor> {
        tensor::adopt(self.0, shape)
    }

    /// Read back to the host (SaveAll builds its flat indices there).
    pub(super) fn into_host(self) -> Result<Vec<u8>> {
        self.0.to_vec::<u8>()
    }
}

/// `x` as a whole-buffer dense CUDA tensor (a Workspace copy of a view).
fn dense(x: &Tensor) -> Result<Tensor> {
    let _ws = with_category(Category::Workspace);
    tensor::dense(x)
}

/// Max pooling forward of `x` (any layout): the `[planes, oh, ow]` output
/// and the positions, which stay on the device, uncounted.
pub(super) fn max_pool_forward(x: &Tensor, g: &PoolGeom) -> Result<(Tensor, WindowPositions)> {
    let x = dense(x)?;
    // The positions are uncounted like the CPU's host vector; the output
    // is counted as usual.
    let (y, pos) = tensor::uncounted(|| max_pool2d_forward(&*x.storage().cuda()?, g))?;
    let y = tensor::adopt(y, &[g.planes, g.oh, g.ow])?;
    Ok((y, WindowPositions::Device(Positions(pos))))
}

/// Max pooling backward from the saved argmax (a tensor on the gradient's
/// device): U8 window positions (lean) or I64 flat in-plane indices
/// (`SaveAll`), read on the device.
pub(super) fn max_pool_backward(grad_out: &Tensor, arg: &Tensor, g: &PoolGeom) -> Result<Tensor> {
    let (dy, arg) = (dense(grad_out)?, dense(arg)?);
    let (dy, at) = (dy.storage().cuda()?, arg.storage().cuda()?);
    let out = match arg.dtype() {
        DType::I64 => max_pool2d_backward_flat(&dy, &at, g)?,
        _ => max_pool2d_backward(&dy, &at, g)?,
    };
    tensor::wrap(out, &[g.planes, g.h, g.w])
}

/// Average pooling forward of `x` (any layout): `[planes, oh, ow]`.
pub(super) fn avg_pool_forward(x: &Tensor, g: &PoolGeom, mode: AvgMode) -> Result<Tensor> {
    let x = dense(x)?;
    let y = avg_pool2d_forward(&*x.storage().cuda()?, g, mode)?;
    tensor::wrap(y, &[g.planes, g.oh, g.ow])
}

/// Average pooling backward: the `[planes, h, w]` input gradient.
pub(super) fn avg_pool_backward(grad_out: &Tensor, g: &PoolGeom, mode: AvgMode) -> Result<Tensor> {
    let dy = dense(grad_out)?;
    let dx = avg_pool2d_backward(&*dy.storage().cuda()?, g, mode)?;
    tensor::wrap(dx, &[g.planes, g.h, g.w])
}

/// Max pooling forward of contiguous `x` (`[planes, h, w]`): the output and
/// the U8 in-window position of each output's maximum.
fn max_pool2d_forward(x: &CudaBuffer, g: &PoolGeom) -> Result<(CudaBuffer, CudaBuffer)> {
    let op = "cuda max_pool2d";
    let sfx = float_suffix(op, x.dtype())?;
    expect(op, x, x.dtype(), g.input_len(), x)?;
    let n = g.output_len();
    let mut y = CudaBuffer::alloc(x.device(), x.dtype(), n)?;
    let mut pos = CudaBuffer::alloc(x.device(), DType::U8, n)?;
    if n > 0 {
        launch!(x.device(), "pool.cu", format!("max_pool2d_fwd_{sfx}"), pool_grid(n);
            g, y.slice_mut(), pos.slice_mut(), x.slice())?;
    }
    Ok((y, pos))
}

/// Elements one thread of the max-pooling kernels takes (their
/// grid-stride loop): what a thread sets up before its first element (the
/// fast path's test, the block's dividers) is paid once per this many.
const ELEMENTS_PER_THREAD: usize = 4;

/// The launch of a max-pooling kernel over `n` elements.
fn pool_grid(n: usize) -> cudarc::driver::LaunchConfig {
    CudaDevice::grid_for(n.div_ceil(ELEMENTS_PER_THREAD))
}

/// Max pooling backward: the `[planes, h, w]` input gradient, each output's
/// gradient routed to the input its saved position `pos` names.
fn max_pool2d_backward(dy: &CudaBuffer, pos: &CudaBuffer, g: &PoolGeom) -> Result<CudaBuffer> {
    let op = "cuda max_pool2d backward";
    let sfx = float_suffix(op, dy.dtype())?;
    expect(op, dy, dy.dtype(), g.output_len(), dy)?;
    expect(op, pos, DType::U8, g.output_len(), dy)?;
    let n = g.input_len();
    let mut dx = CudaBuffer::alloc(dy.device(), dy.dtype(), n)?;
    if n > 0 {
        launch!(dy.device(), "pool.cu", format!("max_pool2d_bwd_{sfx}"), pool_grid(n);
            g, dx.slice_mut(), dy.slice(), pos.slice())?;
    }
    Ok(dx)
}

/// Max pooling backward from flat in-plane input indices (`row · w + col`,
/// what `SaveAll` keeps as I64, as PyTorch): the `[planes, h, w]` input
/// gradient, each input summing, in output order, the output gradients that
/// name it (a gather: deterministic, no atomics).
fn max_pool2d_backward_flat(dy: &CudaBuffer, idx: &CudaBuffer, g: &PoolGeom) -> Result<CudaBuffer> {
    let op = "cuda max_pool2d backward";
    let sfx = float_suffix(op, dy.dtype())?;
    expect(op, dy, dy.dtype(), g.output_len(), dy)?;
    expect(op, idx, DType::I64, g.output_len(), dy)?;
    let n = g.input_len();
    let mut dx = CudaBuffer::alloc(dy.device(), dy.dtype(), n)?;
    if n > 0 {
        // Parameters: (PoolGeo g, T* dx, const T* dy, const i64* idx).
        launch!(dy.device(), "pool.cu", format!("max_pool2d_bwd_flat_{sfx}"), pool_grid(n);
            g, dx.slice_mut(), dy.slice(), idx.slice())?;
    }
    Ok(dx)
}

/// Average (or adaptive average) pooling forward of contiguous `x`; window
/// sums in f64, divided by the mode's divisor.
fn avg_pool2d_forward(x: &CudaBuffer, g: &PoolGeom, mode: AvgMode) -> Result<CudaBuffer> {
    let op = "cuda avg_pool2d";
    let sfx = float_suffix(op, x.dtype())?;
    expect(op, x, x.dtype(), g.input_len(), x)?;
    let n = g.output_len();
    let mut y = CudaBuffer::alloc(x.device(), x.dtype(), n)?;
    if n > 0 {
        let code: i32 = mode_code(mode);
        launch!(x.device(), "pool.cu", format!("avg_pool2d_fwd_{sfx}"), CudaDevice::grid_for(n);
            g, &code, y.slice_mut(), x.slice())?;
    }
    Ok(y)
}

/// Average pooling backward: each output's gradient divided by its divisor
/// and added to every input of its window.
fn avg_pool2d_backward(dy: &CudaBuffer, g: &PoolGeom, mode: AvgMode) -> Result<CudaBuffer> {
    let op = "cuda avg_pool2d backward";
    let sfx = float_suffix(op, dy.dtype())?;
    expect(op, dy, dy.dtype(), g.output_len(), dy)?;
    let n = g.input_len();
    let mut dx = CudaBuffer::alloc(dy.device(), dy.dtype(), n)?;
    if n > 0 {
        let code: i32 = mode_code(mode);
        launch!(dy.device(), "pool.cu", format!("avg_pool2d_bwd_{sfx}"), CudaDevice::grid_for(n);
            g, &code, dx.slice_mut(), dy.slice())?;
    }
    Ok(dx)
}
