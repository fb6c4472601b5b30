//! Integer indexing along a dimension: index_select, gather, scatter_add.
//!
//! Index tensors hold I64 (or U32) values; every value must lie in
//! `0..size` of the indexed dimension, else `Error::IndexOutOfRange`.

use crate::autograd::{attach, needs_grad, BackwardOp, SavedTensor};
use crate::meta::{backend, Backend};
use crate::primitives::cuda::index as cuda_index;
use crate::primitives::{
    add_at, corner, gather_offsets, read_indices, scatter_into_zeros, select_offsets, take,
};
use crate::tensor::{resolve_dim, Layout};
use crate::{DType, Error, Result, Tensor};

/// Checks that `index` has `x`'s rank and is no larger than `x` outside
/// `dim`, and no larger than `src` (if given) anywhere.
fn check_index_shape(
    op: &'static str,
    x: &Tensor,
    dim: usize,
    index: &Tensor,
    src: Option<&Tensor>,
) -> Result<()> {
    if index.rank() != x.rank() {
        return Err(Error::InvalidArgument {
            op,
            msg: format!(
                "index has rank {} but the input has rank {}",
                index.rank(),
                x.rank()
            ),
        });
    }
    let fits_x = index
        .shape()
        .iter()
        .zip(x.shape())
        .enumerate()
        .all(|(i, (n, s))| i == dim || n <= s);
    if !fits_x {
        return Err(Error::ShapeMismatch {
            op,
            lhs: x.shape().to_vec(),
            rhs: index.shape().to_vec(),
        });
    }
    if let Some(src) = src {
        let fits_src = src.rank() == index.rank()
            && index.shape().iter().zip(src.shape()).all(|(n, s)| n <= s);
        if !fits_src {
            return Err(Error::ShapeMismatch {
                op,
                lhs: src.shape().to_vec(),
                rhs: index.shape().to_vec(),
            });
        }
    }
    Ok(())
}

/// Backward of index_select: saves the index (and the input shape).
struct IndexSelectBackward {
    index: SavedTensor,
    dim: usize,
    input_shape: Vec<usize>,
}

impl BackwardOp for IndexSelectBackward {
    fn name(&self) -> &'static str {
        "index_select"
    }
    fn backward(self: Box<Self>, g: Tensor) -> Result<Vec<Option<Tensor>>> {
        let index = self.index.get()?;
        if let Backend::Cuda(_) = index_backend("index_select", &g, index)? {
            let grad = cuda_index::index_select_backward(&g, self.dim, index, &self.input_shape)?;
            return Ok(vec![Some(grad)]);
        }
        if meta_index("index_select", &g, self.index.get()?)? {
            drop(self.index);
            return Ok(vec![Some(crate::meta::empty(
                &self.input_shape,
                g.dtype(),
            )?)]);
        }
        let idx = read_indices(
            "index_select",
            self.index.get()?,
            self.input_shape[self.dim],
        )?;
        drop(self.index);
        let dst = select_offsets(&Layout::contiguous(&self.input_shape), self.dim, &idx)?;
        Ok(vec![Some(scatter_into_zeros(&self.input_shape, &dst, &g)?)])
    }
}

/// Backward of gather: saves the index (and the input shape).
struct GatherBackward {
    index: SavedTensor,
    dim: usize,
    input_shape: Vec<usize>,
}

impl BackwardOp for GatherBackward {
    fn name(&self) -> &'static str {
        "gather"
    }
    fn backward(self: Box<Self>, g: Tensor) -> Result<Vec<Option<Tensor>>> {
        let index = self.index.get()?;
        if let Backend::Cuda(_) = index_backend("gather", &g, index)? {
            let grad = cuda_index::gather_backward(&g, self.dim, index, &self.input_shape)?;
            return Ok(vec![Some(grad)]);
        }
        if meta_index("gather", &g, index)? {
            drop(self.index);
            return Ok(vec![Some(crate::meta::empty(
                &self.input_shape,
                g.dtype(),
            )?)]);
        }
        let idx = read_indices("gather", index, self.input_shape[self.dim])?;
        let dst = gather_offsets(
            &Layout::contiguous(&self.input_shape),
            self.dim,
            index.shape(),
            &idx,
        )?;
        drop(self.index);
        Ok(vec![Some(scatter_into_zeros(&self.input_shape, &dst, &g)?)])
    }
}

/// Backward of scatter_add: saves the index (and src's shape) only when
/// `src` needs grad; `self`'s gradient is the incoming one.
struct ScatterAddBackward {
    dim: usize,
    self_size: usize,
    needs_self: bool,
    src: Option<(SavedTensor, Vec<usize>)>,
}

impl BackwardOp for ScatterAddBackward {
    fn name(&self) -> &'static str {
        "scatter_add"
    }
    fn backward(self: Box<Self>, g: Tensor) -> Result<Vec<Option<Tensor>>> {
        let grad_src = match &self.src {
            None => None,
            Some((index, src_shape)) => {
                let index = index.get()?;
                if let Backend::Cuda(_) = index_backend("scatter_add", &g, index)? {
                    let grad = cuda_index::scatter_add_src_grad(&g, self.dim, index, src_shape)?;
                    drop(self.src);
                    return Ok(vec![self.needs_self.then_some(g), Some(grad)]);
                }
                let vals = if meta_index("scatter_add", &g, index)? {
                    crate::meta::empty(index.shape(), g.dtype())?
                } else {
                    let idx = read_indices("scatter_add", index, self.self_size)?;
                    let at = gather_offsets(g.layout(), self.dim, index.shape(), &idx)?;
                    take(&g, &at, index.shape())?
                };
                if index.shape() == src_shape.as_slice() {
                    Some(vals)
                } else {
                    // src elements the index does not cover get zero gradient.
                    if vals.device().is_meta() {
                        return Ok(vec![
                            self.needs_self.then_some(g),
                            Some(crate::meta::empty(src_shape, vals.dtype())?),
                        ]);
                    }
                    let dst = corner(&Layout::contiguous(src_shape), index.shape()).offsets()?;
                    Some(scatter_into_zeros(src_shape, &dst, &vals)?)
                }
            }
        };
        drop(self.src);
        Ok(vec![self.needs_self.then_some(g), grad_src])
    }
}

/// The one backend dispatch of the index ops: `x` and `index` must share
/// one device, and on meta and CUDA (where the values are not read on the
/// host) the index must be I64 or U32. On meta the index values are not
/// read at all: they are treated as valid.
fn index_backend(op: &'static str, x: &Tensor, index: &Tensor) -> Result<Backend> {
    let b = backend(op, &[x, index])?;
    if b != Backend::Cpu && !matches!(index.dtype(), DType::I64 | DType::U32) {
        return Err(Error::DTypeMismatch {
            op,
            expected: DType::I64,
            got: index.dtype(),
        });
    }
    Ok(b)
}

/// Whether an index op's backward runs on meta rather than the CPU (the
/// callers dispatch CUDA first; one reaching here on CUDA is a typed
/// `NotOnCuda`, never a host read of device memory).
fn meta_index(op: &'static str, x: &Tensor, index: &Tensor) -> Result<bool> {
    match index_backend(op, x, index)? {
        Backend::Meta => Ok(true),
        Backend::Cuda(n) => Err(crate::meta::not_on_cuda(op, n)),
        Backend::Cpu => Ok(false),
    }
}

impl Tensor {
    /// The slices of `dim` listed by the 1-d `index` (I64 or U32; repeats
    /// allowed), in order: the result has `index.len()` entries along `dim`.
    /// Works for every dtype. Saves the index tensor, and only when `self`
    /// needs grad (backward scatter-adds the gradient into zeros of the
    /// input's shape, so repeated indices accumulate).
    pub fn index_select(&self, dim: isize, index: &Tensor) -> Result<Tensor> {
        const OP: &str = "index_select";
        let d = resolve_dim(OP, dim, self.rank())?;
        if index.rank() != 1 {
            return Err(Error::InvalidArgument {
                op: OP,
                msg: format!("index must be 1-d, got shape {:?}", index.shape()),
            });
        }
        let out = match index_backend(OP, self, index)? {
            Backend::Meta => {
                let mut shape = self.shape().to_vec();
                shape[d] = index.numel();
                crate::meta::empty(&shape, self.dtype())?
            }
            Backend::Cuda(_) => cuda_index::index_select(self, d, index)?,
            Backend::Cpu => {
                let idx = read_indices(OP, index, self.shape()[d])?;
                let mut shape = self.shape().to_vec();
                shape[d] = idx.len();
                take(self, &select_offsets(self.layout(), d, &idx)?, &shape)?
            }
        };
        let [need] = needs_grad([self]);
        if !need {
            return Ok(out);
        }
        let op = IndexSelectBackward {
            index: SavedTensor::new(index, OP),
            dim: d,
            input_shape: self.shape().to_vec(),
        };
        Ok(attach(out, &[self], op))
    }

    /// Like `torch.gather`: `out[p] = self[p with coordinate dim replaced by
    /// index[p]]`. `index` (I64 or U32) has `self`'s rank and is no larger
    /// than `self` outside `dim`; the result has `index`'s shape. Works for
    /// every dtype. Saves the index tensor only, and only when `self` needs
    /// grad (backward scatter-adds the gradient into zeros of the input's shape).
    pub fn gather(&self, dim: isize, index: &Tensor) -> Result<Tensor> {
        const OP: &str = "gather";
        let d = resolve_dim(OP, dim, self.rank())?;
        check_index_shape(OP, self, d, index, None)?;
        let out = match index_backend(OP, self, index)? {
            Backend::Meta => crate::meta::empty(index.shape(), self.dtype())?,
            Backend::Cuda(_) => cuda_index::gather(self, d, index)?,
            Backend::Cpu => {
                let idx = read_indices(OP, index, self.shape()[d])?;
                let at = gather_offsets(self.layout(), d, index.shape(), &idx)?;
                take(self, &at, index.shape())?
            }
        };
        let [need] = needs_grad([self]);
        if !need {
            return Ok(out);
        }
        let op = GatherBackward {
            index: SavedTensor::new(index, OP),
            dim: d,
            input_shape: self.shape().to_vec(),
        };
        Ok(attach(out, &[self], op))
    }

    /// Like `torch.scatter_add`: a copy of `self` with `src[p]` added at
    /// `p` with coordinate `dim` replaced by `index[p]`, for every position
    /// `p` of `index` (repeated targets accumulate). `index` (I64 or U32) has
    /// `self`'s rank, is no larger than `src` anywhere nor than `self` outside
    /// `dim`; `src` has `self`'s dtype. Works for every dtype (integers wrap).
    /// Differentiable w.r.t. `self` (identity) and `src` (gather of the
    /// gradient). Saves the index tensor only when `src` needs grad.
    pub fn scatter_add(&self, dim: isize, index: &Tensor, src: &Tensor) -> Result<Tensor> {
        const OP: &str = "scatter_add";
        let d = resolve_dim(OP, dim, self.rank())?;
        if src.dtype() != self.dtype() {
            return Err(Error::DTypeMismatch {
                op: OP,
                expected: self.dtype(),
                got: src.dtype(),
            });
        }
        check_index_shape(OP, self, d, index, Some(src))?;
        let out = match (
            index_backend(OP, self, index)?,
            index_backend(OP, src, index)?,
        ) {
            (Backend::Meta, _) | (_, Backend::Meta) => {
                crate::meta::empty(self.shape(), self.dtype())?
            }
            (Backend::Cuda(_), _) => cuda_index::scatter_add(self, d, index, src)?,
            (Backend::Cpu, _) => {
                let idx = read_indices(OP, index, self.shape()[d])?;
                let dst =
                    gather_offsets(&Layout::contiguous(self.shape()), d, index.shape(), &idx)?;
                let src_at = corner(src.layout(), index.shape()).offsets()?;
                add_at(
                    crate::primitives::gather(self)?,
                    self.shape(),
                    &dst,
                    src,
                    &src_at,
                )?
            }
        };
        let [needs_self, needs_src] = needs_grad([self, src]);
        if !(needs_self || needs_src) {
            return Ok(out);
        }
        let op = ScatterAddBackward {
            dim: d,
            self_size: self.shape()[d],
            needs_self,
            src: needs_src.then(|| (SavedTensor::new(index, OP), src.shape().to_vec())),
        };
        Ok(attach(out, &[self, src], op))
    }
}
