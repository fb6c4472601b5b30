//! Softmax and log-softmax along one dim, numerically stable: the lane
//! maximum is subtracted, and the work is done in f64 on the CPU (in f32,
//! f64 for f64, on CUDA: `softmax.cu`). A tensor is viewed as `[outer, len,
//! inner]` around the dim; cross-entropy (`ops::loss`) reads logits the
//! same way and shares the lane helpers re-exported here.
//!
//! Saved for backward, for `n` elements of `b` bytes:
//!
//! | op | requires grad | saved for backward | why |
//! |---|---|---|---|
//! | `softmax` | input | the output `y`: `n·b` bytes, the tensor returned to the caller (no extra bytes while the caller holds it) | the gradient `y·(g − Σ g·y)` reads only `y` |
//! | `log_softmax` | input | the output `y`: `n·b` bytes, as above | the gradient `g − exp(y)·Σ g` reads only `y` |
//! | either | nothing | — (no node) | |
//!
//! The same under both save policies (PyTorch keeps the output too).

mod cpu;
mod cuda;

// The lanes around a dim, shared with cross-entropy's kernels.
pub(crate) use cpu::{for_blocks, lane_stats, split};
pub(crate) use cuda::lanes;

use super::expect_float;
use crate::autograd::{attach, needs_grad, BackwardOp, SavedTensor};
use crate::meta::{backend, Backend};
use crate::tensor::resolve_dim;
use crate::{Error, Result, Tensor};

// The dispatch seam: one small function per kernel, the only place here
// (besides cuda.rs) that names CUDA.

/// Softmax (or log-softmax when `log`) of `x` along `dim`: a new contiguous
/// tensor of `x`'s shape and dtype.
fn softmax_forward(x: &Tensor, dim: usize, log: bool) -> Result<Tensor> {
    match backend("softmax", &[x])? {
        Backend::Cpu | Backend::Meta => cpu::forward(x, dim, log),
        Backend::Cuda(_) => cuda::forward(x, dim, log),
    }
}

/// The gradient of softmax (`log == false`) or log-softmax along `dim` from
/// the op's output `y` and the output gradient `g` (same shape and dtype).
fn softmax_backward(y: &Tensor, g: &Tensor, dim: usize, log: bool) -> Result<Tensor> {
    if y.shape() != g.shape() {
        return Err(Error::ShapeMismatch {
            op: "softmax_backward",
            lhs: y.shape().to_vec(),
            rhs: g.shape().to_vec(),
        });
    }
    match backend("softmax_backward", &[y, g])? {
        Backend::Cpu | Backend::Meta => cpu::backward(y, g, dim, log),
        Backend::Cuda(_) => cuda::backward(y, g, dim, log),
    }
}

/// Backward of softmax and log_softmax: saves only the op's output `y`
/// (the tensor returned to the caller, so it costs no extra bytes), from
/// which `y·(g − Σ g·y)` or `g − exp(y)·Σ g` follow.
struct SoftmaxBackward {
    dim: usize,
    log: bool,
    output: SavedTensor,
}

impl BackwardOp for SoftmaxBackward {
    fn name(&self) -> &'static str {
        if self.log {
            "log_softmax"
        } else {
            "softmax"
        }
    }
    fn backward(self: Box<Self>, g: Tensor) -> Result<Vec<Option<Tensor>>> {
        let grad = softmax_backward(self.output.get()?, &g, self.dim, self.log)?;
        Ok(vec![Some(grad)])
    }
}

impl Tensor {
    fn softmax_impl(&self, op: &'static str, dim: isize, log: bool) -> Result<Tensor> {
        expect_float(op, self)?;
        let d = resolve_dim(op, dim, self.rank())?;
        let out = softmax_forward(self, d, log)?;
        if !needs_grad([self])[0] {
            return Ok(out);
        }
        let op = SoftmaxBackward {
            dim: d,
            log,
            output: SavedTensor::new(&out, op),
        };
        Ok(attach(out, &[self], op))
    }

    /// `exp(x) / Σ exp(x)` along `dim`, computed stably in f64. Saves only
    /// its output for backward.
    pub fn softmax(&self, dim: isize) -> Result<Tensor> {
        self.softmax_impl("softmax", dim, false)
    }

    /// `x − log Σ exp(x)` along `dim`, computed stably in f64. Saves only
    /// its output for backward.
    pub fn log_softmax(&self, dim: isize) -> Result<Tensor> {
        self.softmax_impl("log_softmax", dim, true)
    }
}
