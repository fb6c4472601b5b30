//! The index ops on CUDA: `index_select`, `gather`, `scatter_add` forward
//! and the gather backward (a scatter-add into zeros). Index values stay on
//! the device; a bad one is recorded in the device's check record and
//! reported as `Error::IndexOutOfRange` by the next read from the device
//! (`cuda::checks`). An I64 copy of a U32 index is run under a private
//! ledger: the CPU reads indices on the host.

use crate::cuda::index as kernels;
use crate::cuda::{elementwise, CudaBuffer};
use crate::tensor::cuda::{adopt, contiguous, dense, strided, uncounted};
use crate::tensor::{Layout, Tensor};
use crate::{DType, Result};

/// `index` as a dense I64 device tensor (a U32 index is converted).
fn i64_index(index: &Tensor) -> Result<Tensor> {
    if index.dtype() == DType::I64 {
        return dense(index);
    }
    let li = strided(index.layout())?;
    let buf = elementwise::cast(&*index.storage().cuda()?, &li, DType::I64)?;
    crate::tensor::cuda::wrap(buf, index.shape())
}

/// `x.index_select(dim, index)` for a 1-d `index`.
pub(crate) fn index_select(x: &Tensor, dim: usize, index: &Tensor) -> Result<Tensor> {
    let mut shape = x.shape().to_vec();
    shape[dim] = index.numel();
    let lx = strided(x.layout())?;
    let out = uncounted(|| {
        let idx = i64_index(index)?;
        let di = idx.storage().cuda()?;
        kernels::index_select(&*x.storage().cuda()?, &lx, dim, &di)
    })?;
    adopt(out, &shape)
}

/// `x.gather(dim, index)`: the result has the index's shape.
pub(crate) fn gather(x: &Tensor, dim: usize, index: &Tensor) -> Result<Tensor> {
    let lx = strided(x.layout())?;
    let out = uncounted(|| {
        let idx = i64_index(index)?;
        let li = strided(idx.layout())?;
        let di = idx.storage().cuda()?;
        kernels::gather(&*x.storage().cuda()?, &lx, dim, &di, &li)
    })?;
    adopt(out, index.shape())
}

/// Adds `src` (read over the index's shape, its top-left corner) into the
/// dense device tensor `out` at the indexed positions along `dim`.
fn add_into(out: &Tensor, dim: usize, index: &Tensor, src: &Tensor) -> Result<()> {
    let lo = strided(out.layout())?;
    let corner = Layout::from_parts(
        index.shape().to_vec(),
        src.layout().strides().to_vec(),
        src.layout().offset(),
    );
    let ls = strided(&corner)?;
    uncounted(|| {
        let idx = i64_index(index)?;
        let li = strided(idx.layout())?;
        let (di, ds) = (idx.storage().cuda()?, src.storage().cuda()?);
        let mut dout = out.storage().cuda_mut()?;
        kernels::scatter_add(&mut dout, &lo, dim, &di, &li, &ds, &ls)
    })
}

/// `x.scatter_add(dim, index, src)`: a contiguous copy of `x` with `src`
/// added at the indexed positions (float dtypes on CUDA).
pub(crate) fn scatter_add(x: &Tensor, dim: usize, index: &Tensor, src: &Tensor) -> Result<Tensor> {
    let out = contiguous(x)?;
    // `src` may share `x`'s storage but never `out`'s, a fresh copy.
    add_into(&out, dim, index, src)?;
    Ok(out)
}

/// The gather backward: zeros of `input_shape` with `g` scatter-added at
/// the indexed positions. Repeated indices accumulate by atomic adds: the
/// CPU's sum is a plain sequential one, so the two agree within rounding
/// (compared with a tolerance), not bit for bit, and the order of the
/// additions may vary between runs; a deterministic form would need a
/// sort by target.
pub(crate) fn gather_backward(
    g: &Tensor,
    dim: usize,
    index: &Tensor,
    input_shape: &[usize],
) -> Result<Tensor> {
    let dev = g.storage().cuda()?.device().clone();
    let n = input_shape.iter().product();
    let zeros = CudaBuffer::zeros(&dev, g.dtype(), n)?;
    let out = crate::tensor::cuda::wrap(zeros, input_shape)?;
    add_into(&out, dim, index, g)?;
    Ok(out)
}

/// Concatenation along `dim` into a new contiguous tensor of `shape`: each
/// part (made dense first if it is a view, outside the ledger as the CPU's
/// host staging is) is copied row by row into its slot.
pub(crate) fn cat(parts: &[&Tensor], dim: usize, shape: &[usize]) -> Result<Tensor> {
    let first = parts[0].storage().cuda()?.device().clone();
    let outer: usize = shape[..dim].iter().product();
    let inner: usize = shape[dim + 1..].iter().product();
    let row = shape[dim] * inner;
    let mut out = CudaBuffer::alloc(&first, parts[0].dtype(), outer * row)?;
    let mut at = 0;
    for part in parts {
        let chunk = part.shape()[dim] * inner;
        uncounted(|| {
            let d = dense(part)?;
            let src = d.storage().cuda()?;
            (0..outer).try_for_each(|o| out.copy_range_from(o * row + at, &src, o * chunk, chunk))
        })?;
        at += chunk;
    }
    crate::tensor::cuda::wrap(out, shape)
}

/// The elements of `x`'s storage at `offsets` as a new contiguous tensor
/// of `shape` (a gather over the storage read as one flat dim; the offsets
/// are uploaded outside the ledger).
pub(crate) fn take(x: &Tensor, offsets: &[usize], shape: &[usize]) -> Result<Tensor> {
    let storage_len = x.storage().len();
    let flat = crate::cuda::Strided::contiguous(&[storage_len])?;
    let lo = crate::cuda::Strided::contiguous(&[offsets.len()])?;
    let out = uncounted(|| {
        let dx = x.storage().cuda()?;
        let at: Vec<i64> = offsets.iter().map(|&o| o as i64).collect();
        let idx = CudaBuffer::from_slice(dx.device(), &at)?;
        kernels::gather(&dx, &flat, 0, &idx, &lo)
    })?;
    adopt(out, shape)
}

/// The index_select backward: zeros of `input_shape` with `g` added at the
/// selected slices along `dim` (the 1-d index spread to `g`'s shape);
/// atomic adds, as [`gather_backward`].
pub(crate) fn index_select_backward(
    g: &Tensor,
    dim: usize,
    index: &Tensor,
    input_shape: &[usize],
) -> Result<Tensor> {
    let dev = g.storage().cuda()?.device().clone();
    let n = input_shape.iter().product();
    let out = crate::tensor::cuda::wrap(CudaBuffer::zeros(&dev, g.dtype(), n)?, input_shape)?;
    let mut strides = vec![0; g.rank()];
    strides[dim] = index.layout().strides()[0];
    let spread = Layout::from_parts(g.shape().to_vec(), strides, index.layout().offset());
    let ls = strided(&spread)?;
    let expanded = uncounted(|| {
        let buf = elementwise::copy_strided(&*index.storage().cuda()?, &ls)?;
        crate::tensor::cuda::wrap(buf, g.shape())
    })?;
    add_into(&out, dim, &expanded, g)?;
    Ok(out)
}

/// The backward of max/min along `dim` (`crate::primitives::scatter_along`):
/// zeros of `shape` with `g` (the keepdim shape) placed at `indices` along
/// `dim`. The indices stay on the device; the status buffer is uncounted.
pub(crate) fn scatter_along(
    g: &Tensor,
    indices: &Tensor,
    shape: &[usize],
    dim: usize,
) -> Result<Tensor> {
    let (lg, li) = (strided(g.layout())?, strided(indices.layout())?);
    let out = uncounted(|| {
        let (dg, di) = (g.storage().cuda()?, indices.storage().cuda()?);
        kernels::scatter_along(&dg, &lg, &di, &li, shape, dim)
    })?;
    adopt(out, shape)
}

/// scatter_add's source gradient: `g` gathered at the indexed positions
/// (the index's shape) and, when `src` is larger than the index, placed
/// into the corner of zeros of `src_shape` the index covers. As on the
/// CPU, the gathered values and the zeros are both alive at once. A gather
/// reads each value once: exact and deterministic.
pub(crate) fn scatter_add_src_grad(
    g: &Tensor,
    dim: usize,
    index: &Tensor,
    src_shape: &[usize],
) -> Result<Tensor> {
    let vals = gather(g, dim, index)?;
    if index.shape() == src_shape {
        return Ok(vals);
    }
    let dev = g.storage().cuda()?.device().clone();
    let n = src_shape.iter().product();
    let mut zeros = CudaBuffer::zeros(&dev, g.dtype(), n)?;
    let corner = Layout::from_parts(
        index.shape().to_vec(),
        Layout::contiguous(src_shape).strides().to_vec(),
        0,
    );
    kernels::place(&mut zeros, &strided(&corner)?, &*vals.storage().cuda()?)?;
    drop(vals);
    crate::tensor::cuda::wrap(zeros, src_shape)
}
