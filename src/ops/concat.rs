//! Joining and splitting along a dimension: cat, stack, chunk, split.

use super::autocast::promote_all;
use crate::autograd::{attach, is_grad_enabled, BackwardOp};
use crate::tensor::resolve_dim;
use crate::{Error, Result, Tensor};

/// Which of a variable number of inputs need a gradient now.
fn needs_each(tensors: &[&Tensor]) -> Vec<bool> {
    let enabled = is_grad_enabled();
    tensors
        .iter()
        .map(|t| enabled && t.requires_grad())
        .collect()
}

/// Checks that `tensors` is non-empty and shares one dtype and device.
fn check_same_kind(op: &'static str, tensors: &[&Tensor]) -> Result<()> {
    let first = tensors.first().ok_or(Error::InvalidArgument {
        op,
        msg: "no tensors given".into(),
    })?;
    for t in &tensors[1..] {
        crate::primitives::check_pair(op, first, t)?;
    }
    Ok(())
}

/// Backward of cat: saves only each input's size along `dim`.
struct CatBackward {
    dim: usize,
    sizes: Vec<usize>,
    needs: Vec<bool>,
}

impl BackwardOp for CatBackward {
    fn name(&self) -> &'static str {
        "cat"
    }
    fn backward(self: Box<Self>, g: Tensor) -> Result<Vec<Option<Tensor>>> {
        let mut start = 0;
        let mut grads = Vec::with_capacity(self.sizes.len());
        for (&size, &need) in self.sizes.iter().zip(&self.needs) {
            grads.push(if need {
                Some(g.view_with_layout(g.layout().narrow(self.dim, start, size)?))
            } else {
                None
            });
            start += size;
        }
        Ok(grads)
    }
}

/// Backward of stack: saves nothing but which inputs need grad.
struct StackBackward {
    dim: usize,
    needs: Vec<bool>,
}

impl BackwardOp for StackBackward {
    fn name(&self) -> &'static str {
        "stack"
    }
    fn backward(self: Box<Self>, g: Tensor) -> Result<Vec<Option<Tensor>>> {
        let d = self.dim as isize;
        self.needs
            .iter()
            .enumerate()
            .map(|(i, &need)| {
                need.then(|| g.detach().narrow(d, i, 1)?.squeeze(d))
                    .transpose()
            })
            .collect()
    }
}

impl Tensor {
    /// Concatenates `tensors` along `dim` (negative counts from the end).
    /// All must share dtype (under [`crate::autocast`] floats of several
    /// dtypes are promoted to the widest), device and rank, and agree in
    /// every dimension but `dim`. Works for every dtype; the result is a new contiguous
    /// tensor. Saves only each input's size along `dim` (backward hands each
    /// input a narrowed view of the gradient).
    pub fn cat(tensors: &[&Tensor], dim: isize) -> Result<Tensor> {
        if let Some(same) = promote_all(tensors)? {
            return Tensor::cat(&same.iter().collect::<Vec<_>>(), dim);
        }
        check_same_kind("cat", tensors)?;
        let first = tensors[0];
        let d = resolve_dim("cat", dim, first.rank())?;
        let mut shape = first.shape().to_vec();
        shape[d] = 0;
        for t in tensors {
            let agrees = t.rank() == first.rank()
                && t.shape()
                    .iter()
                    .zip(first.shape())
                    .enumerate()
                    .all(|(i, (a, b))| i == d || a == b);
            if !agrees {
                return Err(Error::ShapeMismatch {
                    op: "cat",
                    lhs: first.shape().to_vec(),
                    rhs: t.shape().to_vec(),
                });
            }
            shape[d] += t.shape()[d];
        }
        let out = crate::primitives::cat(tensors, d, &shape)?;
        let needs = needs_each(tensors);
        if !needs.contains(&true) {
            return Ok(out);
        }
        let op = CatBackward {
            dim: d,
            sizes: tensors.iter().map(|t| t.shape()[d]).collect(),
            needs,
        };
        Ok(attach(out, tensors, op))
    }

    /// Stacks equally shaped `tensors` along a new dimension `dim` (in
    /// `-(rank+1)..=rank`). Works for every dtype; the result is a new
    /// contiguous tensor. Saves nothing (backward hands each input a view of
    /// its slice of the gradient).
    pub fn stack(tensors: &[&Tensor], dim: isize) -> Result<Tensor> {
        if let Some(same) = promote_all(tensors)? {
            return Tensor::stack(&same.iter().collect::<Vec<_>>(), dim);
        }
        check_same_kind("stack", tensors)?;
        let first = tensors[0];
        let d = resolve_dim("stack", dim, first.rank() + 1)?;
        if let Some(t) = tensors.iter().find(|t| t.shape() != first.shape()) {
            return Err(Error::ShapeMismatch {
                op: "stack",
                lhs: first.shape().to_vec(),
                rhs: t.shape().to_vec(),
            });
        }
        let mut shape = first.shape().to_vec();
        shape.insert(d, tensors.len());
        let out = {
            // Unit-dim views of the inputs, outside the graph.
            let views = tensors
                .iter()
                .map(|t| t.detach().unsqueeze(d as isize))
                .collect::<Result<Vec<_>>>()?;
            let refs: Vec<&Tensor> = views.iter().collect();
            crate::primitives::cat(&refs, d, &shape)?
        };
        let needs = needs_each(tensors);
        if !needs.contains(&true) {
            return Ok(out);
        }
        Ok(attach(out, tensors, StackBackward { dim: d, needs }))
    }

    /// Splits into `n` views along `dim`, each of `ceil(size / n)` elements
    /// but the last, which may be smaller; fewer than `n` when the size runs
    /// out (a dimension of size 0 gives `n` empty views). Views share
    /// storage; each saves what [`Tensor::narrow`] saves.
    pub fn chunk(&self, n: usize, dim: isize) -> Result<Vec<Tensor>> {
        let d = resolve_dim("chunk", dim, self.rank())?;
        if n == 0 {
            return Err(Error::InvalidArgument {
                op: "chunk",
                msg: "cannot split into 0 chunks".into(),
            });
        }
        let size = self.shape()[d];
        if size == 0 {
            return (0..n).map(|_| self.narrow(d as isize, 0, 0)).collect();
        }
        let step = size.div_ceil(n);
        (0..size)
            .step_by(step)
            .map(|start| self.narrow(d as isize, start, step.min(size - start)))
            .collect()
    }

    /// Splits into views along `dim` of the given `sizes`, which must add up
    /// to the size of `dim`. Views share storage; each saves what
    /// [`Tensor::narrow`] saves.
    pub fn split(&self, sizes: &[usize], dim: isize) -> Result<Vec<Tensor>> {
        let d = resolve_dim("split", dim, self.rank())?;
        let total = sizes.iter().try_fold(0usize, |a, &b| a.checked_add(b));
        if total != Some(self.shape()[d]) {
            return Err(Error::InvalidArgument {
                op: "split",
                msg: format!(
                    "sizes {sizes:?} do not add up to the size {} of dim {d}",
                    self.shape()[d]
                ),
            });
        }
        let mut start = 0;
        sizes
            .iter()
            .map(|&len| {
                let v = self.narrow(d as isize, start, len);
                start += len;
                v
            })
            .collect()
    }
}
