//! Embedding on CUDA: the glue from tensors to device buffers and the
//! launch wrappers of `embedding.cu`. The kernels read the index tensor on
//! the device (no copy to the host, no wait): an index out of range is
//! recorded on the device and reported by the next read, as the other
//! index kernels do. The weight gradient is deterministic and
//! bit-identical to the CPU's: positions are sorted by row on the device
//! and one block sums a row in index order.

use crate::cuda::check::{expect, float_suffix};
use crate::cuda::{launch, CudaBuffer, CudaDevice};
use crate::memory::{with_category, Category};
use crate::tensor::cuda as tensor;
use crate::{DType, Device, Error, Result, Tensor};
use cudarc::driver::LaunchConfig;

/// `x` as a whole-buffer dense CUDA tensor (a Workspace copy of a view).
fn dense(x: &Tensor) -> Result<Tensor> {
    let _ws = with_category(Category::Workspace);
    tensor::dense(x)
}

/// Rows `indices[k]` of the `[num, dim]` weight (any layout) as a
/// contiguous tensor of `shape` (`indices.numel() · dim` elements).
pub(super) fn gather(weight: &Tensor, indices: &Tensor, shape: &[usize]) -> Result<Tensor> {
    let (num, dim) = (weight.shape()[0], weight.shape()[1]);
    let w = dense(weight)?;
    let idx = device_indices("cuda embedding", indices, weight.device())?;
    let out = embedding_forward(&*w.storage().cuda()?, num, dim, &*idx.storage().cuda()?)?;
    tensor::wrap(out, shape)
}

/// The positions of an index tensor sorted by the row they add to (the
/// keys of [`embedding_sort_keys`]), outside the ledger (the CPU's host
/// values): what the backward reads once the saved indices are gone.
pub(super) struct SortedRows(CudaBuffer);

/// [`SortedRows`] of `indices`, sorted on `device`.
pub(super) fn sorted_rows(
    indices: &Tensor,
    device: Device,
    num: usize,
    padding: Option<usize>,
) -> Result<SortedRows> {
    let idx = device_indices("cuda embedding backward", indices, device)?;
    tensor::uncounted(|| embedding_sort_keys(&*idx.storage().cuda()?, num, padding)).map(SortedRows)
}

/// Adds `g` (any layout) into the contiguous `[num, dim]` weight gradient
/// `gw` in place, by the sorted positions of [`sorted_rows`].
pub(super) fn add_rows(gw: &Tensor, g: &Tensor, rows: &SortedRows) -> Result<()> {
    let g = dense(g)?;
    if !gw.is_whole_storage() {
        return Err(Error::Backward(
            "cuda embedding: the weight gradient to add into is not a whole dense buffer".into(),
        ));
    }
    let dim = gw.shape()[1];
    let mut out = gw.storage().cuda_mut()?;
    embedding_backward_add(&mut out, &*g.storage().cuda()?, &rows.0, dim)?;
    drop(out);
    crate::meta::touch(gw);
    Ok(())
}

/// [`super::position_ids_from_input_ids`] on CUDA: `[rows, len]` ids
/// (I64 or U32, any layout) to contiguous I64 positions, by one thread per
/// row on the device.
pub(super) fn position_ids(ids: &Tensor, rows: usize, len: usize, pad: i64) -> Result<Tensor> {
    let op = "cuda position_ids_from_input_ids";
    let device = ids.device();
    let idx = device_indices(op, ids, device)?;
    let idx = idx.storage().cuda()?;
    let isfx = index_suffix(op, &idx)?;
    let mut out = CudaBuffer::alloc(idx.device(), DType::I64, rows * len)?;
    if !out.is_empty() {
        let (r, l) = (rows as i64, len as i64);
        launch!(idx.device(), "embedding.cu", format!("embedding_positions_{isfx}"), CudaDevice::grid_for(rows);
            &r, &l, &pad, idx.slice(), out.slice_mut())?;
    }
    drop(idx);
    tensor::wrap(out, &[rows, len])
}

/// The I64 or U32 `indices` as a dense buffer on `device`: the
/// tensor itself when it is one already, else a copy outside the ledger
/// (the CPU reads indices where they are, so both devices count the same).
fn device_indices(op: &'static str, indices: &Tensor, device: Device) -> Result<Tensor> {
    if !matches!(indices.dtype(), DType::I64 | DType::U32) {
        return Err(Error::DTypeMismatch {
            op,
            expected: DType::I64,
            got: indices.dtype(),
        });
    }
    tensor::uncounted(|| {
        let on = indices.detach().to_device(device)?;
        tensor::dense(&on)
    })
}

/// The kernel-name suffix of an index buffer's dtype.
fn index_suffix(op: &'static str, idx: &CudaBuffer) -> Result<&'static str> {
    match idx.dtype() {
        DType::I64 => Ok("i64"),
        DType::U32 => Ok("u32"),
        got => Err(Error::DTypeMismatch {
            op,
            expected: DType::I64,
            got,
        }),
    }
}

/// Embedding lookup: rows `idx` (I64 or U32, on the device) of the
/// contiguous `[num, dim]` table `w`, as a contiguous `[idx.len(), dim]`
/// buffer. An index outside `0..num` gives a zero row and is reported as
/// [`Error::IndexOutOfRange`] by the next read from the device (the
/// device's check record): the lookup never waits for the host.
pub(crate) fn embedding_forward(
    w: &CudaBuffer,
    num: usize,
    dim: usize,
    idx: &CudaBuffer,
) -> Result<CudaBuffer> {
    let op = "cuda embedding";
    let sfx = float_suffix(op, w.dtype())?;
    let isfx = index_suffix(op, idx)?;
    expect(op, w, w.dtype(), num * dim, w)?;
    expect(op, idx, idx.dtype(), idx.len(), w)?;
    let mut out = CudaBuffer::alloc(w.device(), w.dtype(), idx.len() * dim)?;
    if out.is_empty() {
        return Ok(out);
    }
    let record = w.device().check_record("embedding")?;
    let check: u64 = record.0;
    let check_op: i64 = record.1;
    let (k, d, rows) = (idx.len() as i64, dim as i64, num as i64);
    launch!(w.device(), "embedding.cu", format!("embedding_fwd_{isfx}_{sfx}"), CudaDevice::grid_per_row(idx.len());
        &k, &d, &rows, out.slice_mut(), w.slice(), idx.slice(), &check, &check_op)?;
    Ok(out)
}

/// The positions `k` of `idx` (I64 or U32, on the device) whose row gets
/// a gradient, sorted by row and by `k` inside a row, as keys `row << 32 |
/// k` (all distinct, so any correct sort gives this order), padded to a
/// power of two with all-ones keys, which also stand for `padding` and for
/// indices out of range (the forward reported those); empty for no
/// indices. A new buffer counted under the current category.
pub(crate) fn embedding_sort_keys(
    idx: &CudaBuffer,
    num: usize,
    padding: Option<usize>,
) -> Result<CudaBuffer> {
    let op = "cuda embedding backward";
    let isfx = index_suffix(op, idx)?;
    let n = idx.len();
    // A key holds a row in 32 bits and a position in 32 bits; the all-ones
    // key marks a position without a row.
    if num >= 1 << 31 || n >= 1 << 32 {
        return Err(Error::InvalidArgument {
            op,
            msg: format!("{num} rows and {n} indices: at most 2^31 - 1 rows and 2^32 - 1 indices"),
        });
    }
    let dev = idx.device();
    if n == 0 {
        return CudaBuffer::alloc(dev, DType::I64, 0);
    }
    let n_pad = n.next_power_of_two();
    let mut keys = CudaBuffer::alloc(dev, DType::I64, n_pad)?;
    let pad: i64 = padding.map_or(-1, |p| p as i64);
    let (n64, pad64, num64) = (n as i64, n_pad as i64, num as i64);
    launch!(dev, "embedding.cu", format!("embedding_keys_{isfx}"), CudaDevice::grid_for(n_pad);
        &n64, &pad64, &num64, &pad, idx.slice(), keys.slice_mut())?;
    let one_block = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (SORT_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    launch!(dev, "embedding.cu", "embedding_sort", one_block; &pad64, keys.slice_mut())?;
    Ok(keys)
}

/// Adds `g` (contiguous, `dim` values per position) into the `[num, dim]`
/// weight gradient `gw` in place, by the sorted `keys` of
/// [`embedding_sort_keys`]: row `r` gets the sum of the rows of `g` at its
/// positions, summed in position order from zero, added to it.
/// Deterministic and bit-identical to the CPU's loop without float
/// atomics: one block sums a row.
pub(crate) fn embedding_backward_add(
    gw: &mut CudaBuffer,
    g: &CudaBuffer,
    keys: &CudaBuffer,
    dim: usize,
) -> Result<()> {
    let op = "cuda embedding backward";
    let sfx = float_suffix(op, g.dtype())?;
    expect(op, keys, DType::I64, keys.len(), g)?;
    expect(op, gw, g.dtype(), gw.len(), g)?;
    if keys.is_empty() || dim == 0 {
        return Ok(());
    }
    let (n_pad, d) = (keys.len() as i64, dim as i64);
    launch!(g.device(), "embedding.cu", format!("embedding_bwd_{sfx}"), CudaDevice::grid_per_row(keys.len());
        &n_pad, &d, gw.slice_mut(), g.slice(), keys.slice())?;
    Ok(())
}

/// Threads of the one block that sorts the backward's keys.
const SORT_THREADS: u32 = 1024;
