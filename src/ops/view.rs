//! Views that share storage: reshape, permute/transpose, narrow, broadcast,
//! (un)squeeze; and `contiguous`, which copies only when it must.

use crate::autograd::{attach, BackwardOp};
use crate::primitives::{reduce_to, ReduceKind};
use crate::tensor::{resolve_dim, Layout};
use crate::{Error, Result, Tensor};

/// Sums a (broadcast) gradient back to `shape`: the backward of broadcasting.
/// Returns `grad` itself, with no copy, when the shapes already agree.
pub fn sum_to_shape(grad: &Tensor, shape: &[usize]) -> Result<Tensor> {
    if grad.shape() == shape {
        return Ok(grad.clone());
    }
    let rank = grad.rank();
    if shape.len() > rank {
        return Err(Error::ShapeMismatch {
            op: "sum_to_shape",
            lhs: grad.shape().to_vec(),
            rhs: shape.to_vec(),
        });
    }
    let mut keep = vec![1; rank - shape.len()];
    keep.extend_from_slice(shape);
    let reduced = reduce_to(grad, &keep, ReduceKind::Sum)?;
    Ok(reduced.view_with_layout(Layout::contiguous(shape)))
}

/// Backward of reshape/flatten/(un)squeeze: saves only the input shape.
struct ReshapeBackward {
    input_shape: Vec<usize>,
}

impl BackwardOp for ReshapeBackward {
    fn name(&self) -> &'static str {
        "reshape"
    }
    fn backward(self: Box<Self>, g: Tensor) -> Result<Vec<Option<Tensor>>> {
        Ok(vec![Some(g.reshape(&self.input_shape)?)])
    }
}

/// Backward of permute: saves only the permutation.
struct PermuteBackward {
    dims: Vec<usize>,
}

impl BackwardOp for PermuteBackward {
    fn name(&self) -> &'static str {
        "permute"
    }
    fn backward(self: Box<Self>, g: Tensor) -> Result<Vec<Option<Tensor>>> {
        let mut inverse = vec![0; self.dims.len()];
        for (i, &d) in self.dims.iter().enumerate() {
            inverse[d] = i;
        }
        Ok(vec![Some(g.permute(&inverse)?)])
    }
}

/// Backward of narrow: saves the input shape and the range.
struct NarrowBackward {
    input_shape: Vec<usize>,
    dim: usize,
    start: usize,
}

impl BackwardOp for NarrowBackward {
    fn name(&self) -> &'static str {
        "narrow"
    }
    fn backward(self: Box<Self>, g: Tensor) -> Result<Vec<Option<Tensor>>> {
        let full = Tensor::zeros(&self.input_shape, g.dtype(), g.device())?;
        let window = full.view_with_layout(full.layout().narrow(
            self.dim,
            self.start,
            g.shape()[self.dim],
        )?);
        crate::primitives::copy_into(&window, &g)?;
        drop(window);
        Ok(vec![Some(full)])
    }
}

/// Backward of broadcast_to: saves only the input shape.
struct BroadcastBackward {
    input_shape: Vec<usize>,
}

impl BackwardOp for BroadcastBackward {
    fn name(&self) -> &'static str {
        "broadcast_to"
    }
    fn backward(self: Box<Self>, g: Tensor) -> Result<Vec<Option<Tensor>>> {
        Ok(vec![Some(sum_to_shape(&g, &self.input_shape)?)])
    }
}

/// Backward of contiguous: the identity, saves nothing.
struct IdentityBackward;

impl BackwardOp for IdentityBackward {
    fn name(&self) -> &'static str {
        "contiguous"
    }
    fn backward(self: Box<Self>, g: Tensor) -> Result<Vec<Option<Tensor>>> {
        Ok(vec![Some(g)])
    }
}

impl Tensor {
    /// The same elements in row-major order with the exact new `shape` (same
    /// element count, else an error). A view when contiguous, else a
    /// contiguous copy. Saves only the input shape.
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor> {
        if shape.iter().product::<usize>() != self.numel() {
            return Err(Error::ShapeMismatch {
                op: "reshape",
                lhs: self.shape().to_vec(),
                rhs: shape.to_vec(),
            });
        }
        let out = match self.layout().reshape_contiguous(shape) {
            Some(l) => self.view_with_layout(l),
            None => {
                let c = crate::primitives::contiguous_copy(self)?;
                c.view_with_layout(Layout::contiguous(shape))
            }
        };
        let op = ReshapeBackward {
            input_shape: self.shape().to_vec(),
        };
        Ok(attach(out, &[self], op))
    }

    /// Flattens dims `start..=end` (negative counts from the end) into one;
    /// a 0-d tensor becomes `[1]`. A [`Tensor::reshape`]: saves only the
    /// input shape.
    pub fn flatten(&self, start: isize, end: isize) -> Result<Tensor> {
        if self.rank() == 0 {
            return self.reshape(&[1]);
        }
        let s = resolve_dim("flatten", start, self.rank())?;
        let e = resolve_dim("flatten", end, self.rank())?;
        if s > e {
            return Err(Error::InvalidArgument {
                op: "flatten",
                msg: format!("start {start} is after end {end}"),
            });
        }
        let mut shape = self.shape()[..s].to_vec();
        shape.push(self.shape()[s..=e].iter().product());
        shape.extend_from_slice(&self.shape()[e + 1..]);
        self.reshape(&shape)
    }

    /// Inserts a dimension of size 1 at `dim` (in `-(rank+1)..=rank`).
    /// Always a view; saves only the input shape.
    pub fn unsqueeze(&self, dim: isize) -> Result<Tensor> {
        let d = resolve_dim("unsqueeze", dim, self.rank() + 1)?;
        let mut shape = self.shape().to_vec();
        shape.insert(d, 1);
        self.reshape_view(shape)
    }

    /// Removes dimension `dim`, which must have size 1. Always a view; saves
    /// only the input shape.
    pub fn squeeze(&self, dim: isize) -> Result<Tensor> {
        let d = resolve_dim("squeeze", dim, self.rank())?;
        if self.shape()[d] != 1 {
            return Err(Error::InvalidArgument {
                op: "squeeze",
                msg: format!("dim {d} has size {}", self.shape()[d]),
            });
        }
        let mut shape = self.shape().to_vec();
        shape.remove(d);
        self.reshape_view(shape)
    }

    /// Reshape that only drops/adds unit dims: always a view.
    fn reshape_view(&self, shape: Vec<usize>) -> Result<Tensor> {
        let (mut strides, l) = (Vec::with_capacity(shape.len()), self.layout());
        let mut src = l.shape().iter().zip(l.strides()).filter(|(&d, _)| d != 1);
        for &d in &shape {
            strides.push(if d == 1 {
                0
            } else {
                *src.next().map(|(_, s)| s).unwrap_or(&0)
            });
        }
        let out = self.view_with_layout(Layout::from_parts(shape, strides, l.offset()));
        let op = ReshapeBackward {
            input_shape: self.shape().to_vec(),
        };
        Ok(attach(out, &[self], op))
    }

    /// Reorders dimensions: output dim i is input dim `dims[i]`. A view;
    /// saves only the permutation.
    pub fn permute(&self, dims: &[usize]) -> Result<Tensor> {
        let out = self.view_with_layout(self.layout().permute(dims)?);
        let op = PermuteBackward {
            dims: dims.to_vec(),
        };
        Ok(attach(out, &[self], op))
    }

    /// Swaps two dimensions. A view; saves nothing but the permutation.
    pub fn transpose(&self, d0: isize, d1: isize) -> Result<Tensor> {
        let a = resolve_dim("transpose", d0, self.rank())?;
        let b = resolve_dim("transpose", d1, self.rank())?;
        let mut dims: Vec<usize> = (0..self.rank()).collect();
        dims.swap(a, b);
        self.permute(&dims)
    }

    /// The transpose of the last two dimensions (a view, as
    /// [`Tensor::transpose`]).
    pub fn t(&self) -> Result<Tensor> {
        self.transpose(-2, -1)
    }

    /// `len` elements of `dim` starting at `start`. A view; saves the range.
    pub fn narrow(&self, dim: isize, start: usize, len: usize) -> Result<Tensor> {
        let d = resolve_dim("narrow", dim, self.rank())?;
        let out = self.view_with_layout(self.layout().narrow(d, start, len)?);
        let op = NarrowBackward {
            input_shape: self.shape().to_vec(),
            dim: d,
            start,
        };
        Ok(attach(out, &[self], op))
    }

    /// A view broadcast to `shape` (no copy: stride 0). Saves the input shape.
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<Tensor> {
        let out = self.view_with_layout(self.layout().broadcast_to(shape)?);
        let op = BroadcastBackward {
            input_shape: self.shape().to_vec(),
        };
        Ok(attach(out, &[self], op))
    }

    /// This tensor when already contiguous, else a contiguous copy. Saves nothing.
    pub fn contiguous(&self) -> Result<Tensor> {
        if self.is_contiguous() {
            return Ok(self.clone());
        }
        let out = crate::primitives::contiguous_copy(self)?;
        Ok(attach(out, &[self], IdentityBackward))
    }
}
