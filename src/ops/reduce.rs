//! Reductions: sum and mean over any dims, max/min along one dim (values,
//! differentiable), argmax/argmin (indices, not differentiable).

use super::expect_float;
use crate::autograd::{attach, needs_grad, save_policy, BackwardOp, SavePolicy, SavedTensor};
use crate::primitives::{
    arg_extremum, compact_indices, contiguous_copy, i64_indices, scatter_along, sum_scaled,
    unary_map, UnaryKernel,
};
use crate::tensor::{resolve_dim, Layout};
use crate::{Error, FloatDType, Result, Tensor};

/// `x · factor`, the factor applied in f64.
struct Scale(f64);

impl UnaryKernel for Scale {
    const NAME: &'static str = "scale";
    fn f<T: FloatDType>(&self, x: T) -> T {
        T::from_f64(crate::WithDType::to_f64(x) * self.0)
    }
    fn cuda(&self) -> Option<crate::op_code::UnaryOp> {
        Some(crate::op_code::UnaryOp::Scale(self.0))
    }
}

/// A view of `t` with `shape`, which must be `t`'s shape with unit dims
/// added or removed (no copy, any layout; autograd is not recorded).
pub(crate) fn unit_reshape(t: &Tensor, shape: &[usize]) -> Result<Tensor> {
    let l = t.layout();
    let mut src = l.shape().iter().zip(l.strides()).filter(|(&d, _)| d != 1);
    let mut strides = Vec::with_capacity(shape.len());
    for &d in shape {
        strides.push(match d {
            1 => 0,
            _ => match src.next() {
                Some((&size, &stride)) if size == d => stride,
                _ => break,
            },
        });
    }
    if strides.len() != shape.len() || src.next().is_some() {
        return Err(Error::ShapeMismatch {
            op: "unit_reshape",
            lhs: t.shape().to_vec(),
            rhs: shape.to_vec(),
        });
    }
    Ok(t.view_with_layout(Layout::from_parts(shape.to_vec(), strides, l.offset())))
}

/// Which dims `dims` names (an empty list names all), refusing repeats.
fn reduced_mask(op: &'static str, dims: &[isize], rank: usize) -> Result<Vec<bool>> {
    if dims.is_empty() {
        return Ok(vec![true; rank]);
    }
    let mut mask = vec![false; rank];
    for &d in dims {
        let r = resolve_dim(op, d, rank)?;
        if std::mem::replace(&mut mask[r], true) {
            return Err(Error::InvalidArgument {
                op,
                msg: format!("dim {d} is given twice"),
            });
        }
    }
    Ok(mask)
}

/// `shape` with the masked dims set to 1 (keepdim) or removed.
fn reduced_shape(shape: &[usize], mask: &[bool], keepdim: bool) -> Vec<usize> {
    let kept = shape.iter().zip(mask);
    match keepdim {
        true => kept.map(|(&d, &m)| if m { 1 } else { d }).collect(),
        false => kept.filter(|(_, &m)| !m).map(|(&d, _)| d).collect(),
    }
}

/// Backward of sum and mean: saves only the input shape, the reduced dims
/// and the scale (1, or 1/count for mean).
struct SumBackward {
    name: &'static str,
    input_shape: Vec<usize>,
    mask: Vec<bool>,
    scale: f64,
}

impl BackwardOp for SumBackward {
    fn name(&self) -> &'static str {
        self.name
    }
    fn backward(self: Box<Self>, g: Tensor) -> Result<Vec<Option<Tensor>>> {
        let keep = reduced_shape(&self.input_shape, &self.mask, true);
        let g = unit_reshape(&g, &keep)?;
        let spread = g.view_with_layout(g.layout().broadcast_to(&self.input_shape)?);
        let grad = if self.scale == 1.0 {
            contiguous_copy(&spread)?
        } else {
            unary_map(&spread, &Scale(self.scale))?
        };
        Ok(vec![Some(grad)])
    }
}

/// Backward of max/min along a dim: saves only the index of the chosen
/// element of every lane, in the smallest exact integer dtype (U8 for dims
/// of up to 256 elements, U32 up to 2³², else I64), plus the input shape.
struct ExtremumBackward {
    name: &'static str,
    input_shape: Vec<usize>,
    dim: usize,
    indices: SavedTensor,
}

impl BackwardOp for ExtremumBackward {
    fn name(&self) -> &'static str {
        self.name
    }
    fn backward(self: Box<Self>, g: Tensor) -> Result<Vec<Option<Tensor>>> {
        let mut keep = self.input_shape.clone();
        keep[self.dim] = 1;
        let g = unit_reshape(&g, &keep)?;
        let grad = scatter_along(&g, self.indices.get()?, &self.input_shape, self.dim)?;
        Ok(vec![Some(grad)])
    }
}

impl Tensor {
    fn sum_or_mean(
        &self,
        op: &'static str,
        dims: &[isize],
        keepdim: bool,
        mean: bool,
    ) -> Result<Tensor> {
        expect_float(op, self)?;
        let mask = reduced_mask(op, dims, self.rank())?;
        let count: usize = self
            .shape()
            .iter()
            .zip(&mask)
            .filter(|(_, &m)| m)
            .map(|(&d, _)| d)
            .product();
        let scale = if mean { 1.0 / count as f64 } else { 1.0 };
        let out = sum_scaled(self, &reduced_shape(self.shape(), &mask, true), scale)?;
        let out = out.view_with_layout(Layout::contiguous(&reduced_shape(
            self.shape(),
            &mask,
            keepdim,
        )));
        let op = SumBackward {
            name: op,
            input_shape: self.shape().to_vec(),
            mask,
            scale,
        };
        Ok(attach(out, &[self], op))
    }

    /// The sum over `dims` (negative dims count from the end; an empty list
    /// sums every dim), keeping them as size 1 when `keepdim`. Accumulates in
    /// f64. Saves only shapes for backward.
    pub fn sum(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        self.sum_or_mean("sum", dims, keepdim, false)
    }

    /// The mean over `dims` (see [`Tensor::sum`]). Saves only shapes.
    pub fn mean(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        self.sum_or_mean("mean", dims, keepdim, true)
    }

    /// The sum of all elements, as a 0-d tensor. Saves only the shape.
    pub fn sum_all(&self) -> Result<Tensor> {
        self.sum(&[], false)
    }

    /// The mean of all elements, as a 0-d tensor. Saves only the shape.
    pub fn mean_all(&self) -> Result<Tensor> {
        self.mean(&[], false)
    }

    fn extremum(&self, op: &'static str, dim: isize, keepdim: bool, max: bool) -> Result<Tensor> {
        let d = resolve_dim(op, dim, self.rank())?;
        let (idx, values) = arg_extremum(self, d, max, true)?;
        let values = values.ok_or(Error::InvalidArgument {
            op,
            msg: "no values computed".into(),
        })?;
        let mut shape = self.shape().to_vec();
        if keepdim {
            shape[d] = 1;
        } else {
            shape.remove(d);
        }
        let values = values.view_with_layout(Layout::contiguous(&shape));
        if !needs_grad([self])[0] {
            return Ok(values);
        }
        // PyTorch keeps int64 indices; the lean policy the narrowest exact type.
        let indices = match save_policy() {
            SavePolicy::Lean => compact_indices(&idx, self.shape()[d], &shape, self.device())?,
            SavePolicy::SaveAll => i64_indices(&idx, &shape, self.device())?,
        };
        let op = ExtremumBackward {
            name: op,
            input_shape: self.shape().to_vec(),
            dim: d,
            indices: SavedTensor::new(&indices, op),
        };
        Ok(attach(values, &[self], op))
    }

    /// The maximum along `dim` (kept as size 1 when `keepdim`). A NaN counts
    /// as the maximum. The gradient goes to the first maximal element of each
    /// lane; saves only those indices, in the smallest exact integer dtype
    /// (U8 for dims of up to 256 elements, U32 up to 2³², else I64).
    pub fn max(&self, dim: isize, keepdim: bool) -> Result<Tensor> {
        self.extremum("max", dim, keepdim, true)
    }

    /// The minimum along `dim` (see [`Tensor::max`]); saves only the indices.
    pub fn min(&self, dim: isize, keepdim: bool) -> Result<Tensor> {
        self.extremum("min", dim, keepdim, false)
    }

    fn arg_index(&self, op: &'static str, dim: isize, keepdim: bool, max: bool) -> Result<Tensor> {
        let d = resolve_dim(op, dim, self.rank())?;
        let (idx, _) = arg_extremum(self, d, max, false)?;
        let mut shape = self.shape().to_vec();
        if keepdim {
            shape[d] = 1;
        } else {
            shape.remove(d);
        }
        i64_indices(&idx, &shape, self.device())
    }

    /// The I64 index of the first maximum along `dim` (a NaN counts as the
    /// maximum), for any dtype. Not differentiable; records nothing.
    pub fn argmax(&self, dim: isize, keepdim: bool) -> Result<Tensor> {
        self.arg_index("argmax", dim, keepdim, true)
    }

    /// The I64 index of the first minimum along `dim` (see [`Tensor::argmax`]).
    pub fn argmin(&self, dim: isize, keepdim: bool) -> Result<Tensor> {
        self.arg_index("argmin", dim, keepdim, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op_code::UnaryOp;

    /// Mean's backward scale has its CUDA form, which also takes the
    /// product in f64 before rounding, as here.
    #[test]
    fn scale_has_its_cuda_form() {
        assert_eq!(Scale(0.25).cuda(), Some(UnaryOp::Scale(0.25)));
        // 3 · 0.3: 0.9 from the f64 product, 0.90000004 in f32 arithmetic.
        assert_eq!(Scale(0.3).f(3.0f32), 0.9);
        assert_ne!(3.0f32 * 0.3f64 as f32, 0.9);
    }
}
