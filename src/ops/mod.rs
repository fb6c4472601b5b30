//! Tensor ops. Each file holds one op family: its public API on [`Tensor`],
//! the backward structs with their typed saved state, and the calls into the
//! CPU kernels. What each op saves for backward is stated in its doc comment.

mod binary;
mod cast;
mod compare;
mod concat;
mod index;
mod loss;
mod mask;
mod matmul;
mod reduce;
mod scalar;
mod softmax;
mod unary;
mod view;

pub use loss::{CrossEntropyOptions, Reduction};
pub use mask::{mask_scale, mask_where, positive_mask};
pub use view::sum_to_shape;

use crate::{Error, Result, Tensor};

/// Checks that an op's input is a float tensor.
pub(crate) fn expect_float(op: &'static str, t: &Tensor) -> Result<()> {
    if t.dtype().is_float() {
        Ok(())
    } else {
        Err(Error::UnsupportedDType {
            op,
            dtype: t.dtype(),
        })
    }
}

/// Refuses an in-place change of a tensor autograd may still need.
pub(crate) fn check_in_place(op: &'static str, t: &Tensor) -> Result<()> {
    if crate::autograd::is_grad_enabled() && t.requires_grad() {
        return Err(Error::InPlaceOnRequiresGrad { op });
    }
    Ok(())
}
