//! Embedding kernels: gathering weight rows by index, and the deterministic
//! (sequential) scatter-add of their gradient.

use super::elementwise::Source;
use crate::dtype::CpuData;
use crate::tensor::{Layout, Tensor};
use crate::{FloatDType, Result};

/// `x` as a whole-buffer dense CUDA tensor (a Workspace copy of a view).
fn cuda_dense(x: &Tensor) -> Result<Tensor> {
    let _ws = crate::memory::with_category(crate::memory::Category::Workspace);
    crate::tensor::cuda::dense(x)
}

/// Rows `idx[k]` of the `[num, dim]` weight (any layout), stacked into a
/// contiguous `[idx.len(), dim]` buffer wrapped with shape `shape`.
pub(crate) fn embedding_gather(weight: &Tensor, idx: &[usize], shape: &[usize]) -> Result<Tensor> {
    let dim = weight.shape()[1];
    match crate::meta::backend("embedding", &[weight])? {
        crate::meta::Backend::Meta => return crate::meta::empty(shape, weight.dtype()),
        crate::meta::Backend::Cuda(_) => {
            let w = cuda_dense(weight)?;
            let num = weight.shape()[0];
            let out =
                crate::cuda::layers_misc::embedding_forward(&*w.storage().cuda()?, num, dim, idx)?;
            return crate::tensor::cuda::wrap(out, shape);
        }
        crate::meta::Backend::Cpu => {}
    }
    let data = weight.storage().cpu()?;
    fn go<T: FloatDType>(s: &[T], l: &Layout, idx: &[usize], dim: usize) -> CpuData {
        let src = Source::new(s, l);
        let mut out = Vec::with_capacity(idx.len() * dim);
        for &r in idx {
            out.extend((0..dim).map(|c| src.get(r * dim + c)));
        }
        T::wrap(out)
    }
    let out = crate::match_float_data!(&*data, "embedding", v => go(v, weight.layout(), idx, dim));
    drop(data);
    Tensor::from_cpu_data(out, shape)
}

/// The `[num, dim]` weight gradient: row `idx[k]` of a zero buffer gets row
/// `k` of `g` (`[idx.len(), dim]` in row-major order, any layout) added,
/// sequentially in `k` order, except where `idx[k]` is `padding`.
pub(crate) fn embedding_backward(
    g: &Tensor,
    idx: &[usize],
    num: usize,
    dim: usize,
    padding: Option<usize>,
) -> Result<Tensor> {
    match crate::meta::backend("embedding", &[g])? {
        crate::meta::Backend::Meta => return crate::meta::empty(&[num, dim], g.dtype()),
        crate::meta::Backend::Cuda(_) => {
            let g = cuda_dense(g)?;
            let out = crate::cuda::layers_misc::embedding_backward(
                &*g.storage().cuda()?,
                idx,
                num,
                dim,
                padding,
            )?;
            return crate::tensor::cuda::wrap(out, &[num, dim]);
        }
        crate::meta::Backend::Cpu => {}
    }
    let data = g.storage().cpu()?;
    fn go<T: FloatDType>(
        s: &[T],
        l: &Layout,
        idx: &[usize],
        num: usize,
        dim: usize,
        padding: Option<usize>,
    ) -> CpuData {
        let src = Source::new(s, l);
        let mut gw = vec![T::zero(); num * dim];
        for (k, &r) in idx.iter().enumerate() {
            if Some(r) == padding {
                continue;
            }
            let row = &mut gw[r * dim..(r + 1) * dim];
            for (c, v) in row.iter_mut().enumerate() {
                *v = *v + src.get(k * dim + c);
            }
        }
        T::wrap(gw)
    }
    let out = crate::match_float_data!(&*data, "embedding", v => go(v, g.layout(), idx, num, dim, padding));
    drop(data);
    Tensor::from_cpu_data(out, &[num, dim])
}
