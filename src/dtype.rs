//! Element types and the traits that let kernels be written once for all of them.

use half::{bf16, f16};

/// The element type of a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum DType {
    /// 32-bit IEEE float.
    F32,
    /// 16-bit IEEE float (half).
    F16,
    /// bfloat16: f32's 8-bit exponent with a 7-bit mantissa.
    BF16,
    /// 64-bit IEEE float.
    F64,
    /// Unsigned byte (masks).
    U8,
    /// Unsigned 32-bit integer (indices).
    U32,
    /// Signed 64-bit integer (indices, class targets, counters).
    I64,
}

impl DType {
    /// Bytes per element.
    pub fn size_in_bytes(self) -> usize {
        match self {
            DType::U8 => 1,
            DType::F16 | DType::BF16 => 2,
            DType::F32 | DType::U32 => 4,
            DType::F64 | DType::I64 => 8,
        }
    }

    /// Whether the dtype is a floating-point type (differentiable).
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16 | DType::F64)
    }
}

/// The dtype statistics and log-sum-exps are kept in: f64 for f64, else f32
/// (on every device: the CUDA kernels' `Acc<T>`).
pub(crate) fn stat_dtype(dtype: DType) -> DType {
    if dtype == DType::F64 {
        DType::F64
    } else {
        DType::F32
    }
}

/// A Rust type that is the element of some [`DType`].
/// (`Zeroable`: all-zero bytes are the value zero, so zeroed host buffers
/// come from a zeroed allocation, `memory::host::try_zeroed`.)
pub trait WithDType:
    CpuElement + bytemuck::Zeroable + Copy + Send + Sync + std::fmt::Debug + PartialOrd + 'static
{
    /// The matching dtype.
    const DTYPE: DType;
    /// Converts to f64 (exact for every supported type but large i64/u64).
    fn to_f64(self) -> f64;
    /// Converts from f64, rounding or truncating as `as` does.
    fn from_f64(v: f64) -> Self;
}

macro_rules! with_dtype {
    ($t:ty, $d:ident, $to:expr, $from:expr) => {
        impl WithDType for $t {
            const DTYPE: DType = DType::$d;
            fn to_f64(self) -> f64 {
                $to(self)
            }
            fn from_f64(v: f64) -> Self {
                $from(v)
            }
        }
    };
}
with_dtype!(f32, F32, |v: f32| v as f64, |v: f64| v as f32);
with_dtype!(f64, F64, |v: f64| v, |v: f64| v);
// f64 → f16/bf16 goes through f32, as PyTorch's `c10::Half(float)` /
// `c10::BFloat16(float)` do and as the CUDA kernels do (`lg_from_f64`):
// `half`'s own `bf16::from_f64` drops the low 32 bits of the f64 before
// rounding, which rounds some near-ties the other way.
with_dtype!(f16, F16, |v: f16| v.to_f64(), |v: f64| f16::from_f32(
    v as f32
));
with_dtype!(bf16, BF16, |v: bf16| v.to_f64(), |v: f64| bf16::from_f32(
    v as f32
));
with_dtype!(u8, U8, |v: u8| v as f64, |v: f64| v as u8);
with_dtype!(u32, U32, |v: u32| v as f64, |v: f64| v as u32);
with_dtype!(i64, I64, |v: i64| v as f64, |v: f64| v as i64);

/// A floating-point element: the dtypes that can carry gradients.
pub trait FloatDType: WithDType + num_traits::Float {
    /// Converts from f32.
    fn from_f32(v: f32) -> Self;
    /// Converts to f32.
    fn to_f32(self) -> f32;
}

macro_rules! float_dtype {
    ($t:ty, $from:expr, $to:expr) => {
        impl FloatDType for $t {
            fn from_f32(v: f32) -> Self {
                $from(v)
            }
            fn to_f32(self) -> f32 {
                $to(self)
            }
        }
    };
}
float_dtype!(f32, |v| v, |v| v);
float_dtype!(f64, |v: f32| v as f64, |v: f64| v as f32);
float_dtype!(f16, f16::from_f32, |v: f16| v.to_f32());
float_dtype!(bf16, bf16::from_f32, |v: bf16| v.to_f32());

/// Converts `value` to the element type of `_like` (type inference helper).
pub(crate) fn from_f64_like<T: WithDType>(_like: &[T], value: f64) -> T {
    T::from_f64(value)
}

/// Host data of one dtype.
#[derive(Clone, Debug)]
pub enum CpuData {
    /// [`DType::F32`] elements.
    F32(Vec<f32>),
    /// [`DType::F16`] elements.
    F16(Vec<f16>),
    /// [`DType::BF16`] elements.
    BF16(Vec<bf16>),
    /// [`DType::F64`] elements.
    F64(Vec<f64>),
    /// [`DType::U8`] elements.
    U8(Vec<u8>),
    /// [`DType::U32`] elements.
    U32(Vec<u32>),
    /// [`DType::I64`] elements.
    I64(Vec<i64>),
}

/// Runs `$body` with `$v` bound to the typed vector inside a [`CpuData`].
#[macro_export]
#[doc(hidden)]
macro_rules! match_cpu_data {
    ($data:expr, $v:ident => $body:expr) => {
        match $data {
            $crate::dtype::CpuData::F32($v) => $body,
            $crate::dtype::CpuData::F16($v) => $body,
            $crate::dtype::CpuData::BF16($v) => $body,
            $crate::dtype::CpuData::F64($v) => $body,
            $crate::dtype::CpuData::U8($v) => $body,
            $crate::dtype::CpuData::U32($v) => $body,
            $crate::dtype::CpuData::I64($v) => $body,
        }
    };
}

/// Like [`match_cpu_data`] for the float dtypes; other dtypes give
/// `Error::UnsupportedDType` for `$op`.
#[macro_export]
#[doc(hidden)]
macro_rules! match_float_data {
    ($data:expr, $op:expr, $v:ident => $body:expr) => {
        match $data {
            $crate::dtype::CpuData::F32($v) => $body,
            $crate::dtype::CpuData::F16($v) => $body,
            $crate::dtype::CpuData::BF16($v) => $body,
            $crate::dtype::CpuData::F64($v) => $body,
            other => {
                return Err($crate::Error::UnsupportedDType {
                    op: $op,
                    dtype: other.dtype(),
                })
            }
        }
    };
}

impl CpuData {
    /// The dtype of the elements.
    pub fn dtype(&self) -> DType {
        match_cpu_data!(self, v => element_dtype(v))
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match_cpu_data!(self, v => v.len())
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The elements converted to `T` (in storage order).
    pub fn to_vec_as<T: WithDType>(&self) -> Vec<T> {
        match_cpu_data!(self, v => v.iter().map(|&x| T::from_f64(x.to_f64())).collect())
    }

    /// A typed slice, if the dtype is `T`'s.
    pub fn as_slice<T: WithDType>(&self) -> Option<&[T]> {
        T::cpu_slice(self)
    }

    /// A typed mutable slice, if the dtype is `T`'s.
    pub fn as_mut_slice<T: WithDType>(&mut self) -> Option<&mut [T]> {
        T::cpu_slice_mut(self)
    }
}

fn element_dtype<T: WithDType>(_: &[T]) -> DType {
    T::DTYPE
}

/// Moves typed vectors in and out of [`CpuData`].
pub trait CpuElement: Sized {
    /// Wraps a vector.
    fn wrap(v: Vec<Self>) -> CpuData;
    /// The slice inside, if the dtype matches.
    fn cpu_slice(d: &CpuData) -> Option<&[Self]>;
    /// The mutable slice inside, if the dtype matches.
    fn cpu_slice_mut(d: &mut CpuData) -> Option<&mut [Self]>;
}

macro_rules! cpu_element {
    ($t:ty, $v:ident) => {
        impl CpuElement for $t {
            fn wrap(v: Vec<Self>) -> CpuData {
                CpuData::$v(v)
            }
            fn cpu_slice(d: &CpuData) -> Option<&[Self]> {
                match d {
                    CpuData::$v(v) => Some(v),
                    _ => None,
                }
            }
            fn cpu_slice_mut(d: &mut CpuData) -> Option<&mut [Self]> {
                match d {
                    CpuData::$v(v) => Some(v),
                    _ => None,
                }
            }
        }
    };
}
cpu_element!(f32, F32);
cpu_element!(f16, F16);
cpu_element!(bf16, BF16);
cpu_element!(f64, F64);
cpu_element!(u8, U8);
cpu_element!(u32, U32);
cpu_element!(i64, I64);
