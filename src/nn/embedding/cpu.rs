//! Embedding on the CPU (and its meta form): gathering weight rows by
//! index, and the deterministic (sequential) scatter-add of their gradient.

use crate::dtype::CpuData;
use crate::memory::host::{try_vec, try_zeroed};
use crate::meta::{self, backend, not_on_cuda, Backend};
use crate::primitives::Source;
use crate::tensor::{Layout, Tensor};
use crate::{FloatDType, Result};

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

/// The `[num, dim]` weight gradient: row `idx[k]` of a zero buffer gets row
/// `k` of `g` (`[idx.len(), dim]` in row-major order, any layout) added,
/// sequentially in `k` order, except where `idx[k]` is `padding`.
pub(super) fn backward(
    g: &Tensor,
    idx: &[usize],
    num: usize,
    dim: usize,
    padding: Option<usize>,
) -> Result<Tensor> {
    match backend("embedding", &[g])? {
        Backend::Meta => return meta::empty(&[num, dim], g.dtype()),
        Backend::Cuda(n) => return Err(not_on_cuda("embedding", n)),
        Backend::Cpu => {}
    }
    let data = g.storage().cpu()?;
    fn go<T: FloatDType>(
        s: &[T],
        l: &Layout,
        idx: &[usize],
        num: usize,
        dim: usize,
        padding: Option<usize>,
    ) -> Result<CpuData> {
        let src = Source::new(s, l)?;
        let mut gw = try_zeroed::<T>(crate::tensor::checked_numel("embedding", &[num, dim])?)?;
        for (k, &r) in idx.iter().enumerate() {
            if Some(r) == padding {
                continue;
            }
            let row = &mut gw[r * dim..(r + 1) * dim];
            for (c, v) in row.iter_mut().enumerate() {
                *v = *v + src.get(k * dim + c);
            }
        }
        Ok(T::wrap(gw))
    }
    let out = crate::match_float_data!(&*data, "embedding", v => go(v, g.layout(), idx, num, dim, padding)?);
    drop(data);
    Tensor::from_cpu_data(out, &[num, dim])
}
