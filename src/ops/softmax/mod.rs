//! Softmax and log-softmax along one dim, numerically stable: the lane
//! maximum is subtracted, and the work is done in f64 on the CPU (in f32,
//! f64 for f64, on CUDA: `softmax.cu`). A tensor is viewed as `[outer,
//! classes, inner]` around the dim (the family's one geometry, [`LaneGeom`],
//! passed by value to the kernels); cross-entropy (`ops::loss`) reads logits
//! the same way and shares the geometry and the lane helpers.
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
pub(crate) use cpu::{for_blocks, lane_stats};
pub(crate) use cuda::lanes;

use super::autocast::{widen, widens};
use super::expect_float;
use crate::autograd::{attach, needs_grad, BackwardOp, SavedTensor};
use crate::meta::{backend, Backend};
use crate::tensor::resolve_dim;
use crate::{Error, Result, Tensor};

/// The geometry of a softmax (and of cross-entropy's logits): a contiguous
/// tensor viewed as `[outer, classes, inner]` around the class dim, element
/// `(o, c, j)` at `(o·classes + c)·inner + j`. Each of the `outer·inner`
/// lanes is one softmax over `classes` elements strided by `inner`.
///
/// Shared by the CPU kernels, the CUDA launches and, as a `#[repr(C)]`
/// struct passed by value, the kernels (`struct LaneGeom` in `softmax.cu`
/// and `loss.cu`: its `usize` fields are `long long`s there).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaneGeom {
    /// Product of the sizes before the class dim.
    pub outer: usize,
    /// Size of the class dim.
    pub classes: usize,
    /// Product of the sizes after the class dim (the lane stride).
    pub inner: usize,
}

impl LaneGeom {
    /// The lanes of `shape` around `dim` (which must be below its rank).
    pub fn around(shape: &[usize], dim: usize) -> LaneGeom {
        LaneGeom {
            outer: shape[..dim].iter().product(),
            classes: shape[dim],
            inner: shape[dim + 1..].iter().product(),
        }
    }

    /// How many lanes (softmaxes, or samples of cross-entropy).
    pub fn lanes(&self) -> usize {
        self.outer * self.inner
    }

    /// Elements in one outer block (`classes·inner`).
    pub fn block(&self) -> usize {
        self.classes * self.inner
    }
}

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
        if widens(self) {
            return widen(self)?.softmax_impl(op, dim, log);
        }
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

    /// `exp(x) / Σ exp(x)` along `dim`, computed stably in f64 (in f32
    /// under [`crate::autocast`]). Saves only its output for backward.
    pub fn softmax(&self, dim: isize) -> Result<Tensor> {
        self.softmax_impl("softmax", dim, false)
    }

    /// `x − log Σ exp(x)` along `dim`, computed stably in f64 (in f32
    /// under [`crate::autocast`]). Saves only its output for backward.
    pub fn log_softmax(&self, dim: isize) -> Result<Tensor> {
        self.softmax_impl("log_softmax", dim, true)
    }
}
