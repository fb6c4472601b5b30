//! Tensors on CUDA: the glue between `Tensor` (storage + layout) and the
//! launch wrappers, used by the CUDA arms of the kernel entries in
//! `src/cpu/` and by tensor creation and device copies.

use super::{CudaBuffer, CudaDevice, Strided};
use crate::tensor::{CpuData, Layout, Storage, Tensor};
use crate::{DType, Result};
use std::sync::Arc;

/// The open device of ordinal `n` (opened on first use; a typed
/// `DeviceUnavailable` when it cannot be).
pub(crate) fn device(n: usize) -> Result<Arc<CudaDevice>> {
    CudaDevice::get(n)
}

/// A tensor layout as the kernels' `Strided` argument.
pub(crate) fn strided(l: &Layout) -> Result<Strided> {
    Strided::new(l.shape(), l.strides(), l.offset())
}

/// A new contiguous tensor of `shape` over a kernel's output buffer.
pub(crate) fn wrap(buffer: CudaBuffer, shape: &[usize]) -> Result<Tensor> {
    Ok(Tensor::from_storage(
        Arc::new(Storage::from_cuda(buffer)?),
        Layout::contiguous(shape),
    ))
}

/// Runs `f` on `x`'s buffer and layout and wraps the result with `shape`.
pub(crate) fn map(
    x: &Tensor,
    shape: &[usize],
    f: impl FnOnce(&CudaBuffer, &Strided) -> Result<CudaBuffer>,
) -> Result<Tensor> {
    let lx = strided(x.layout())?;
    let out = f(&*x.storage().cuda()?, &lx)?;
    wrap(out, shape)
}

/// Host data copied to a new contiguous tensor on `Cuda(n)`.
pub(crate) fn upload(data: &CpuData, shape: &[usize], n: usize) -> Result<Tensor> {
    let dev = device(n)?;
    wrap(CudaBuffer::from_cpu_data(&dev, data)?, shape)
}

/// Zeros of `shape` on `Cuda(n)`.
pub(crate) fn zeros(shape: &[usize], dtype: DType, n: usize) -> Result<Tensor> {
    let dev = device(n)?;
    wrap(
        CudaBuffer::zeros(&dev, dtype, shape.iter().product())?,
        shape,
    )
}

/// A contiguous device copy of `x` (any layout).
pub(crate) fn contiguous(x: &Tensor) -> Result<Tensor> {
    map(x, x.shape(), super::elementwise::copy_strided)
}

/// `x`'s elements in row-major order, copied to the host.
pub(crate) fn download(x: &Tensor) -> Result<CpuData> {
    if let Some(r) = x.layout().contiguous_range() {
        if r.start == 0 && r.len() == x.storage().len() {
            return x.storage().cuda()?.to_cpu_data();
        }
    }
    let dense = contiguous(x)?;
    let data = dense.storage().cuda()?.to_cpu_data();
    data
}
