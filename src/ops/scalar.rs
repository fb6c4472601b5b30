//! Arithmetic with an f64 scalar (converted to the tensor's float dtype),
//! its in-place forms, clamp, and elementwise maximum/minimum.

use super::binary::{MulK, SubK};
use super::mask::{MaskRule, SavedMask};
use super::{check_in_place, sum_to_shape};
use crate::autograd::{attach, needs_grad, BackwardOp, SavedTensor};
use crate::op_code::{BinaryOp, UnaryOp};
use crate::primitives::{binary_map, unary_assign, unary_map, BinaryKernel, UnaryKernel};
use crate::{Error, FloatDType, Result, Tensor, WithDType};

/// `v` as a `T`.
#[inline(always)]
fn c<T: FloatDType>(v: f64) -> T {
    <T as WithDType>::from_f64(v)
}

macro_rules! scalar_kernel {
    ($name:ident, $s:literal, |$p:ident| $cuda:expr, |$x:ident, $v:ident| $e:expr) => {
        struct $name(f64);
        impl UnaryKernel for $name {
            const NAME: &'static str = $s;
            fn f<T: FloatDType>(&self, $x: T) -> T {
                let $v: T = c(self.0);
                $e
            }
            fn cuda(&self) -> Option<UnaryOp> {
                let $p = self.0;
                Some($cuda)
            }
        }
    };
}
scalar_kernel!(
    AddScalarK,
    "add_scalar",
    |s| UnaryOp::AddScalar(s),
    |x, s| x + s
);
scalar_kernel!(
    SubScalarK,
    "sub_scalar",
    |s| UnaryOp::AddScalar(-s),
    |x, s| x - s
);
scalar_kernel!(
    MulScalarK,
    "mul_scalar",
    |s| UnaryOp::MulScalar(s),
    |x, s| x * s
);
scalar_kernel!(
    DivScalarK,
    "div_scalar",
    |s| UnaryOp::DivScalar(s),
    |x, s| x / s
);
scalar_kernel!(
    ScalarSubK,
    "scalar_sub",
    |s| UnaryOp::RSubScalar(s),
    |x, s| s - x
);

/// `x` limited to `[lo, hi]` (NaN passes through).
struct ClampK(f64, f64);
impl UnaryKernel for ClampK {
    const NAME: &'static str = "clamp";
    fn f<T: FloatDType>(&self, x: T) -> T {
        let (lo, hi) = (c(self.0), c(self.1));
        if x < lo {
            lo
        } else if x > hi {
            hi
        } else {
            x
        }
    }
    fn cuda(&self) -> Option<UnaryOp> {
        Some(UnaryOp::Clamp(self.0, self.1))
    }
}

/// Elementwise max (`true`) or min (`false`); NaN propagates.
struct ExtremumK(bool);
impl BinaryKernel for ExtremumK {
    const NAME: &'static str = "maximum/minimum";
    fn f<T: FloatDType>(&self, a: T, b: T) -> T {
        if a.is_nan() || b.is_nan() {
            a + b
        } else if (a >= b) == self.0 {
            a
        } else {
            b
        }
    }
    fn cuda(&self) -> Option<BinaryOp> {
        Some(if self.0 { BinaryOp::Max } else { BinaryOp::Min })
    }
}

/// The share of the gradient that goes to `a`: 1 where `a` wins, ½ on a
/// tie, 0 where `b` wins (`b` gets the rest).
struct ShareK(bool);
impl BinaryKernel for ShareK {
    const NAME: &'static str = "maximum/minimum";
    fn f<T: FloatDType>(&self, a: T, b: T) -> T {
        if a == b {
            c(0.5)
        } else if (a > b && self.0) || (a < b && !self.0) {
            T::one()
        } else {
            T::zero()
        }
    }
    fn cuda(&self) -> Option<BinaryOp> {
        Some(if self.0 {
            BinaryOp::MaxShare
        } else {
            BinaryOp::MinShare
        })
    }
}

/// How a scalar op's gradient follows from `g`.
enum ScalarGrad {
    Identity,
    Mul(f64),
    Div(f64),
}

/// Backward of the scalar ops: saves nothing but the scalar.
struct ScalarBackward {
    name: &'static str,
    grad: ScalarGrad,
}

impl BackwardOp for ScalarBackward {
    fn name(&self) -> &'static str {
        self.name
    }
    fn backward(self: Box<Self>, g: Tensor) -> Result<Vec<Option<Tensor>>> {
        Ok(vec![Some(match self.grad {
            ScalarGrad::Identity => g,
            ScalarGrad::Mul(s) => unary_map(&g, &MulScalarK(s))?,
            ScalarGrad::Div(s) => unary_map(&g, &DivScalarK(s))?,
        })])
    }
}

/// Backward of clamp: saves a 1-bit packed mask of where `min <= x <= max`.
struct ClampBackward {
    inside: SavedMask,
}

impl BackwardOp for ClampBackward {
    fn name(&self) -> &'static str {
        "clamp"
    }
    fn backward(self: Box<Self>, g: Tensor) -> Result<Vec<Option<Tensor>>> {
        Ok(vec![Some(self.inside.apply(g, 0.0)?)])
    }
}

/// Backward of maximum/minimum: saves both inputs (either gradient needs the
/// comparison), and their shapes to undo broadcasting.
struct ExtremumBackward {
    name: &'static str,
    is_max: bool,
    a: SavedTensor,
    b: SavedTensor,
    shapes: [Vec<usize>; 2],
    needs: [bool; 2],
}

impl BackwardOp for ExtremumBackward {
    fn name(&self) -> &'static str {
        self.name
    }
    fn backward(self: Box<Self>, g: Tensor) -> Result<Vec<Option<Tensor>>> {
        let share = binary_map(self.a.get()?, self.b.get()?, &ShareK(self.is_max))?;
        let ga = binary_map(&g, &share, &MulK)?;
        drop(share);
        let gb = match self.needs[1] {
            true => Some(sum_to_shape(&binary_map(&g, &ga, &SubK)?, &self.shapes[1])?),
            false => None,
        };
        let ga = self.needs[0]
            .then(|| sum_to_shape(&ga, &self.shapes[0]))
            .transpose()?;
        Ok(vec![ga, gb])
    }
}

/// `x = k(x)` in place, refused on a tensor autograd may still need.
fn scalar_assign<K: UnaryKernel>(x: &Tensor, k: &K) -> Result<()> {
    check_in_place(K::NAME, x)?;
    unary_assign(x, k)
}

/// Applies a scalar kernel and records a [`ScalarBackward`].
fn scalar_op<K: UnaryKernel>(x: &Tensor, k: K, grad: ScalarGrad) -> Result<Tensor> {
    let out = unary_map(x, &k)?;
    Ok(attach(
        out,
        &[x],
        ScalarBackward {
            name: K::NAME,
            grad,
        },
    ))
}

impl Tensor {
    /// `self + s`. Saves nothing for backward.
    pub fn add_scalar(&self, s: f64) -> Result<Tensor> {
        scalar_op(self, AddScalarK(s), ScalarGrad::Identity)
    }

    /// `self - s`. Saves nothing for backward.
    pub fn sub_scalar(&self, s: f64) -> Result<Tensor> {
        scalar_op(self, SubScalarK(s), ScalarGrad::Identity)
    }

    /// `self * s`. Saves nothing for backward (but the scalar).
    pub fn mul_scalar(&self, s: f64) -> Result<Tensor> {
        scalar_op(self, MulScalarK(s), ScalarGrad::Mul(s))
    }

    /// `self / s`. Saves nothing for backward (but the scalar).
    pub fn div_scalar(&self, s: f64) -> Result<Tensor> {
        scalar_op(self, DivScalarK(s), ScalarGrad::Div(s))
    }

    /// `s - self`. Saves nothing for backward.
    pub fn scalar_sub(&self, s: f64) -> Result<Tensor> {
        scalar_op(self, ScalarSubK(s), ScalarGrad::Mul(-1.0))
    }

    /// `self += s` in place on a contiguous float tensor. Not
    /// differentiable: refused on a tensor that requires grad while grad
    /// mode is on. Bumps the version.
    pub fn add_scalar_(&self, s: f64) -> Result<()> {
        scalar_assign(self, &AddScalarK(s))
    }

    /// `self *= s` in place (see [`Tensor::add_scalar_`]).
    pub fn mul_scalar_(&self, s: f64) -> Result<()> {
        scalar_assign(self, &MulScalarK(s))
    }

    /// Each element limited to `[min, max]` (NaN passes through); the
    /// gradient is 1 where `min <= x <= max` and 0 elsewhere. `min > max`
    /// or a NaN bound is an error. Saves a 1-bit packed mask of where the
    /// input was inside the bounds (4·⌈n/32⌉ bytes).
    pub fn clamp(&self, min: f64, max: f64) -> Result<Tensor> {
        if min.is_nan() || max.is_nan() || min > max {
            return Err(Error::InvalidArgument {
                op: "clamp",
                msg: format!("bounds [{min}, {max}] are not an interval"),
            });
        }
        let out = unary_map(self, &ClampK(min, max))?;
        let [needs] = needs_grad([self]);
        if !needs {
            return Ok(out);
        }
        let op = ClampBackward {
            inside: SavedMask::new(self, MaskRule::Within(min, max), "clamp")?,
        };
        Ok(attach(out, &[self], op))
    }

    /// Elementwise maximum with broadcasting (NaN propagates); on a tie each
    /// input gets half the gradient. Saves both inputs when either needs grad.
    pub fn maximum(&self, rhs: &Tensor) -> Result<Tensor> {
        self.elementwise_extremum(rhs, true)
    }

    /// Elementwise minimum with broadcasting (see [`Tensor::maximum`]).
    /// Saves both inputs when either needs grad.
    pub fn minimum(&self, rhs: &Tensor) -> Result<Tensor> {
        self.elementwise_extremum(rhs, false)
    }

    fn elementwise_extremum(&self, rhs: &Tensor, is_max: bool) -> Result<Tensor> {
        let name = if is_max { "maximum" } else { "minimum" };
        let out = binary_map(self, rhs, &ExtremumK(is_max))?;
        let needs = needs_grad([self, rhs]);
        if !(needs[0] || needs[1]) {
            return Ok(out);
        }
        let op = ExtremumBackward {
            name,
            is_max,
            a: SavedTensor::new(self, name),
            b: SavedTensor::new(rhs, name),
            shapes: [self.shape().to_vec(), rhs.shape().to_vec()],
            needs,
        };
        Ok(attach(out, &[self, rhs], op))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every kernel of this file has its CUDA form: the scalar ops, clamp,
    /// maximum/minimum and the share their backward splits the gradient by.
    #[test]
    fn every_kernel_has_its_cuda_form() {
        let unary = [
            (AddScalarK(2.0).cuda(), UnaryOp::AddScalar(2.0)),
            (SubScalarK(2.0).cuda(), UnaryOp::AddScalar(-2.0)),
            (MulScalarK(2.0).cuda(), UnaryOp::MulScalar(2.0)),
            (DivScalarK(2.0).cuda(), UnaryOp::DivScalar(2.0)),
            (ScalarSubK(2.0).cuda(), UnaryOp::RSubScalar(2.0)),
            (ClampK(-1.0, 3.0).cuda(), UnaryOp::Clamp(-1.0, 3.0)),
        ];
        for (got, want) in unary {
            assert_eq!(got, Some(want));
        }
        let binary = [
            (ExtremumK(true).cuda(), BinaryOp::Max),
            (ExtremumK(false).cuda(), BinaryOp::Min),
            (ShareK(true).cuda(), BinaryOp::MaxShare),
            (ShareK(false).cuda(), BinaryOp::MinShare),
        ];
        for (got, want) in binary {
            assert_eq!(got, Some(want));
        }
    }

    /// The CPU semantics the CUDA forms reproduce: NaN propagates through
    /// maximum/minimum, passes through clamp, and gets no gradient share.
    #[test]
    fn nan_semantics_on_the_cpu() {
        let nan = f32::NAN;
        assert!(ExtremumK(true).f(nan, 1.0f32).is_nan());
        assert!(ExtremumK(false).f(1.0f32, nan).is_nan());
        assert!(ClampK(0.0, 1.0).f(nan).is_nan());
        assert_eq!(ClampK(0.0, 1.0).f(-2.0f32), 0.0);
        assert_eq!(ShareK(true).f(nan, 1.0f32), 0.0);
        assert_eq!(ShareK(true).f(2.0f32, 2.0), 0.5);
        // Ties between -0 and +0: maximum keeps a, minimum keeps b.
        assert!(ExtremumK(true).f(-0.0f32, 0.0).is_sign_negative());
        assert!(ExtremumK(false).f(-0.0f32, 0.0).is_sign_positive());
    }
}
