//! Embedding on the CPU (and its meta form): gathering weight rows by
//! index, and the deterministic (sequential) scatter-add of their gradient.

use crate::dtype::CpuData;
use crate::memory::host::{try_vec, try_zeroed};
use crate::meta::{self, backend, not_on_cuda, Backend};
use crate::primitives::{typed, Source};
use crate::tensor::{Layout, Tensor};
use crate::{Error, FloatDType, Result};

/// Rows `idx[k]` of the `[num, dim]` weight (any layout), stacked into a
/// contiguous `[idx.len(), dim]` buffer wrapped with shape `shape`.
pub(super) fn gather(weight: &Tensor, idx: &[usize], shape: &[usize]) -> Result<Tensor> {
    let dim = weight.shape()[1];
    match backend("embedding", &[weight])? {
        Backend::Meta => return meta::empty(shape, weight.dtype()),
        Backend::Cuda(n) => return Err(not_on_cuda("embedding", n)),
        Backend::Cpu => {}
    }
    let data = weight.storage().cpu()?;
    fn go<T: FloatDType>(s: &[T], l: &Layout, idx: &[usize], dim: usize) -> Result<CpuData> {
        let src = Source::new(s, l)?;
        let n = crate::tensor::checked_numel("embedding", &[idx.len(), dim])?;
        let mut out = try_vec(n)?;
        for &r in idx {
            out.extend((0..dim).map(|c| src.get(r * dim + c)));
        }
        Ok(T::wrap(out))
    }
    let out = crate::match_float_data!(&*data, "embedding", v => go(v, weight.layout(), idx, dim)?);
    drop(data);
    Tensor::from_cpu_data(out, shape)
}

/// Adds row `k` of `g` (`[idx.len(), dim]` in row-major order, any
/// layout) to row `idx[k]` of the contiguous `[num, dim]` buffer `gw`, in
/// place, except where `idx[k]` is `padding`: each row's contributions are
/// summed in `k` order (from zero) and the sum added to the row, so a zero
/// `gw` gets the sequential sum and a pending gradient gets exactly
/// `pending + sum`.
pub(super) fn add_rows(
    gw: &Tensor,
    g: &Tensor,
    idx: &[usize],
    padding: Option<usize>,
) -> Result<()> {
    match backend("embedding", &[gw, g])? {
        Backend::Meta => {
            meta::touch(gw);
            return Ok(());
        }
        Backend::Cuda(n) => return Err(not_on_cuda("embedding", n)),
        Backend::Cpu => {}
    }
    let dim = gw.shape()[1];
    let range = gw.layout().contiguous_range().ok_or(Error::Backward(
        "embedding: the weight gradient to add into is not contiguous".into(),
    ))?;
    let order = positions_by_row(idx, padding)?;
    let data = g.storage().cpu()?;
    let mut out = gw.storage().cpu_mut()?;
    fn go<T: FloatDType>(
        gw: &mut [T],
        s: &[T],
        l: &Layout,
        idx: &[usize],
        order: &[usize],
        dim: usize,
    ) -> Result<()> {
        let src = Source::new(s, l)?;
        let mut sum = try_zeroed::<T>(dim)?;
        for group in order.chunk_by(|&a, &b| idx[a] == idx[b]) {
            sum.fill(T::from_f32(0.0));
            for &k in group {
                for (c, v) in sum.iter_mut().enumerate() {
                    *v = *v + src.get(k * dim + c);
                }
            }
            let r = idx[group[0]];
            for (w, &v) in gw[r * dim..(r + 1) * dim].iter_mut().zip(&sum) {
                *w = *w + v;
            }
        }
        Ok(())
    }
    crate::match_float_data!(&mut *out, "embedding", d => {
        let s = typed(&data, "embedding")?;
        go(&mut d[range], s, g.layout(), idx, &order, dim)?
    });
    Ok(())
}

/// The positions `k` whose row gets a gradient (not `padding`), sorted by
/// row and by `k` inside a row (the order the CUDA kernel sums in).
fn positions_by_row(idx: &[usize], padding: Option<usize>) -> Result<Vec<usize>> {
    let mut order = try_vec(idx.len())?;
    order.extend((0..idx.len()).filter(|&k| Some(idx[k]) != padding));
    // Stable: positions stay in `k` order inside a row.
    order.sort_by_key(|&k| idx[k]);
    Ok(order)
}

/// [`super::position_ids_from_input_ids`] on the CPU: `[rows, len]` ids
/// (I64 or U32, any layout) to the contiguous I64 positions.
pub(super) fn position_ids(ids: &Tensor, rows: usize, len: usize, pad: i64) -> Result<Tensor> {
    let values: Vec<i64> = match ids.dtype() {
        crate::DType::U32 => ids.to_vec::<u32>()?.into_iter().map(i64::from).collect(),
        _ => ids.to_vec::<i64>()?,
    };
    let mut out = try_vec(values.len())?;
    for row in values.chunks(len.max(1)).take(rows) {
        let mut seen = 0;
        out.extend(row.iter().map(|&id| {
            if id == pad {
                return pad;
            }
            seen += 1;
            pad + seen
        }));
    }
    Tensor::from_cpu_data(CpuData::I64(out), &[rows, len])
}
