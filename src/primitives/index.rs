//! Kernels for concatenation and integer indexing, written once for every
//! dtype. Indexing is expressed as lists of storage offsets: `take` reads
//! elements at offsets, `add_at` accumulates elements into offsets.

use crate::dtype::CpuData;
use crate::memory::host::{try_collect, try_vec};
use crate::tensor::{checked_numel, Layout, Tensor};
use crate::{DType, Error, Result, WithDType};
use half::{bf16, f16};
use std::ops::Add;

/// An element that can be accumulated (integers wrap instead of panicking).
trait Accumulate: WithDType {
    fn acc(self, other: Self) -> Self;
}

macro_rules! accumulate {
    ($op:ident: $($t:ty),*) => {
        $(impl Accumulate for $t {
            #[inline(always)]
            fn acc(self, other: Self) -> Self {
                self.$op(other)
            }
        })*
    };
}
accumulate!(add: f32, f64, f16, bf16);
accumulate!(wrapping_add: u8, u32, i64);

fn typed<'a, T: WithDType>(data: &'a CpuData, op: &'static str) -> Result<&'a [T]> {
    T::cpu_slice(data).ok_or(Error::DTypeMismatch {
        op,
        expected: T::DTYPE,
        got: data.dtype(),
    })
}

/// Reads a 1-d or n-d index tensor (I64 or U32) in row-major order and
/// checks every value lies in `0..size`. On the meta device nothing is read:
/// the indices are taken to be valid and the list is empty (meta kernels
/// size their outputs by shape).
pub(crate) fn read_indices(op: &'static str, index: &Tensor, size: usize) -> Result<Vec<usize>> {
    match crate::meta::backend(op, &[index])? {
        crate::meta::Backend::Meta => {
            return match index.dtype() {
                DType::I64 | DType::U32 => Ok(Vec::new()),
                got => Err(Error::DTypeMismatch {
                    op,
                    expected: DType::I64,
                    got,
                }),
            }
        }
        // Indices are read on the host (as the CPU reads them): a copy
        // that is not tensor memory.
        crate::meta::Backend::Cuda(_) => {
            let host =
                crate::tensor::cuda::uncounted(|| index.detach().to_device(crate::Device::Cpu))?;
            return read_indices(op, &host, size);
        }
        crate::meta::Backend::Cpu => {}
    }
    let raw: Vec<i64> = match index.dtype() {
        DType::I64 => index.to_vec::<i64>()?,
        DType::U32 => {
            let v = index.to_vec::<u32>()?;
            try_collect(v.len(), v.into_iter().map(i64::from))?
        }
        got => {
            return Err(Error::DTypeMismatch {
                op,
                expected: DType::I64,
                got,
            })
        }
    };
    let mut out = try_vec(raw.len())?;
    for i in raw {
        match usize::try_from(i) {
            Ok(u) if u < size => out.push(u),
            _ => return Err(Error::IndexOutOfRange { op, index: i, size }),
        }
    }
    Ok(out)
}

/// The layout's corner of shape `shape` (every dim no larger than the
/// layout's): same strides and offset.
pub(crate) fn corner(layout: &Layout, shape: &[usize]) -> Layout {
    Layout::from_parts(shape.to_vec(), layout.strides().to_vec(), layout.offset())
}

/// Storage offsets, in row-major order of the result, of
/// `index_select(dim, idx)` applied to a tensor with `layout`.
pub(crate) fn select_offsets(layout: &Layout, dim: usize, idx: &[usize]) -> Result<Vec<usize>> {
    let (shape, strides) = (layout.shape(), layout.strides());
    let outer = Layout::from_parts(
        shape[..dim].to_vec(),
        strides[..dim].to_vec(),
        layout.offset(),
    )
    .offsets()?;
    let inner =
        Layout::from_parts(shape[dim + 1..].to_vec(), strides[dim + 1..].to_vec(), 0).offsets()?;
    let stride = strides[dim];
    let n = checked_numel("index_select", &[outer.len(), idx.len(), inner.len()])?;
    let mut out = try_vec(n)?;
    for &o in &outer {
        for &j in idx {
            let base = o + j * stride;
            out.extend(inner.iter().map(|&k| base + k));
        }
    }
    Ok(out)
}

/// Storage offsets, in row-major order of `index_shape`, of
/// `gather(dim, index)` applied to a tensor with `layout`: position `p`
/// reads the element at `p` with coordinate `dim` replaced by `idx[p]`.
/// `index_shape` must not exceed the layout's shape outside `dim`.
pub(crate) fn gather_offsets(
    layout: &Layout,
    dim: usize,
    index_shape: &[usize],
    idx: &[usize],
) -> Result<Vec<usize>> {
    let mut strides = layout.strides().to_vec();
    let stride = strides[dim];
    strides[dim] = 0;
    let mut base = Layout::from_parts(index_shape.to_vec(), strides, layout.offset()).offsets()?;
    base.truncate(idx.len());
    base.iter_mut()
        .zip(idx)
        .for_each(|(b, &i)| *b += i * stride);
    Ok(base)
}

/// A new contiguous tensor of `shape` holding `x`'s elements at `offsets`.
pub(crate) fn take(x: &Tensor, offsets: &[usize], shape: &[usize]) -> Result<Tensor> {
    match crate::meta::backend("take", &[x])? {
        crate::meta::Backend::Meta => return crate::meta::empty(shape, x.dtype()),
        crate::meta::Backend::Cuda(_) => {
            return crate::primitives::cuda::index::take(x, offsets, shape)
        }
        crate::meta::Backend::Cpu => {}
    }
    let mut out = CpuData::zeros(x.dtype(), offsets.len())?;
    let data = x.storage().cpu()?;
    fn go<T: WithDType>(o: &mut [T], src: &CpuData, offsets: &[usize]) -> Result<()> {
        let s = typed::<T>(src, "take")?;
        o.iter_mut().zip(offsets).for_each(|(d, &i)| *d = s[i]);
        Ok(())
    }
    crate::match_cpu_data!(&mut out, o => go(o, &data, offsets))?;
    drop(data);
    Tensor::from_cpu_data(out, shape)
}

/// Adds `src`'s elements read at `src_offsets` into `base[dst[i]]` (repeated
/// destinations accumulate), and wraps the result as a contiguous `shape`.
pub(crate) fn add_at(
    mut base: CpuData,
    shape: &[usize],
    dst: &[usize],
    src: &Tensor,
    src_offsets: &[usize],
) -> Result<Tensor> {
    let data = src.storage().cpu()?;
    fn go<T: Accumulate>(
        o: &mut [T],
        src: &CpuData,
        dst: &[usize],
        src_offsets: &[usize],
    ) -> Result<()> {
        let s = typed::<T>(src, "scatter_add")?;
        for (&d, &i) in dst.iter().zip(src_offsets) {
            o[d] = o[d].acc(s[i]);
        }
        Ok(())
    }
    crate::match_cpu_data!(&mut base, o => go(o, &data, dst, src_offsets))?;
    drop(data);
    Tensor::from_cpu_data(base, shape)
}

/// A zero tensor of `shape` and `dtype` with `src` added at `dst` offsets
/// (read at `src`'s own element order): the backward of a gather-like read.
pub(crate) fn scatter_into_zeros(shape: &[usize], dst: &[usize], src: &Tensor) -> Result<Tensor> {
    let base = CpuData::zeros(src.dtype(), checked_numel("scatter", shape)?)?;
    add_at(base, shape, dst, src, &src.layout().offsets()?)
}

/// Concatenates `parts` along `dim` into a new contiguous tensor of `shape`.
/// The caller checks that dtypes agree and shapes agree outside `dim`.
pub(crate) fn cat(parts: &[&Tensor], dim: usize, shape: &[usize]) -> Result<Tensor> {
    let dtype = parts
        .first()
        .map(|t| t.dtype())
        .ok_or(Error::InvalidArgument {
            op: "cat",
            msg: "no tensors given".into(),
        })?;
    match crate::meta::backend("cat", parts)? {
        crate::meta::Backend::Meta => return crate::meta::empty(shape, dtype),
        crate::meta::Backend::Cuda(_) => {
            return crate::primitives::cuda::index::cat(parts, dim, shape)
        }
        crate::meta::Backend::Cpu => {}
    }
    let mut out = CpuData::zeros(dtype, checked_numel("cat", shape)?)?;
    let inner: usize = shape[dim + 1..].iter().product();
    let row = shape[dim] * inner;
    let mut col = 0;
    fn go<T: WithDType>(
        o: &mut [T],
        src: &CpuData,
        l: &Layout,
        chunk: usize,
        row: usize,
        col: usize,
    ) -> Result<()> {
        let s = typed::<T>(src, "cat")?;
        if chunk == 0 {
            return Ok(());
        }
        if let Some(r) = l.contiguous_range() {
            for (i, block) in s[r].chunks(chunk).enumerate() {
                o[i * row + col..i * row + col + chunk].copy_from_slice(block);
            }
        } else {
            let mut i = 0;
            l.for_each_offset(|off| {
                o[(i / chunk) * row + col + i % chunk] = s[off];
                i += 1;
            });
        }
        Ok(())
    }
    for p in parts {
        let chunk = p.shape()[dim] * inner;
        let data = p.storage().cpu()?;
        crate::match_cpu_data!(&mut out, o => go(o, &data, p.layout(), chunk, row, col))?;
        col += chunk;
    }
    Tensor::from_cpu_data(out, shape)
}
