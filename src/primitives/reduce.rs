//! Reductions to a shape that the input broadcasts from (keepdim form), and
//! arg-extrema along one dim with the scatter that is their backward.
//!
//! Sums accumulate in f64. A contiguous input whose reduced dims form one
//! block (all dims, a suffix, a prefix, or one middle block) takes a fast
//! path split across rayon's threads in fixed-size chunks, so results do
//! not depend on the thread count; other layouts use the general walk.

use super::{gather, parallel, PARALLEL_THRESHOLD};
use crate::dtype::CpuData;
use crate::memory::host::{try_collect, try_filled, try_par_collect, try_vec};
use crate::meta::{backend, backend_of, Backend};
use crate::tensor::{checked_numel, Layout, Tensor};
use crate::{DType, Device, Error, FloatDType, Result, WithDType};
use rayon::prelude::*;

/// Elements per partial sum on the parallel paths.
const CHUNK: usize = 1 << 13;

/// How elements are combined.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceKind {
    /// Sum (accumulated in f64).
    Sum,
    /// Maximum (NaN propagates).
    Max,
    /// Minimum (NaN propagates).
    Min,
}

fn check_out_shape(x: &Tensor, out_shape: &[usize]) -> Result<()> {
    if out_shape.len() != x.rank()
        || out_shape
            .iter()
            .zip(x.shape())
            .any(|(&o, &i)| o != i && o != 1)
    {
        return Err(Error::ShapeMismatch {
            op: "reduce",
            lhs: x.shape().to_vec(),
            rhs: out_shape.to_vec(),
        });
    }
    Ok(())
}

/// Reduces `x` to `out_shape` (same rank, each dim equal to x's or 1):
/// every input element is combined into the output element it broadcasts from.
pub fn reduce_to(x: &Tensor, out_shape: &[usize], kind: ReduceKind) -> Result<Tensor> {
    match kind {
        ReduceKind::Sum => sum_scaled(x, out_shape, 1.0),
        _ => {
            check_out_shape(x, out_shape)?;
            match backend("reduce", &[x])? {
                Backend::Meta => {
                    crate::meta::float("reduce", x.dtype())?;
                    return crate::meta::empty(out_shape, x.dtype());
                }
                Backend::Cuda(_) => {
                    return crate::primitives::cuda::ops::extremum_to(
                        x,
                        out_shape,
                        kind == ReduceKind::Max,
                    )
                }
                Backend::Cpu => {}
            }
            general(x, out_shape, kind, 1.0)
        }
    }
}

/// `scale ·` the sum of `x` reduced to `out_shape` (see [`reduce_to`]); the
/// scale is applied in f64 before rounding to the dtype (mean uses 1/count).
pub(crate) fn sum_scaled(x: &Tensor, out_shape: &[usize], scale: f64) -> Result<Tensor> {
    check_out_shape(x, out_shape)?;
    match backend("sum", &[x])? {
        Backend::Meta => {
            crate::meta::float("sum", x.dtype())?;
            return crate::meta::empty(out_shape, x.dtype());
        }
        Backend::Cuda(_) => return crate::primitives::cuda::ops::sum_scaled(x, out_shape, scale),
        Backend::Cpu => {}
    }
    if let (Some(range), Some((outer, red, inner))) =
        (x.layout().contiguous_range(), blocks(x.shape(), out_shape))
    {
        let data = x.storage().cpu()?;
        let out = crate::match_float_data!(&*data, "sum", v => sum_blocks(&v[range], outer, red, inner, scale)?);
        drop(data);
        return Tensor::from_cpu_data(out, out_shape);
    }
    general(x, out_shape, ReduceKind::Sum, scale)
}

/// `(outer, reduced, inner)` element counts when the reduced dims form one
/// block of a row-major shape; `None` when they are split by kept dims.
fn blocks(shape: &[usize], out_shape: &[usize]) -> Option<(usize, usize, usize)> {
    let (mut sizes, mut state) = ([1usize; 3], 0);
    for (&d, &o) in shape.iter().zip(out_shape) {
        if d == 1 {
            continue;
        }
        state = match (state, o == 1) {
            (0, false) => 0,
            (0 | 1, true) => 1,
            (_, false) => 2,
            (_, true) => return None,
        };
        sizes[state] *= d;
    }
    Some((sizes[0], sizes[1], sizes[2]))
}

/// The f64 sum of a slice, in fixed chunks when long.
fn sum_f64<T: FloatDType>(s: &[T]) -> f64 {
    if s.len() < PARALLEL_THRESHOLD {
        return s.iter().map(|&v| WithDType::to_f64(v)).sum();
    }
    let chunk_sum = |c: &[T]| -> f64 { c.iter().map(|&v| WithDType::to_f64(v)).sum() };
    // The same chunks whether or not they run in parallel: one value.
    let partial: Vec<f64> = if parallel(s.len()) {
        s.par_chunks(CHUNK).map(chunk_sum).collect()
    } else {
        s.chunks(CHUNK).map(chunk_sum).collect()
    };
    partial.iter().sum()
}

/// Adds rows `rows` of a `[red, inner]` block to `acc` (length `inner`).
fn add_rows<T: FloatDType>(
    block: &[T],
    inner: usize,
    rows: std::ops::Range<usize>,
    acc: &mut [f64],
) {
    for r in rows {
        for (a, v) in acc.iter_mut().zip(&block[r * inner..(r + 1) * inner]) {
            *a += WithDType::to_f64(*v);
        }
    }
}

/// Column sums of one `[red, inner]` block.
fn column_sums<T: FloatDType>(block: &[T], red: usize, inner: usize) -> Vec<f64> {
    let mut acc = vec![0.0; inner];
    if block.len() < PARALLEL_THRESHOLD {
        add_rows(block, inner, 0..red, &mut acc);
        return acc;
    }
    let rows_per = (CHUNK / inner).max(1);
    let part = |c: usize| {
        let mut p = vec![0.0; inner];
        add_rows(
            block,
            inner,
            c * rows_per..((c + 1) * rows_per).min(red),
            &mut p,
        );
        p
    };
    // The same row blocks whether or not they run in parallel: one value.
    let parts = red.div_ceil(rows_per);
    let partial: Vec<Vec<f64>> = if parallel(block.len()) {
        (0..parts).into_par_iter().map(part).collect()
    } else {
        (0..parts).map(part).collect()
    };
    for p in partial {
        acc.iter_mut().zip(p).for_each(|(a, v)| *a += v);
    }
    acc
}

/// Sums a contiguous `[outer, red, inner]` array over its middle dim.
fn sum_blocks<T: FloatDType>(
    s: &[T],
    outer: usize,
    red: usize,
    inner: usize,
    scale: f64,
) -> Result<CpuData> {
    let big = parallel(s.len());
    let out: Vec<T> = if inner == 1 {
        let row = |o: usize| T::from_f64(sum_f64(&s[o * red..(o + 1) * red]) * scale);
        if big && outer > 1 {
            try_par_collect(outer, (0..outer).into_par_iter().map(row))?
        } else {
            try_collect(outer, (0..outer).map(row))?
        }
    } else {
        let block = |o: usize| -> Vec<T> {
            let sums = column_sums(&s[o * red * inner..(o + 1) * red * inner], red, inner);
            sums.into_iter().map(|v| T::from_f64(v * scale)).collect()
        };
        let mut out = try_vec(outer * inner)?;
        if big && outer > 1 {
            out.par_extend((0..outer).into_par_iter().flat_map_iter(block));
        } else {
            out.extend((0..outer).flat_map(block));
        }
        out
    };
    Ok(T::wrap(out))
}

/// The layout walk for any input layout.
fn general(x: &Tensor, out_shape: &[usize], kind: ReduceKind, scale: f64) -> Result<Tensor> {
    let out_layout = Layout::contiguous(out_shape).broadcast_to(x.shape())?;
    let data = x.storage().cpu()?;
    fn go<T: FloatDType>(
        s: &[T],
        xl: &Layout,
        ol: &Layout,
        n_out: usize,
        kind: ReduceKind,
        scale: f64,
    ) -> Result<CpuData> {
        let init = match kind {
            ReduceKind::Sum => 0.0,
            ReduceKind::Max => f64::NEG_INFINITY,
            ReduceKind::Min => f64::INFINITY,
        };
        let mut acc = try_filled(n_out, init)?;
        let out_offsets = ol.offsets()?;
        let mut i = 0;
        xl.for_each_offset(|o| {
            let v = s[o].to_f64();
            let a = &mut acc[out_offsets[i]];
            *a = match kind {
                ReduceKind::Sum => *a + v,
                ReduceKind::Max if v.is_nan() || v > *a => v,
                ReduceKind::Min if v.is_nan() || v < *a => v,
                _ => *a,
            };
            i += 1;
        });
        Ok(T::wrap(try_collect(
            n_out,
            acc.into_iter().map(|v| T::from_f64(v * scale)),
        )?))
    }
    let n_out = out_shape.iter().product();
    let out = crate::match_float_data!(&*data, "reduce", v => go(v, x.layout(), &out_layout, n_out, kind, scale)?);
    drop(data);
    Tensor::from_cpu_data(out, out_shape)
}

/// Index of the first maximum (or minimum) of `len` elements from `base`
/// with `stride`; a NaN counts as the extremum (the first one wins).
fn scan<T: WithDType>(s: &[T], base: usize, stride: usize, len: usize, max: bool) -> usize {
    let mut best = s[base];
    let is_nan = |v: T| v.partial_cmp(&v).is_none();
    if is_nan(best) {
        return 0;
    }
    let mut at = 0;
    for i in 1..len {
        let v = s[base + i * stride];
        if is_nan(v) {
            return i;
        }
        if (max && v > best) || (!max && v < best) {
            best = v;
            at = i;
        }
    }
    at
}

/// The index along `dim` of the first maximum (`max`) or minimum of every
/// lane of `x` (any dtype and layout), in row-major order of the keepdim
/// output shape, and the extreme values themselves when `values` is set
/// (contiguous, keepdim shape).
pub(crate) fn arg_extremum(
    x: &Tensor,
    dim: usize,
    max: bool,
    values: bool,
) -> Result<(Vec<usize>, Option<Tensor>)> {
    let len = x.shape()[dim];
    if len == 0 {
        return Err(Error::InvalidArgument {
            op: if max { "max" } else { "min" },
            msg: format!("dim {dim} has size 0"),
        });
    }
    let lanes = x.layout().narrow(dim, 0, 1)?;
    match backend(if max { "max" } else { "min" }, &[x])? {
        // No indices on meta: callers size index tensors by shape.
        Backend::Meta => {
            let vals = values
                .then(|| crate::meta::empty(lanes.shape(), x.dtype()))
                .transpose()?;
            return Ok((Vec::new(), vals));
        }
        Backend::Cuda(_) => {
            return crate::primitives::cuda::ops::arg_extremum(x, dim, max, values, lanes.shape())
        }
        Backend::Cpu => {}
    }
    let stride = x.layout().strides()[dim];
    let bases = lanes.offsets()?;
    let data = x.storage().cpu()?;
    fn go<T: WithDType>(
        s: &[T],
        bases: &[usize],
        stride: usize,
        len: usize,
        max: bool,
        values: bool,
    ) -> Result<(Vec<usize>, Option<CpuData>)> {
        let n = bases.len();
        let idx: Vec<usize> = if parallel(n * len) {
            try_par_collect(n, bases.par_iter().map(|&b| scan(s, b, stride, len, max)))?
        } else {
            try_collect(n, bases.iter().map(|&b| scan(s, b, stride, len, max)))?
        };
        let vals = values
            .then(|| -> Result<CpuData> {
                let v = bases.iter().zip(&idx).map(|(&b, &i)| s[b + i * stride]);
                Ok(T::wrap(try_collect(n, v)?))
            })
            .transpose()?;
        Ok((idx, vals))
    }
    let (idx, vals) = crate::match_cpu_data!(&*data, v => go(v, &bases, stride, len, max, values)?);
    drop(data);
    let vals = vals
        .map(|v| Tensor::from_cpu_data(v, lanes.shape()))
        .transpose()?;
    Ok((idx, vals))
}

/// Indices below `axis_len` as a tensor of `shape` in the smallest dtype
/// that holds them exactly: U8 for axes of up to 256 elements, U32 up to
/// 2³², I64 beyond.
pub(crate) fn compact_indices(
    idx: &[usize],
    axis_len: usize,
    shape: &[usize],
    device: Device,
) -> Result<Tensor> {
    let dtype = if axis_len <= 1 << 8 {
        DType::U8
    } else if axis_len as u64 <= 1 << 32 {
        DType::U32
    } else {
        DType::I64
    };
    match backend_of("indices", device)? {
        Backend::Meta => return crate::meta::empty(shape, dtype),
        Backend::Cuda(_) | Backend::Cpu => {}
    }
    let n = idx.len();
    let data = if axis_len <= 1 << 8 {
        CpuData::U8(try_collect(n, idx.iter().map(|&i| i as u8))?)
    } else if axis_len as u64 <= 1 << 32 {
        CpuData::U32(try_collect(n, idx.iter().map(|&i| i as u32))?)
    } else {
        CpuData::I64(try_collect(n, idx.iter().map(|&i| i as i64))?)
    };
    Tensor::from_data_on(data, shape, device)
}

/// Indices as a contiguous I64 tensor of `shape`.
pub(crate) fn i64_indices(idx: &[usize], shape: &[usize], device: Device) -> Result<Tensor> {
    match backend_of("indices", device)? {
        Backend::Meta => return crate::meta::empty(shape, DType::I64),
        Backend::Cuda(_) | Backend::Cpu => {}
    }
    let data = CpuData::I64(try_collect(idx.len(), idx.iter().map(|&i| i as i64))?);
    Tensor::from_data_on(data, shape, device)
}

/// A zero tensor of `shape` holding, for each element `p` of `g` (the
/// keepdim shape: `shape` with `dim` of size 1), `g[p]` at index
/// `indices[p]` along `dim`. The backward of max/min along a dim.
pub(crate) fn scatter_along(
    g: &Tensor,
    indices: &Tensor,
    shape: &[usize],
    dim: usize,
) -> Result<Tensor> {
    match backend("scatter_along", &[g, indices])? {
        // Indices are not read on meta (treated as valid).
        Backend::Meta => return crate::meta::empty(shape, g.dtype()),
        Backend::Cuda(_) => {
            return crate::primitives::cuda::index::scatter_along(g, indices, shape, dim)
        }
        Backend::Cpu => {}
    }
    let mut idx = indices.layout().offsets()?;
    match &*indices.storage().cpu()? {
        CpuData::U8(v) => idx.iter_mut().for_each(|o| *o = v[*o] as usize),
        CpuData::U32(v) => idx.iter_mut().for_each(|o| *o = v[*o] as usize),
        CpuData::I64(v) => idx.iter_mut().for_each(|o| *o = v[*o].max(0) as usize),
        other => {
            return Err(Error::UnsupportedDType {
                op: "scatter_along",
                dtype: other.dtype(),
            })
        }
    };
    let (len, inner) = (shape[dim], shape[dim + 1..].iter().product::<usize>());
    if idx.len() != g.numel() || idx.iter().any(|&i| i >= len) {
        return Err(Error::InvalidArgument {
            op: "scatter_along",
            msg: format!("indices do not fit an axis of size {len}"),
        });
    }
    let values = gather(g)?;
    let mut out = CpuData::zeros(g.dtype(), checked_numel("scatter_along", shape)?)?;
    fn go<T: WithDType>(
        v: &[T],
        out: &mut CpuData,
        idx: &[usize],
        len: usize,
        inner: usize,
    ) -> Result<()> {
        let o = T::cpu_slice_mut(out).ok_or(Error::InvalidArgument {
            op: "scatter_along",
            msg: "dtype changed".into(),
        })?;
        for (p, (&x, &i)) in v.iter().zip(idx).enumerate() {
            o[((p / inner) * len + i) * inner + p % inner] = x;
        }
        Ok(())
    }
    crate::match_cpu_data!(&values, v => go(v, &mut out, &idx, len, inner))?;
    Tensor::from_cpu_data(out, shape)
}
