//! Softmax and log-softmax along one dim (numerically stable: the lane
//! maximum is subtracted, and the work is done in f64).

use super::expect_float;
use crate::autograd::{attach, needs_grad, BackwardOp, SavedTensor};
use crate::primitives::{softmax_backward, softmax_forward};
use crate::tensor::resolve_dim;
use crate::{Result, Tensor};

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
