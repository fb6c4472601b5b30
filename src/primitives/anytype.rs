//! Kernels for every dtype (integers included): comparisons into U8 masks,
//! selection by a mask, and dtype casts. Any layout in, contiguous out.

use super::elementwise::{check_pair, check_same_device, fill, typed, Source};
use crate::dtype::CpuData;
use crate::meta::{self, backend, Backend};
use crate::tensor::{broadcast_shapes, Backing, Layout, Tensor};
use crate::{DType, Error, Result, WithDType};
use half::{bf16, f16};

/// An elementwise comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CmpOp {
    /// `a == b`
    Eq,
    /// `a != b`
    Ne,
    /// `a < b`
    Lt,
    /// `a <= b`
    Le,
    /// `a > b`
    Gt,
    /// `a >= b`
    Ge,
}

impl CmpOp {
    /// The op name, for errors.
    pub fn name(self) -> &'static str {
        match self {
            CmpOp::Eq => "eq",
            CmpOp::Ne => "ne",
            CmpOp::Lt => "lt",
            CmpOp::Le => "le",
            CmpOp::Gt => "gt",
            CmpOp::Ge => "ge",
        }
    }

    /// The comparison (IEEE semantics: every comparison with NaN but `Ne` is false).
    #[inline(always)]
    pub fn test<T: PartialOrd>(self, a: T, b: T) -> bool {
        match self {
            CmpOp::Eq => a == b,
            CmpOp::Ne => a != b,
            CmpOp::Lt => a < b,
            CmpOp::Le => a <= b,
            CmpOp::Gt => a > b,
            CmpOp::Ge => a >= b,
        }
    }
}

/// `op(a, b)` elementwise with broadcasting, as a U8 tensor of 1/0. Both
/// must share a dtype (any dtype); comparison is native (`PartialOrd`).
pub fn compare_map(a: &Tensor, b: &Tensor, op: CmpOp) -> Result<Tensor> {
    check_pair(op.name(), a, b)?;
    let shape = broadcast_shapes(op.name(), a.shape(), b.shape())?;
    let (la, lb) = (
        a.layout().broadcast_to(&shape)?,
        b.layout().broadcast_to(&shape)?,
    );
    match backend(op.name(), &[a, b])? {
        Backend::Meta => return meta::empty(&shape, DType::U8),
        Backend::Cuda(_) => {
            return crate::primitives::cuda::ops::compare(a, &la, b, &lb, &shape, op)
        }
        Backend::Cpu => {}
    }
    let (da, db) = (a.storage().cpu()?, b.storage().cpu()?);
    fn go<T: WithDType>(
        sa: &[T],
        la: &Layout,
        db: &CpuData,
        lb: &Layout,
        op: CmpOp,
    ) -> Result<Vec<u8>> {
        let (a, b) = (
            Source::new(sa, la)?,
            Source::new(typed::<T>(db, op.name())?, lb)?,
        );
        fill(la.numel(), |i| u8::from(op.test(a.get(i), b.get(i))))
    }
    let out = crate::match_cpu_data!(&*da, v => go(v, &la, &db, &lb, op)?);
    drop((da, db));
    Tensor::from_cpu_data(CpuData::U8(out), &shape)
}

/// `op(x, s)` elementwise as a U8 tensor of 1/0, for any dtype; elements
/// are compared as f64 (exact but for i64 beyond 2^53).
pub fn compare_scalar(x: &Tensor, s: f64, op: CmpOp) -> Result<Tensor> {
    match backend(op.name(), &[x])? {
        Backend::Meta => return meta::empty(x.shape(), DType::U8),
        Backend::Cuda(_) => return crate::primitives::cuda::ops::compare_scalar(x, s, op),
        Backend::Cpu => {}
    }
    let data = x.storage().cpu()?;
    fn go<T: WithDType>(v: &[T], l: &Layout, s: f64, op: CmpOp) -> Result<Vec<u8>> {
        let src = Source::new(v, l)?;
        fill(l.numel(), |i| u8::from(op.test(src.get(i).to_f64(), s)))
    }
    let out = crate::match_cpu_data!(&*data, v => go(v, x.layout(), s, op)?);
    drop(data);
    Tensor::from_cpu_data(CpuData::U8(out), x.shape())
}

/// `a` where `cond` is nonzero, else `b`, with broadcasting of all three.
/// `cond` must be U8; `a` and `b` share a dtype (any), which the result has.
pub fn select(cond: &Tensor, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    const OP: &str = "where_cond";
    if cond.dtype() != DType::U8 {
        return Err(Error::DTypeMismatch {
            op: OP,
            expected: DType::U8,
            got: cond.dtype(),
        });
    }
    check_same_device(OP, cond, a)?;
    check_pair(OP, a, b)?;
    let shape = broadcast_shapes(OP, cond.shape(), a.shape())?;
    let shape = broadcast_shapes(OP, &shape, b.shape())?;
    let lc = cond.layout().broadcast_to(&shape)?;
    let (la, lb) = (
        a.layout().broadcast_to(&shape)?,
        b.layout().broadcast_to(&shape)?,
    );
    match backend(OP, &[cond, a, b])? {
        Backend::Meta => return meta::empty(&shape, a.dtype()),
        Backend::Cuda(_) => {
            return crate::primitives::cuda::ops::select((cond, &lc), (a, &la), (b, &lb), &shape)
        }
        Backend::Cpu => {}
    }
    let (dc, da, db) = (
        cond.storage().cpu()?,
        a.storage().cpu()?,
        b.storage().cpu()?,
    );
    let c = Source::new(typed::<u8>(&dc, OP)?, &lc)?;
    fn go<T: WithDType>(
        c: &Source<u8>,
        sa: &[T],
        la: &Layout,
        db: &CpuData,
        lb: &Layout,
    ) -> Result<CpuData> {
        let (a, b) = (Source::new(sa, la)?, Source::new(typed::<T>(db, OP)?, lb)?);
        Ok(T::wrap(fill(la.numel(), |i| {
            if c.get(i) != 0 {
                a.get(i)
            } else {
                b.get(i)
            }
        })?))
    }
    let out = crate::match_cpu_data!(&*da, v => go(&c, v, &la, &db, &lb)?);
    drop(c);
    drop((dc, da, db));
    Tensor::from_cpu_data(out, &shape)
}

/// The elements of `x` converted to `dtype` as Rust's `as` converts through
/// f64 (float to integer truncates and saturates; NaN becomes 0). No autograd.
pub fn cast(x: &Tensor, dtype: DType) -> Result<Tensor> {
    match backend("cast", &[x])? {
        Backend::Meta => return meta::empty(x.shape(), dtype),
        Backend::Cuda(_) => return crate::primitives::cuda::ops::cast(x, dtype),
        Backend::Cpu => {}
    }
    let data = x.storage().cpu()?;
    fn conv<S: WithDType, D: WithDType>(src: &Source<S>, n: usize) -> Result<CpuData> {
        Ok(D::wrap(fill(n, |i| D::from_f64(src.get(i).to_f64()))?))
    }
    fn go<S: WithDType>(v: &[S], l: &Layout, dtype: DType) -> Result<CpuData> {
        let (src, n) = (Source::new(v, l)?, l.numel());
        match dtype {
            DType::F32 => conv::<S, f32>(&src, n),
            DType::F16 => conv::<S, f16>(&src, n),
            DType::BF16 => conv::<S, bf16>(&src, n),
            DType::F64 => conv::<S, f64>(&src, n),
            DType::U8 => conv::<S, u8>(&src, n),
            DType::U32 => conv::<S, u32>(&src, n),
            DType::I64 => conv::<S, i64>(&src, n),
        }
    }
    let out = crate::match_cpu_data!(&*data, v => go(v, x.layout(), dtype)?);
    drop(data);
    Tensor::from_cpu_data(out, x.shape())
}

/// The elements of `x` converted to `dtype`, an element type of the same
/// size (F16 ⇄ BF16, F32 ⇄ U32, F64 ⇄ I64), written over the buffer that
/// holds them: the values [`cast`] gives, no new allocation, one in-place
/// modification of the storage (its version moves on). `x` must be the only
/// reference to its storage (an error otherwise; callers check
/// [`Tensor::is_exclusive`] first). No autograd.
pub(crate) fn cast_in_place(x: &mut Tensor, dtype: DType) -> Result<()> {
    const OP: &str = "to_dtype_owned";
    let backend = backend("cast", &[x])?;
    let storage = x.storage_mut().ok_or_else(|| Error::InvalidArgument {
        op: OP,
        msg: "the tensor's storage is held elsewhere; cast a copy instead".into(),
    })?;
    storage.convert_in_place(OP, dtype, |backing| match (backend, backing) {
        (Backend::Meta, _) => Ok(()),
        (Backend::Cuda(_), backing) => crate::primitives::cuda::ops::cast_in_place(backing, dtype),
        (Backend::Cpu, Backing::Host(data)) => {
            let data = data.get_mut().unwrap_or_else(|e| e.into_inner());
            let taken = std::mem::replace(data, CpuData::U8(Vec::new()));
            *data = recast_host(taken, dtype)?;
            Ok(())
        }
        (Backend::Cpu, _) => Err(Error::NoData { op: OP }),
    })
}

/// Host elements converted to `dtype` of the same element size inside their
/// own allocation: each element's new bits are written over its old ones,
/// then the vector is reinterpreted (no second buffer).
fn recast_host(data: CpuData, dtype: DType) -> Result<CpuData> {
    use bytemuck::Pod;
    fn go<S: WithDType + Pod, D: WithDType + Pod>(mut v: Vec<S>) -> Result<Vec<D>> {
        // The same conversion as `cast`'s, element by element.
        let rewrite = |chunk: &mut [S]| {
            for x in chunk {
                *x = bytemuck::cast::<D, S>(D::from_f64(x.to_f64()));
            }
        };
        if super::parallel(v.len()) {
            use rayon::prelude::*;
            v.par_chunks_mut(1 << 14).for_each(rewrite);
        } else {
            rewrite(&mut v);
        }
        bytemuck::allocation::try_cast_vec(v).map_err(|(e, _)| Error::InvalidArgument {
            op: "to_dtype_owned",
            msg: format!("cannot reinterpret the buffer: {e}"),
        })
    }
    let from = data.dtype();
    Ok(match (data, dtype) {
        (CpuData::F16(v), DType::BF16) => CpuData::BF16(go::<f16, bf16>(v)?),
        (CpuData::BF16(v), DType::F16) => CpuData::F16(go::<bf16, f16>(v)?),
        (CpuData::F32(v), DType::U32) => CpuData::U32(go::<f32, u32>(v)?),
        (CpuData::U32(v), DType::F32) => CpuData::F32(go::<u32, f32>(v)?),
        (CpuData::F64(v), DType::I64) => CpuData::I64(go::<f64, i64>(v)?),
        (CpuData::I64(v), DType::F64) => CpuData::F64(go::<i64, f64>(v)?),
        (data, to) if to == from => data,
        _ => {
            return Err(Error::InvalidArgument {
                op: "to_dtype_owned",
                msg: format!("no in-place cast from {from:?} to {dtype:?}"),
            })
        }
    })
}
