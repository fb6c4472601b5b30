//! Elementwise binary ops with broadcasting: add, sub, mul, div.

use super::autocast::{promote_all, promoted};
use super::check_in_place;
use super::sum_to_shape;
use crate::autograd::{attach, may_reuse, needs_grad, BackwardOp, SavedTensor};
use crate::op_code::BinaryOp;
use crate::primitives::{binary_assign, binary_map, AddK, BinaryKernel};
use crate::{FloatDType, Result, Tensor};

macro_rules! kernel {
    ($name:ident, $s:literal, $cuda:ident, |$a:ident, $b:ident| $e:expr) => {
        pub(crate) struct $name;
        impl BinaryKernel for $name {
            const NAME: &'static str = $s;
            fn f<T: FloatDType>(&self, $a: T, $b: T) -> T {
                $e
            }
            fn cuda(&self) -> Option<BinaryOp> {
                Some(BinaryOp::$cuda)
            }
        }
    };
}
kernel!(SubK, "sub", Sub, |a, b| a - b);
kernel!(MulK, "mul", Mul, |a, b| a * b);
kernel!(DivK, "div", Div, |a, b| a / b);

/// Shapes of both inputs, to reduce broadcast gradients back.
struct Shapes {
    a: Vec<usize>,
    b: Vec<usize>,
}

impl Shapes {
    fn of(a: &Tensor, b: &Tensor) -> Shapes {
        Shapes {
            a: a.shape().to_vec(),
            b: b.shape().to_vec(),
        }
    }
}

/// Backward of add: saves nothing.
struct AddBackward {
    shapes: Shapes,
    needs: [bool; 2],
}

impl BackwardOp for AddBackward {
    fn name(&self) -> &'static str {
        "add"
    }
    fn backward(self: Box<Self>, g: Tensor) -> Result<Vec<Option<Tensor>>> {
        let ga = self.needs[0]
            .then(|| sum_to_shape(&g, &self.shapes.a))
            .transpose()?;
        let gb = self.needs[1]
            .then(|| sum_to_shape(&g, &self.shapes.b))
            .transpose()?;
        Ok(vec![ga, gb])
    }
}

/// Backward of sub: saves nothing.
struct SubBackward {
    shapes: Shapes,
    needs: [bool; 2],
}

impl BackwardOp for SubBackward {
    fn name(&self) -> &'static str {
        "sub"
    }
    fn backward(self: Box<Self>, g: Tensor) -> Result<Vec<Option<Tensor>>> {
        let ga = self.needs[0]
            .then(|| sum_to_shape(&g, &self.shapes.a))
            .transpose()?;
        let gb = self.needs[1]
            .then(|| sum_to_shape(&g, &self.shapes.b)?.neg())
            .transpose()?;
        Ok(vec![ga, gb])
    }
}

/// Backward of mul: saves `b` only if `a` needs grad and `a` only if `b` does.
struct MulBackward {
    shapes: Shapes,
    needs: [bool; 2],
    a: Option<SavedTensor>,
    b: Option<SavedTensor>,
}

impl BackwardOp for MulBackward {
    fn name(&self) -> &'static str {
        "mul"
    }
    fn backward(self: Box<Self>, g: Tensor) -> Result<Vec<Option<Tensor>>> {
        let product_to = |other: &SavedTensor, shape: &[usize]| -> Result<Tensor> {
            sum_to_shape(&binary_map(&g, other.get()?, &MulK)?, shape)
        };
        let ga = match (&self.b, self.needs[0]) {
            (Some(b), true) => Some(product_to(b, &self.shapes.a)?),
            _ => None,
        };
        let gb = match (&self.a, self.needs[1]) {
            (Some(a), true) => Some(product_to(a, &self.shapes.b)?),
            _ => None,
        };
        Ok(vec![ga, gb])
    }
}

/// Backward of div: saves `b` if either input needs grad, and `a` only if `b` does.
struct DivBackward {
    shapes: Shapes,
    needs: [bool; 2],
    a: Option<SavedTensor>,
    b: SavedTensor,
}

impl BackwardOp for DivBackward {
    fn name(&self) -> &'static str {
        "div"
    }
    fn backward(self: Box<Self>, g: Tensor) -> Result<Vec<Option<Tensor>>> {
        let b = self.b.get()?;
        let g_over_b = binary_map(&g, b, &DivK)?;
        drop(g);
        let gb = match (&self.a, self.needs[1]) {
            // d(a/b)/db = -a/b^2 = -(g/b)·a/b
            (Some(a), true) => {
                let t = binary_map(&binary_map(&g_over_b, a.get()?, &MulK)?, b, &DivK)?;
                Some(sum_to_shape(&t, &self.shapes.b)?.neg()?)
            }
            _ => None,
        };
        let ga = self.needs[0]
            .then(|| sum_to_shape(&g_over_b, &self.shapes.a))
            .transpose()?;
        Ok(vec![ga, gb])
    }
}

/// Under autocast, both operands in their promoted float dtype (autocast's
/// promote list, as `cat`): `None` when no cast is due.
fn promote_pair(a: &Tensor, b: &Tensor) -> Result<Option<[Tensor; 2]>> {
    Ok(promote_all(&[a, b])?.and_then(|v| <[Tensor; 2]>::try_from(v).ok()))
}

impl Tensor {
    /// `self + rhs` with broadcasting (under autocast, floats of two dtypes
    /// are promoted to the wider). Saves nothing for backward.
    pub fn add(&self, rhs: &Tensor) -> Result<Tensor> {
        if let Some([a, b]) = promote_pair(self, rhs)? {
            return a.add(&b);
        }
        let out = binary_map(self, rhs, &AddK)?;
        let needs = needs_grad([self, rhs]);
        let op = AddBackward {
            shapes: Shapes::of(self, rhs),
            needs,
        };
        Ok(attach(out, &[self, rhs], op))
    }

    /// `self + rhs` (`rhs` broadcasting to `self`'s shape) for a `self` the
    /// caller hands over: the sum is written over `self`'s storage when
    /// buffer reuse is on and nothing else holds `self`
    /// ([`crate::autograd::may_reuse`]), else it is [`Tensor::add`]. The
    /// same values and gradients either way (a residual connection's add).
    /// Saves nothing for backward.
    pub fn add_owned(self, rhs: &Tensor) -> Result<Tensor> {
        if promoted(self.dtype(), rhs.dtype()) == Some(self.dtype()) {
            // A wider `self` (an f32 residual stream plus a bf16 branch
            // under autocast) keeps its buffer: only `rhs` is cast.
            let rhs = rhs.to_dtype(self.dtype())?;
            return self.add_owned(&rhs);
        }
        let fits = self.dtype() == rhs.dtype()
            && self.device() == rhs.device()
            && crate::tensor::broadcast_shapes("add", self.shape(), rhs.shape())
                .is_ok_and(|s| s == self.shape());
        if !(fits && may_reuse(&self)) {
            return self.add(rhs);
        }
        binary_assign(&self, rhs, &AddK)?;
        let needs = needs_grad([&self, rhs]);
        let op = AddBackward {
            shapes: Shapes::of(&self, rhs),
            needs,
        };
        Ok(attach(self.detach(), &[&self, rhs], op))
    }

    /// `relu(self + rhs)` on an owned `self`, as
    /// `self.add_owned(rhs)?.relu_inplace()` (the same values, nodes and
    /// saved mask) and in one kernel where the device has one (CUDA under
    /// the lean policy: `self` written over, when both would run in place
    /// and the result needs grad). Saves only ReLU's 1-bit mask of the
    /// result's positives; the add saves nothing.
    pub fn add_relu_owned(self, rhs: &Tensor) -> Result<Tensor> {
        let whole =
            rhs.is_contiguous() && rhs.layout().offset() == 0 && rhs.numel() == rhs.storage().len();
        let needs = needs_grad([&self, rhs]);
        let fused = self.dtype() == rhs.dtype()
            && self.shape() == rhs.shape()
            && whole
            && needs.contains(&true)
            && may_reuse(&self)
            && !self.shares_storage_with(rhs);
        if fused {
            if let Some(bits) = crate::ops::mask::add_relu_with_mask(&self, rhs)? {
                let op = AddBackward {
                    shapes: Shapes::of(&self, rhs),
                    needs,
                };
                let sum = attach(self.detach(), &[&self, rhs], op);
                return crate::ops::relu_applied_in_place(sum, || Ok(bits));
            }
        }
        self.add_owned(rhs)?.relu_inplace()
    }

    /// `self - rhs` with broadcasting (promoting as [`Tensor::add`]). Saves
    /// nothing for backward.
    pub fn sub(&self, rhs: &Tensor) -> Result<Tensor> {
        if let Some([a, b]) = promote_pair(self, rhs)? {
            return a.sub(&b);
        }
        let out = binary_map(self, rhs, &SubK)?;
        let needs = needs_grad([self, rhs]);
        let op = SubBackward {
            shapes: Shapes::of(self, rhs),
            needs,
        };
        Ok(attach(out, &[self, rhs], op))
    }

    /// `self * rhs` with broadcasting (promoting as [`Tensor::add`]). Saves `rhs` only when `self` needs
    /// grad, and `self` only when `rhs` does, under both policies: PyTorch's autograd guards each
    /// saved operand of `mul` by whether the other input needs grad, and keeps the same.
    pub fn mul(&self, rhs: &Tensor) -> Result<Tensor> {
        if let Some([a, b]) = promote_pair(self, rhs)? {
            return a.mul(&b);
        }
        let out = binary_map(self, rhs, &MulK)?;
        let [na, nb] = needs_grad([self, rhs]);
        if !(na || nb) {
            return Ok(out);
        }
        let op = MulBackward {
            shapes: Shapes::of(self, rhs),
            needs: [na, nb],
            a: nb.then(|| SavedTensor::new(self, "mul")),
            b: na.then(|| SavedTensor::new(rhs, "mul")),
        };
        Ok(attach(out, &[self, rhs], op))
    }

    /// `self / rhs` with broadcasting (promoting as [`Tensor::add`]). Saves `rhs` when either needs grad,
    /// and `self` only when `rhs` does, under both policies (as PyTorch's autograd does).
    pub fn div(&self, rhs: &Tensor) -> Result<Tensor> {
        if let Some([a, b]) = promote_pair(self, rhs)? {
            return a.div(&b);
        }
        let out = binary_map(self, rhs, &DivK)?;
        let needs = needs_grad([self, rhs]);
        if !(needs[0] || needs[1]) {
            return Ok(out);
        }
        let op = DivBackward {
            shapes: Shapes::of(self, rhs),
            needs,
            a: needs[1].then(|| SavedTensor::new(self, "div")),
            b: SavedTensor::new(rhs, "div"),
        };
        Ok(attach(out, &[self, rhs], op))
    }

    /// `self += rhs` in place (rhs broadcasts). Not differentiable: refused
    /// on a tensor that requires grad while grad mode is on. Bumps the version.
    pub fn add_(&self, rhs: &Tensor) -> Result<()> {
        check_in_place("add_", self)?;
        binary_assign(self, rhs, &AddK)
    }

    /// `self -= rhs` in place (see [`Tensor::add_`]).
    pub fn sub_(&self, rhs: &Tensor) -> Result<()> {
        check_in_place("sub_", self)?;
        binary_assign(self, rhs, &SubK)
    }

    /// `self *= rhs` in place (see [`Tensor::add_`]).
    pub fn mul_(&self, rhs: &Tensor) -> Result<()> {
        check_in_place("mul_", self)?;
        binary_assign(self, rhs, &MulK)
    }

    /// `self /= rhs` in place (see [`Tensor::add_`]).
    pub fn div_(&self, rhs: &Tensor) -> Result<()> {
        check_in_place("div_", self)?;
        binary_assign(self, rhs, &DivK)
    }
}
