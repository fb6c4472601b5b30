//! Dtype conversion.

use crate::autograd::{attach, may_reuse, BackwardOp};
use crate::primitives::{cast, cast_in_place};
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

    /// [`Tensor::to_dtype`] of a tensor handed over: between two dtypes of
    /// the same element size (F16 ⇄ BF16, F32 ⇄ U32, F64 ⇄ I64) the elements
    /// are converted where they are, in the same buffer, when buffer reuse
    /// may take it ([`crate::autograd::may_reuse`]: nothing else holds the
    /// tensor, a view of it or its storage, and it is not a leaf requiring
    /// grad). The cast's backward reads nothing but the input dtype, so this
    /// holds while a gradient flows too. Values, gradient and autograd node
    /// are `to_dtype`'s; only the allocation is saved. Otherwise (another
    /// size, a tensor held elsewhere, reuse off) it is `to_dtype`.
    pub fn to_dtype_owned(self, dtype: DType) -> Result<Tensor> {
        let from = self.dtype();
        if dtype == from {
            return Ok(self);
        }
        if dtype.size_in_bytes() != from.size_in_bytes() || !may_reuse(&self) {
            return self.to_dtype(dtype);
        }
        // The node is recorded while the input still reads as `from` (its
        // edge checks the gradient's dtype against it); then the input
        // handle goes, and the output is the storage's only holder.
        let mut out = if dtype.is_float() && from.is_float() {
            attach(self.detach(), &[&self], CastBackward { input_dtype: from })
        } else {
            self.detach()
        };
        drop(self);
        cast_in_place(&mut out, dtype)?;
        Ok(out)
    }
}
