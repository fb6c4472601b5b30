//! Tensor ops. Each file holds one op family: its public API on [`Tensor`],
//! the backward structs with their typed saved state, and the calls into the
//! shared primitives. What each op saves for backward (`n` elements of `s`
//! bytes; `⌈n/32⌉·4` bytes is a 1-bit packed mask; nothing at all is
//! recorded when no input requires grad):
//!
//! | op | saved, and when | bytes |
//! |---|---|---|
//! | add, sub, neg, add/sub/mul/div_scalar, scalar_sub | nothing | 0 |
//! | mul(a, b) | `b` if a needs grad; `a` if b needs grad | n·s per saved input |
//! | div(a, b) | `b` if either needs grad; `a` if b needs grad | n·s per saved input |
//! | maximum, minimum | both inputs (the comparison decides either gradient) | both inputs |
//! | exp, sqrt, recip, tanh, sigmoid | the output | n·s |
//! | log, abs, square, sin, cos, gelu, silu, hardswish, hardsigmoid, mish, powf | the input (`gelu_owned` on the CPU: gelu'(x), written over the input) | n·s |
//! | relu, leaky_relu | 1-bit mask of `x > 0` (neither input nor output) | ⌈n/32⌉·4 |
//! | clamp | 1-bit mask of `min ≤ x ≤ max` | ⌈n/32⌉·4 |
//! | where_cond(c, a, b) | the u8 condition, if a or b needs grad | n |
//! | to_dtype, to_dtype_owned (float→float) | nothing | 0 |
//! | the casts autocast inserts ([`autocast`]) | nothing (the op after them saves what its table says, in their dtype) | 0 |
//! | reshape, flatten, (un)squeeze, permute, transpose, narrow, broadcast_to, contiguous | shapes only | 0 |
//! | cat, stack, chunk, split | sizes along the dim only | 0 |
//! | index_select, gather | the index tensor, if the source needs grad | index bytes |
//! | scatter_add(self, index, src) | the index, if src needs grad | index bytes |
//! | matmul(a, b) | `b` if a needs grad; `a` if b needs grad (views, no copies) | per saved input |
//! | sum, mean, sum_all, mean_all | shapes only | 0 |
//! | max, min (over a dim) | the arg-extremum per output element as u8 (dim ≤ 256), u32 (≤ 2³²) or i64 | out elements × 1/4/8 |
//! | softmax, log_softmax | the output | n·s |
//! | cross_entropy | the softmax probabilities (none while another op keeps the logits) and the targets tensor (shared, not copied), if the logits need grad | N·C·s or 0 (+ targets) |
//! | linear_cross_entropy(h, W, b) | h and the targets (shared), if any input needs grad; no logits | N·D·s (+ targets) |
//! | mse_loss(a, b) | the difference a − b, if either needs grad | n·s |
//! | silu_mul(gate, up) | `gate`, and `up` if gate needs grad (not `silu(gate)`: backward recomputes it) | n·s per saved input |
//!
//! Backward never materialises a zero-filled stand-in for an input that
//! needs no grad: it returns `None`, and the engine skips the edge.

pub(crate) mod autocast;
mod binary;
mod cast;
mod compare;
mod concat;
mod gated;
mod index;
mod loss;
mod mask;
mod matmul;
mod reduce;
mod scalar;
mod softmax;
mod unary;
mod view;

pub use autocast::{autocast, autocast_disabled, autocast_dtype};
pub use loss::{CrossEntropyOptions, Reduction, CHUNK_ELEMENTS};
pub use mask::{mask_scale, mask_where, positive_mask};
pub use softmax::LaneGeom;
pub(crate) use unary::relu_applied_in_place;
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
