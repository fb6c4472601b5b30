//! Matrix products: `matmul` with torch.matmul's rules (1-d·1-d, 2-d, and
//! batched with broadcast batch dims), on the gemm kernel in `cpu`.

use super::autocast::{lower, lowers};
use super::reduce::unit_reshape;
use super::sum_to_shape;
use crate::autograd::{attach, needs_grad, BackwardOp, SavedTensor};
use crate::primitives::{matmul as product, matmul_sum_batches};
use crate::tensor::Layout;
use crate::{Error, Result, Tensor};

/// A view of `t` (rank ≥ 1) as a matrix operand: a 1-d left operand
/// becomes `[1, k]`, a 1-d right operand `[k, 1]`; others are unchanged.
fn promote(t: &Tensor, lhs: bool) -> Tensor {
    if t.rank() != 1 {
        return t.detach();
    }
    let (n, s, o) = (t.shape()[0], t.layout().strides()[0], t.layout().offset());
    let (shape, strides) = if lhs {
        (vec![1, n], vec![0, s])
    } else {
        (vec![n, 1], vec![s, 0])
    };
    t.view_with_layout(Layout::from_parts(shape, strides, o))
}

fn promoted_shape(shape: &[usize], lhs: bool) -> Vec<usize> {
    match (shape.len(), lhs) {
        (1, true) => vec![1, shape[0]],
        (1, false) => vec![shape[0], 1],
        _ => shape.to_vec(),
    }
}

/// The last two dims swapped (a view, no copy).
fn swap_last(t: &Tensor) -> Result<Tensor> {
    let r = t.rank();
    let mut dims: Vec<usize> = (0..r).collect();
    dims.swap(r - 2, r - 1);
    Ok(t.view_with_layout(t.layout().permute(&dims)?))
}

/// `x · y` reduced to `target` (a promoted operand's shape): a plain
/// product when no batch dim was broadcast, a product summed over the batch
/// without materializing it when the target has no batch dims, else the
/// full product summed back with `sum_to_shape`.
fn product_to(x: &Tensor, y: &Tensor, target: &[usize]) -> Result<Tensor> {
    if target.len() == 2 && (x.rank() > 2 || y.rank() > 2) {
        return matmul_sum_batches(x, y);
    }
    sum_to_shape(&product(x, y)?, target)
}

/// Backward of matmul: saves `rhs` only if `self` needs grad (for
/// `g·rhsᵀ`) and `self` only if `rhs` does (for `selfᵀ·g`), plus shapes.
struct MatmulBackward {
    a_shape: Vec<usize>,
    b_shape: Vec<usize>,
    out_shape: Vec<usize>,
    needs: [bool; 2],
    /// `rhs` was a transposed matrix (a Linear layer's `weight.t()`): its
    /// gradient is computed as `(gᵀ·self)ᵀ`, so that it has `rhs`'s layout
    /// and the weight's gradient arrives contiguous (as PyTorch does).
    b_transposed: bool,
    a: Option<SavedTensor>,
    b: Option<SavedTensor>,
}

/// Whether `t` (rank ≥ 2) is a column-major matrix (or batch of them): the
/// transpose of a row-major one.
fn column_major(t: &Tensor) -> bool {
    let (r, s, d) = (t.rank(), t.layout().strides(), t.shape());
    r >= 2 && d[r - 2] > 1 && d[r - 1] > 1 && s[r - 2] == 1 && s[r - 1] != 1
}

impl BackwardOp for MatmulBackward {
    fn name(&self) -> &'static str {
        "matmul"
    }
    fn backward(self: Box<Self>, g: Tensor) -> Result<Vec<Option<Tensor>>> {
        let g = unit_reshape(&g, &self.out_shape)?;
        let ga = match (&self.b, self.needs[0]) {
            (Some(b), true) => {
                let target = promoted_shape(&self.a_shape, true);
                let ga = product_to(&g, &swap_last(&promote(b.get()?, false))?, &target)?;
                Some(unit_reshape(&ga, &self.a_shape)?)
            }
            _ => None,
        };
        let gb = match (&self.a, self.needs[1]) {
            (Some(a), true) => {
                let target = promoted_shape(&self.b_shape, false);
                let a = promote(a.get()?, true);
                let gb = if self.b_transposed {
                    let mut t = target.clone();
                    let r = t.len();
                    t.swap(r - 2, r - 1);
                    swap_last(&product_to(&swap_last(&g)?, &a, &t)?)?
                } else {
                    product_to(&swap_last(&a)?, &g, &target)?
                };
                Some(unit_reshape(&gb, &self.b_shape)?)
            }
            _ => None,
        };
        Ok(vec![ga, gb])
    }
}

impl Tensor {
    /// The matrix product, with torch.matmul's rules: 1-d·1-d is the dot
    /// product (0-d); 2-d×2-d the matrix product; rank ≥ 3 a batch of
    /// products over the leading dims, which broadcast (NumPy rules). A 1-d
    /// left operand is treated as a row `[1, k]` and a 1-d right operand as a
    /// column `[k, 1]`, and that dim is removed from the result. Operands are
    /// read through their strides (a transposed view is not copied).
    ///
    /// Saves `rhs` only if `self` needs grad and `self` only if `rhs` does,
    /// under both policies: PyTorch's autograd guards `mm`'s, `bmm`'s and
    /// `addmm`'s saved operands the same way (a frozen Linear keeps no
    /// input). Gradients of broadcast batch dims are summed back.
    /// Under [`crate::autocast`] both operands are cast to its dtype first.
    pub fn matmul(&self, rhs: &Tensor) -> Result<Tensor> {
        if lowers(self) || lowers(rhs) {
            return lower(self)?.matmul(&lower(rhs)?);
        }
        if self.rank() == 0 || rhs.rank() == 0 {
            return Err(Error::InvalidArgument {
                op: "matmul",
                msg: format!(
                    "operands must have rank ≥ 1, got {:?} and {:?}",
                    self.shape(),
                    rhs.shape()
                ),
            });
        }
        let out = product(&promote(self, true), &promote(rhs, false)).map_err(|e| match e {
            Error::ShapeMismatch { op, .. } => Error::ShapeMismatch {
                op,
                lhs: self.shape().to_vec(),
                rhs: rhs.shape().to_vec(),
            },
            e => e,
        })?;
        let out_shape = out.shape().to_vec();
        let mut shape = out_shape.clone();
        if rhs.rank() == 1 {
            shape.pop();
        }
        if self.rank() == 1 {
            shape.remove(shape.len() - 1 - usize::from(rhs.rank() != 1));
        }
        let out = out.view_with_layout(Layout::contiguous(&shape));
        let [na, nb] = needs_grad([self, rhs]);
        if !(na || nb) {
            return Ok(out);
        }
        let op = MatmulBackward {
            a_shape: self.shape().to_vec(),
            b_shape: rhs.shape().to_vec(),
            out_shape,
            needs: [na, nb],
            b_transposed: nb && column_major(rhs),
            a: nb.then(|| SavedTensor::new(self, "matmul")),
            b: na.then(|| SavedTensor::new(rhs, "matmul")),
        };
        Ok(attach(out, &[self, rhs], op))
    }
}

#[cfg(test)]
mod tests {
    use crate::primitives::matmul_into;
    use crate::{DType, Device, Tensor};

    #[test]
    fn matmul_into_writes_and_accumulates() {
        for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16] {
            let a =
                Tensor::from_f64_slice(&[1.0, 2.0, 3.0, 4.0], &[2, 2], dtype, Device::Cpu).unwrap();
            let b =
                Tensor::from_f64_slice(&[1.0, 0.0, 2.0, 1.0], &[2, 2], dtype, Device::Cpu).unwrap();
            let dst = Tensor::full(&[2, 2], 100.0, dtype, Device::Cpu).unwrap();
            matmul_into(&dst, &a, &b, false).unwrap();
            assert_eq!(dst.to_f64_vec().unwrap(), vec![5.0, 2.0, 11.0, 4.0]);
            // Accumulate a transposed view: dst += aᵀ·b.
            matmul_into(&dst, &a.t().unwrap(), &b, true).unwrap();
            assert_eq!(dst.to_f64_vec().unwrap(), vec![12.0, 5.0, 21.0, 8.0]);
            assert_eq!(dst.version(), 2);
            // An operand sharing dst's storage is read before dst is written.
            matmul_into(&dst, &dst, &b, false).unwrap();
            assert_eq!(dst.to_f64_vec().unwrap(), vec![22.0, 5.0, 37.0, 8.0]);
            let wrong = Tensor::zeros(&[3, 2], dtype, Device::Cpu).unwrap();
            assert!(matmul_into(&wrong, &a, &b, false).is_err());
        }
    }
}
