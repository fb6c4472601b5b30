//! Dtype conversion.

use crate::autograd::{attach, BackwardOp};
use crate::primitives::cast;
use crate::{DType, Result, Tensor};

/// Backward of a float-to-float cast: casts the gradient back to the input
/// dtype. Saves nothing but that dtype.
struct CastBackward {
    input_dtype: DType,
}

impl BackwardOp for CastBackward {
    fn name(&self) -> &'static str {
        "to_dtype"
    }
    fn backward(self: Box<Self>, g: Tensor) -> Result<Vec<Option<Tensor>>> {
        let g = if g.dtype() == self.input_dtype {
            g
        } else {
            cast(&g, self.input_dtype)?
        };
        Ok(vec![Some(g)])
    }
}

impl Tensor {
    /// The elements converted to `dtype`, between any two dtypes (as Rust's
    /// `as` converts through f64: float to integer truncates and saturates,
    /// NaN becomes 0). The same dtype returns a clone sharing storage.
    /// Float to float is differentiable (the gradient is cast back; saves
    /// nothing); a non-float result never requires grad.
    pub fn to_dtype(&self, dtype: DType) -> Result<Tensor> {
        if dtype == self.dtype() {
            return Ok(self.clone());
        }
        let out = cast(self, dtype)?;
        if !(dtype.is_float() && self.dtype().is_float()) {
            return Ok(out);
        }
        let op = CastBackward {
            input_dtype: self.dtype(),
        };
        Ok(attach(out, &[self], op))
    }
}
