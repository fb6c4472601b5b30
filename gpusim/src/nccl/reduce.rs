//! NCCL's element types and reduction operators, and the reduction itself:
//! deterministic, in rank order 0, 1, 2, … with every step rounded in the
//! element type (f16 and bf16 through f32, one rounding per step; integers
//! wrap), `ncclAvg` the sum divided by the number of ranks in the element
//! type.

use half::{bf16, f16};

/// `ncclDataType_t` (NCCL 2.24 and later numbering).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataType {
    /// `ncclInt8`.
    I8,
    /// `ncclUint8`.
    U8,
    /// `ncclInt32`.
    I32,
    /// `ncclUint32`.
    U32,
    /// `ncclInt64`.
    I64,
    /// `ncclUint64`.
    U64,
    /// `ncclFloat16`.
    F16,
    /// `ncclFloat32`.
    F32,
    /// `ncclFloat64`.
    F64,
    /// `ncclBfloat16`.
    Bf16,
    /// `ncclFloat8e4m3`: moved, never reduced here.
    F8E4M3,
    /// `ncclFloat8e5m2`: moved, never reduced here.
    F8E5M2,
}

impl DataType {
    /// The type of `ncclDataType_t` value `v`.
    pub fn from_raw(v: u32) -> Option<DataType> {
        use DataType::*;
        Some(match v {
            0 => I8,
            1 => U8,
            2 => I32,
            3 => U32,
            4 => I64,
            5 => U64,
            6 => F16,
            7 => F32,
            8 => F64,
            9 => Bf16,
            10 => F8E4M3,
            11 => F8E5M2,
            _ => return None,
        })
    }

    /// The `ncclDataType_t` value of this type.
    pub fn to_raw(self) -> u32 {
        use DataType::*;
        match self {
            I8 => 0,
            U8 => 1,
            I32 => 2,
            U32 => 3,
            I64 => 4,
            U64 => 5,
            F16 => 6,
            F32 => 7,
            F64 => 8,
            Bf16 => 9,
            F8E4M3 => 10,
            F8E5M2 => 11,
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        use DataType::*;
        match self {
            I8 | U8 | F8E4M3 | F8E5M2 => 1,
            F16 | Bf16 => 2,
            I32 | U32 | F32 => 4,
            I64 | U64 | F64 => 8,
        }
    }

    /// Whether reductions of this type are simulated (fp8 ones are not:
    /// their arithmetic is not modelled).
    pub fn reducible(self) -> bool {
        !matches!(self, DataType::F8E4M3 | DataType::F8E5M2)
    }
}

/// `ncclRedOp_t`'s built-in operators.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RedOp {
    /// `ncclSum`.
    Sum,
    /// `ncclProd`.
    Prod,
    /// `ncclMax`.
    Max,
    /// `ncclMin`.
    Min,
    /// `ncclAvg`.
    Avg,
}

impl RedOp {
    /// The operator of `ncclRedOp_t` value `v` (user-defined operators,
    /// `ncclRedOpCreatePreMulSum`'s, are not simulated).
    pub fn from_raw(v: u32) -> Option<RedOp> {
        Some(match v {
            0 => RedOp::Sum,
            1 => RedOp::Prod,
            2 => RedOp::Max,
            3 => RedOp::Min,
            4 => RedOp::Avg,
            _ => return None,
        })
    }

    /// The `ncclRedOp_t` value of this operator.
    pub fn to_raw(self) -> u32 {
        match self {
            RedOp::Sum => 0,
            RedOp::Prod => 1,
            RedOp::Max => 2,
            RedOp::Min => 3,
            RedOp::Avg => 4,
        }
    }
}

/// Arithmetic of one element type, each operation rounded in that type.
trait Elem: Copy {
    fn load(b: &[u8]) -> Self;
    fn store(self, b: &mut [u8]);
    fn add(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    fn max(self, o: Self) -> Self;
    fn min(self, o: Self) -> Self;
    /// `self / n` (the average's last step).
    fn div_n(self, n: usize) -> Self;
}

/// Integers: wrapping sum and product, truncating division.
macro_rules! int_elem {
    ($($t:ty),*) => {$(
        impl Elem for $t {
            fn load(b: &[u8]) -> Self {
                <$t>::from_le_bytes(b.try_into().expect("element size"))
            }
            fn store(self, b: &mut [u8]) {
                b.copy_from_slice(&self.to_le_bytes());
            }
            fn add(self, o: Self) -> Self {
                self.wrapping_add(o)
            }
            fn mul(self, o: Self) -> Self {
                self.wrapping_mul(o)
            }
            fn max(self, o: Self) -> Self {
                Ord::max(self, o)
            }
            fn min(self, o: Self) -> Self {
                Ord::min(self, o)
            }
            fn div_n(self, n: usize) -> Self {
                // n ≤ 64 ranks fits every type; wrapping_div only guards
                // MIN / -1, which cannot occur with n > 0.
                self.wrapping_div(n as $t)
            }
        }
    )*};
}
int_elem!(i8, u8, i32, u32, i64, u64);

/// Max and min of floats: NaN if either is (the first NaN met is kept);
/// otherwise the larger (smaller), the accumulator on ties (so −0 and +0
/// keep the lower rank's).
fn fmax<T: PartialOrd + Copy>(a: T, b: T, nan: impl Fn(T) -> bool) -> T {
    if nan(a) {
        a
    } else if nan(b) || b > a {
        b
    } else {
        a
    }
}

fn fmin<T: PartialOrd + Copy>(a: T, b: T, nan: impl Fn(T) -> bool) -> T {
    if nan(a) {
        a
    } else if nan(b) || b < a {
        b
    } else {
        a
    }
}

macro_rules! float_elem {
    ($($t:ty),*) => {$(
        impl Elem for $t {
            fn load(b: &[u8]) -> Self {
                <$t>::from_le_bytes(b.try_into().expect("element size"))
            }
            fn store(self, b: &mut [u8]) {
                b.copy_from_slice(&self.to_le_bytes());
            }
            fn add(self, o: Self) -> Self {
                self + o
            }
            fn mul(self, o: Self) -> Self {
                self * o
            }
            fn max(self, o: Self) -> Self {
                fmax(self, o, <$t>::is_nan)
            }
            fn min(self, o: Self) -> Self {
                fmin(self, o, <$t>::is_nan)
            }
            fn div_n(self, n: usize) -> Self {
                self / n as $t
            }
        }
    )*};
}
float_elem!(f32, f64);

/// Half types: each operation in f32, then rounded to the type (to nearest
/// even), as NCCL's kernels compute them.
macro_rules! half_elem {
    ($($t:ty),*) => {$(
        impl Elem for $t {
            fn load(b: &[u8]) -> Self {
                <$t>::from_le_bytes(b.try_into().expect("element size"))
            }
            fn store(self, b: &mut [u8]) {
                b.copy_from_slice(&self.to_le_bytes());
            }
            fn add(self, o: Self) -> Self {
                <$t>::from_f32(self.to_f32() + o.to_f32())
            }
            fn mul(self, o: Self) -> Self {
                <$t>::from_f32(self.to_f32() * o.to_f32())
            }
            fn max(self, o: Self) -> Self {
                fmax(self, o, <$t>::is_nan)
            }
            fn min(self, o: Self) -> Self {
                fmin(self, o, <$t>::is_nan)
            }
            fn div_n(self, n: usize) -> Self {
                <$t>::from_f32(self.to_f32() / n as f32)
            }
        }
    )*};
}
half_elem!(f16, bf16);

/// Reduces `inputs` (one byte slice per rank, in rank order, all the same
/// length) with `op`: element by element, rank 0's value combined with
/// rank 1's, that with rank 2's, and so on; `Avg` divides the sum by
/// `inputs.len()`.
fn fold<T: Elem>(op: RedOp, inputs: &[&[u8]]) -> Vec<u8> {
    let size = std::mem::size_of::<T>();
    let mut out = inputs[0].to_vec();
    for (i, o) in out.chunks_exact_mut(size).enumerate() {
        let at = i * size..(i + 1) * size;
        let mut acc = T::load(o);
        for x in &inputs[1..] {
            let v = T::load(&x[at.clone()]);
            acc = match op {
                RedOp::Sum | RedOp::Avg => acc.add(v),
                RedOp::Prod => acc.mul(v),
                RedOp::Max => acc.max(v),
                RedOp::Min => acc.min(v),
            };
        }
        if op == RedOp::Avg {
            acc = acc.div_n(inputs.len());
        }
        acc.store(o);
    }
    out
}

/// The reduction of `inputs` (see `fold`) for element type `t`; `None`
/// for a type that is not reducible.
pub fn reduce(t: DataType, op: RedOp, inputs: &[&[u8]]) -> Option<Vec<u8>> {
    use DataType::*;
    Some(match t {
        I8 => fold::<i8>(op, inputs),
        U8 => fold::<u8>(op, inputs),
        I32 => fold::<i32>(op, inputs),
        U32 => fold::<u32>(op, inputs),
        I64 => fold::<i64>(op, inputs),
        U64 => fold::<u64>(op, inputs),
        F16 => fold::<f16>(op, inputs),
        F32 => fold::<f32>(op, inputs),
        F64 => fold::<f64>(op, inputs),
        Bf16 => fold::<bf16>(op, inputs),
        F8E4M3 | F8E5M2 => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes<T: Elem>(v: &[T]) -> Vec<u8> {
        let size = std::mem::size_of::<T>();
        let mut out = vec![0u8; std::mem::size_of_val(v)];
        for (x, o) in v.iter().zip(out.chunks_exact_mut(size)) {
            x.store(o);
        }
        out
    }

    #[test]
    fn sums_round_each_step_in_rank_order() {
        // 1 + 2^-24 + 2^-24 in f32: each addition rounds back to 1.
        let a = bytes(&[1.0f32]);
        let b = bytes(&[2f32.powi(-24)]);
        let out = reduce(DataType::F32, RedOp::Sum, &[&a, &b, &b]).unwrap();
        assert_eq!(f32::load(&out), 1.0);
        // The other order keeps them.
        let out = reduce(DataType::F32, RedOp::Sum, &[&b, &b, &a]).unwrap();
        assert_eq!(f32::load(&out), 1.0 + 2f32.powi(-23));
        // Integers wrap; the average truncates.
        let x = bytes(&[i64::MAX, 7]);
        let y = bytes(&[1i64, -2]);
        let out = reduce(DataType::I64, RedOp::Sum, &[&x, &y]).unwrap();
        assert_eq!(i64::load(&out[..8]), i64::MIN);
        let out = reduce(DataType::I64, RedOp::Avg, &[&x[8..], &y[8..]]).unwrap();
        assert_eq!(i64::load(&out), 2);
        // Max propagates NaN.
        let n = bytes(&[f32::NAN]);
        let out = reduce(DataType::F32, RedOp::Max, &[&a, &n]).unwrap();
        assert!(f32::load(&out).is_nan());
        assert!(reduce(DataType::F8E4M3, RedOp::Sum, &[&[1u8][..]]).is_none());
    }

    #[test]
    fn halves_round_through_f32_at_every_step() {
        let h = |x: f32| f16::from_f32(x);
        let (a, b, c) = (h(1.0), h(0.000_488_28), h(0.000_488_28));
        let expect = h(h(a.to_f32() + b.to_f32()).to_f32() + c.to_f32());
        let out = reduce(
            DataType::F16,
            RedOp::Sum,
            &[&bytes(&[a]), &bytes(&[b]), &bytes(&[c])],
        )
        .unwrap();
        assert_eq!(f16::load(&out).to_bits(), expect.to_bits());
        let three = bytes(&[bf16::from_f32(3.0)]);
        let avg = reduce(DataType::Bf16, RedOp::Avg, &[&three[..]; 3]).unwrap();
        assert_eq!(bf16::load(&avg), bf16::from_f32(3.0));
    }
}
