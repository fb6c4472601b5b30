//! Element types and the traits that let kernels be written once for all of them.

use half::{bf16, f16};

/// The element type of a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum DType {
    F32,
    F16,
    BF16,
    F64,
    U8,
    U32,
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

/// A Rust type that is the element of some [`DType`].
pub trait WithDType:
    crate::tensor::CpuElement + Copy + Send + Sync + std::fmt::Debug + PartialOrd + 'static
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
