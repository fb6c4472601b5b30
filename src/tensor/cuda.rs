//! Tensors on CUDA: the glue between `Tensor` (storage + layout) and the
//! launch wrappers of the CUDA runtime, used by every op family's CUDA code
//! (`<family>/cuda.rs`) and by tensor creation and device copies.

use crate::cuda::{CudaBuffer, CudaDevice, Strided};
use crate::dtype::CpuData;
use crate::tensor::{Layout, Storage, Tensor};
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

/// `shape` filled with `value`, converted to `dtype` as on the CPU, on
/// `Cuda(n)`: one fill launch, nothing uploaded.
pub(crate) fn full(shape: &[usize], value: f64, dtype: DType, n: usize) -> Result<Tensor> {
    let dev = device(n)?;
    let mut buffer = CudaBuffer::alloc(&dev, dtype, shape.iter().product())?;
    let mut one = CpuData::zeros(dtype, 1)?;
    crate::match_cpu_data!(&mut one, v => {
        let x = crate::dtype::from_f64_like(v, value);
        crate::cuda::elementwise::fill(&mut buffer, x)?
    });
    wrap(buffer, shape)
}

/// A contiguous device copy of `x` (any layout).
pub(crate) fn contiguous(x: &Tensor) -> Result<Tensor> {
    map(x, x.shape(), crate::cuda::elementwise::copy_strided)
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

/// The device address of element 0 of the contiguous tensor `t` (for
/// kernels that take addresses inside a struct argument). `write` takes
/// the storage for writing, which bumps its version (an in-place update).
/// The address stays valid while the caller holds `t`; the one stream
/// orders the launch after every earlier use of the buffer.
pub(crate) fn address(op: &'static str, t: &Tensor, write: bool) -> Result<u64> {
    let range = t
        .layout()
        .contiguous_range()
        .ok_or_else(|| crate::Error::InvalidArgument {
            op,
            msg: format!("{:?}: a contiguous operand expected", t.shape()),
        })?;
    let offset = (range.start * t.dtype().size_in_bytes()) as u64;
    let storage = t.storage();
    let base = if write {
        storage.cuda_mut()?.address()
    } else {
        storage.cuda()?.address()
    };
    Ok(base + offset)
}

/// `x` itself when it is contiguous over its whole buffer (what the
/// row-wise kernels read), else a contiguous copy.
pub(crate) fn dense(x: &Tensor) -> Result<Tensor> {
    let whole = x.layout().offset() == 0 && x.numel() == x.storage().len();
    if whole && x.is_contiguous() {
        Ok(x.clone())
    } else {
        contiguous(x)
    }
}

pub(crate) use crate::memory::uncounted;

/// A buffer made under [`uncounted`] as a tensor counted in the current
/// ledger under the current category.
pub(crate) fn adopt(mut buffer: CudaBuffer, shape: &[usize]) -> Result<Tensor> {
    drop(buffer.take_allocation());
    wrap(buffer, shape)
}

/// Writes `src`'s elements into the view `dst` (same shape and dtype):
/// a contiguous view is one device copy, a strided one (a narrowed window,
/// a transpose) is the `place` kernel writing through `dst`'s layout.
pub(crate) fn copy_into(dst: &Tensor, src: &Tensor) -> Result<()> {
    // A private copy when the two share a buffer (read and write locks of
    // one storage cannot be held together) or `src` is a view; the CPU
    // reads a view in place, so the copy stays out of the ledger.
    let src = uncounted(|| {
        if dst.shares_storage_with(src) {
            contiguous(src)
        } else {
            dense(src)
        }
    })?;
    let from = src.storage().cuda()?;
    match dst.layout().contiguous_range() {
        Some(range) => {
            dst.storage()
                .cuda_mut()?
                .copy_range_from(range.start, &from, 0, range.len())
        }
        None => crate::cuda::index::place(
            &mut *dst.storage().cuda_mut()?,
            &strided(dst.layout())?,
            &from,
        ),
    }
}

/// `n` Philox numbers on CUDA device `ordinal` as a tensor of `shape`:
/// standard normal when `normal`, else uniform in [0, 1) — the CPU's
/// numbers (`Tensor::rand` / `Tensor::randn`).
pub(crate) fn rand(
    ordinal: usize,
    shape: &[usize],
    dtype: DType,
    seed: u64,
    n: usize,
    normal: bool,
) -> Result<Tensor> {
    let dev = device(ordinal)?;
    let buf = if normal {
        crate::cuda::random::normal(&dev, dtype, seed, 0, n)?
    } else {
        crate::cuda::random::uniform(&dev, dtype, seed, 0, n)?
    };
    wrap(buf, shape)
}
