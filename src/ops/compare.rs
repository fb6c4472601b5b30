//! Comparisons into U8 masks (1/0, not differentiable) for every dtype, and
//! `where_cond`, which selects by such a mask and is differentiable.

use super::sum_to_shape;
use crate::autograd::{attach, needs_grad, BackwardOp, SavedTensor};
use crate::primitives::{compare_map, compare_scalar, select, CmpOp};
use crate::{Result, Tensor};

/// Backward of where_cond: saves only the U8 condition (and the input
/// shapes, to undo broadcasting).
struct WhereBackward {
    cond: SavedTensor,
    shapes: [Vec<usize>; 2],
    needs: [bool; 2],
}

impl BackwardOp for WhereBackward {
    fn name(&self) -> &'static str {
        "where_cond"
    }
    fn backward(self: Box<Self>, g: Tensor) -> Result<Vec<Option<Tensor>>> {
        let cond = self.cond.get()?;
        let zero = Tensor::zeros(&[], g.dtype(), g.device())?;
        let ga = match self.needs[0] {
            true => Some(sum_to_shape(&select(cond, &g, &zero)?, &self.shapes[0])?),
            false => None,
        };
        let gb = match self.needs[1] {
            true => Some(sum_to_shape(&select(cond, &zero, &g)?, &self.shapes[1])?),
            false => None,
        };
        Ok(vec![ga, gb])
    }
}

macro_rules! compare_methods {
    ($($name:ident, $scalar:ident, $op:ident, $doc:literal;)*) => {
        impl Tensor {
            $(
                #[doc = concat!("`self ", $doc, " rhs` elementwise with broadcasting, as a U8 mask of 1/0.")]
                #[doc = ""]
                #[doc = "Any dtype (both the same). Not differentiable; saves nothing."]
                pub fn $name(&self, rhs: &Tensor) -> Result<Tensor> {
                    compare_map(self, rhs, CmpOp::$op)
                }

                #[doc = concat!("`self ", $doc, " s` elementwise, as a U8 mask of 1/0.")]
                #[doc = ""]
                #[doc = "Any dtype; compared in f64. Not differentiable; saves nothing."]
                pub fn $scalar(&self, s: f64) -> Result<Tensor> {
                    compare_scalar(self, s, CmpOp::$op)
                }
            )*
        }
    };
}

compare_methods! {
    eq, eq_scalar, Eq, "==";
    ne, ne_scalar, Ne, "!=";
    lt, lt_scalar, Lt, "<";
    le, le_scalar, Le, "<=";
    gt, gt_scalar, Gt, ">";
    ge, ge_scalar, Ge, ">=";
}

impl Tensor {
    /// `a` where `cond` (U8) is nonzero, else `b`, with broadcasting of all
    /// three; `a` and `b` share a dtype (any), which the result has.
    /// Differentiable in `a` and `b`: saves only `cond`, and only when `a`
    /// or `b` needs grad.
    pub fn where_cond(cond: &Tensor, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        let out = select(cond, a, b)?;
        let needs = needs_grad([a, b]);
        if !(needs[0] || needs[1]) {
            return Ok(out);
        }
        let op = WhereBackward {
            cond: SavedTensor::new(cond, "where_cond"),
            shapes: [a.shape().to_vec(), b.shape().to_vec()],
            needs,
        };
        Ok(attach(out, &[a, b], op))
    }
}
