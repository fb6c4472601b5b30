//! Losses: cross-entropy over class logits and mean squared error.

use super::expect_float;
use crate::autograd::{attach, needs_grad, BackwardOp, SavedTensor};
use crate::meta::{backend, Backend};
use crate::primitives::CrossEntropyForward;
use crate::primitives::{
    binary_map, cross_entropy_backward, cross_entropy_forward, sum_scaled, BinaryKernel,
};
use crate::tensor::Layout;
use crate::{DType, Error, FloatDType, Result, Tensor, WithDType};

/// How a loss combines its per-element (or per-sample) losses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Reduction {
    /// The mean (for cross-entropy: over the samples not ignored).
    #[default]
    Mean,
    /// The sum.
    Sum,
    /// No reduction: one loss per element (or sample).
    None,
}

/// Options of [`Tensor::cross_entropy`], PyTorch's defaults by `Default`:
/// mean reduction, `ignore_index` −100, no label smoothing.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CrossEntropyOptions {
    /// How the per-sample losses are combined.
    pub reduction: Reduction,
    /// Samples with this target contribute no loss and no gradient, and are
    /// left out of the mean's denominator.
    pub ignore_index: i64,
    /// ε in [0, 1]: the target distribution is `(1−ε)·onehot + ε/C`.
    pub label_smoothing: f64,
}

impl Default for CrossEntropyOptions {
    fn default() -> Self {
        CrossEntropyOptions {
            reduction: Reduction::Mean,
            ignore_index: -100,
            label_smoothing: 0.0,
        }
    }
}

/// `a − b`.
struct Diff;

impl BinaryKernel for Diff {
    const NAME: &'static str = "mse_loss";
    fn f<T: FloatDType>(&self, a: T, b: T) -> T {
        a - b
    }
    fn cuda(&self) -> Option<crate::cuda::elementwise::BinaryOp> {
        Some(crate::cuda::elementwise::BinaryOp::Sub)
    }
}

/// `a · b · factor`, the factor applied in f64.
struct ScaledMul(f64);

impl BinaryKernel for ScaledMul {
    const NAME: &'static str = "mse_loss";
    fn f<T: FloatDType>(&self, a: T, b: T) -> T {
        T::from_f64(WithDType::to_f64(a) * WithDType::to_f64(b) * self.0)
    }
    fn cuda(&self) -> Option<crate::cuda::elementwise::BinaryOp> {
        Some(crate::cuda::elementwise::BinaryOp::ScaledMul(self.0))
    }
}

/// Backward of cross_entropy: saves the softmax probabilities (logits'
/// shape and dtype) and the targets (the caller's tensor, not copied), plus
/// the options and the count of samples not ignored. The probabilities are
/// what the gradient `p − target distribution` needs directly; saving them
/// instead of the logits costs the same bytes and avoids recomputing softmax.
struct CrossEntropyBackward {
    class_dim: usize,
    opts: CrossEntropyOptions,
    count: usize,
    probs: SavedTensor,
    targets: SavedTensor,
}

impl BackwardOp for CrossEntropyBackward {
    fn name(&self) -> &'static str {
        "cross_entropy"
    }
    fn backward(self: Box<Self>, g: Tensor) -> Result<Vec<Option<Tensor>>> {
        let (probs, targets) = (self.probs.get()?, self.targets.get()?);
        let (c, o) = (self.class_dim, &self.opts);
        let (eps, ignore) = (o.label_smoothing, o.ignore_index);
        let grad = match backend("cross_entropy", &[&g, probs])? {
            Backend::Meta => {
                drop(g); // as on the CPU: the incoming gradient goes first
                crate::meta::empty(probs.shape(), probs.dtype())?
            }
            Backend::Cuda(_) => {
                let w = self.weights(g)?;
                crate::primitives::cuda::ops::cross_entropy_backward(
                    probs, c, targets, &w, ignore, eps,
                )?
            }
            Backend::Cpu => {
                let t = targets.to_vec::<i64>()?;
                let w = self.weights(g)?;
                cross_entropy_backward(probs, c, &t, &w, ignore, eps)?
            }
        };
        Ok(vec![Some(grad)])
    }
}

impl CrossEntropyBackward {
    /// The per-sample weights of the gradient from the incoming gradient
    /// `g` (read to the host, then dropped).
    fn weights(&self, g: Tensor) -> Result<Vec<f64>> {
        Ok(match self.opts.reduction {
            Reduction::None => g.to_f64_vec()?,
            Reduction::Sum => vec![g.to_scalar()?],
            Reduction::Mean => vec![g.to_scalar()? / self.count as f64],
        })
    }
}

/// Backward of mse_loss: saves only the difference `self − target`, and
/// only when either input needs grad.
struct MseBackward {
    diff: SavedTensor,
    factor: f64,
    needs: [bool; 2],
}

impl BackwardOp for MseBackward {
    fn name(&self) -> &'static str {
        "mse_loss"
    }
    fn backward(self: Box<Self>, g: Tensor) -> Result<Vec<Option<Tensor>>> {
        let diff = self.diff.get()?;
        let ga = self.needs[0]
            .then(|| binary_map(diff, &g, &ScaledMul(self.factor)))
            .transpose()?;
        let gb = self.needs[1]
            .then(|| binary_map(diff, &g, &ScaledMul(-self.factor)))
            .transpose()?;
        Ok(vec![ga, gb])
    }
}

impl Tensor {
    /// Cross-entropy between class logits (`self`: `[N, C]`, `[N, C, d…]`, or
    /// `[C]` for one sample) and I64 class indices (`targets`: `[N]`,
    /// `[N, d…]`, or `[]`), like PyTorch's `cross_entropy`: per sample
    /// `−Σ_c q_c·log_softmax(x)_c` with `q = (1−ε)·onehot(t) + ε/C`. Samples
    /// whose target is `ignore_index` give 0 and are left out of the mean.
    /// A target outside `0..C` gives `Error::IndexOutOfRange`.
    ///
    /// Saves the softmax probabilities and the targets, only when the logits
    /// need grad (see the backward's doc).
    pub fn cross_entropy(&self, targets: &Tensor, opts: CrossEntropyOptions) -> Result<Tensor> {
        expect_float("cross_entropy", self)?;
        if targets.dtype() != DType::I64 {
            return Err(Error::DTypeMismatch {
                op: "cross_entropy",
                expected: DType::I64,
                got: targets.dtype(),
            });
        }
        if self.device() != targets.device() {
            return Err(Error::DeviceMismatch {
                op: "cross_entropy",
                lhs: self.device(),
                rhs: targets.device(),
            });
        }
        if !(0.0..=1.0).contains(&opts.label_smoothing) {
            return Err(Error::InvalidArgument {
                op: "cross_entropy",
                msg: format!("label_smoothing {} is outside [0, 1]", opts.label_smoothing),
            });
        }
        let class_dim = match self.rank() {
            0 => {
                return Err(Error::InvalidArgument {
                    op: "cross_entropy",
                    msg: "logits must have a class dim".into(),
                })
            }
            1 => 0,
            _ => 1,
        };
        let mut sample_shape = self.shape().to_vec();
        sample_shape.remove(class_dim);
        if targets.shape() != sample_shape {
            return Err(Error::ShapeMismatch {
                op: "cross_entropy",
                lhs: self.shape().to_vec(),
                rhs: targets.shape().to_vec(),
            });
        }
        let need = needs_grad([self])[0];
        let fwd = match backend("cross_entropy", &[self, targets])? {
            // Targets are not read on meta: every sample counts as a valid,
            // non-ignored target.
            Backend::Meta => {
                expect_float("cross_entropy", self)?;
                if targets.dtype() != DType::I64 {
                    return Err(Error::DTypeMismatch {
                        op: "cross_entropy",
                        expected: DType::I64,
                        got: targets.dtype(),
                    });
                }
                CrossEntropyForward {
                    losses: Vec::new(),
                    count: targets.numel(),
                    probs: need
                        .then(|| crate::meta::empty(self.shape(), self.dtype()))
                        .transpose()?,
                }
            }
            Backend::Cuda(_) => crate::primitives::cuda::ops::cross_entropy_forward(
                self,
                class_dim,
                targets,
                opts.ignore_index,
                opts.label_smoothing,
                need,
            )?,
            Backend::Cpu => {
                let t = targets.to_vec::<i64>()?;
                cross_entropy_forward(
                    self,
                    class_dim,
                    &t,
                    opts.ignore_index,
                    opts.label_smoothing,
                    need,
                )?
            }
        };
        let total = || fwd.losses.iter().sum::<f64>();
        let out = match opts.reduction {
            Reduction::None => {
                Tensor::from_host_f64(&fwd.losses, &sample_shape, self.dtype(), self.device())?
            }
            Reduction::Sum => Tensor::scalar(total(), self.dtype(), self.device())?,
            Reduction::Mean => {
                Tensor::scalar(total() / fwd.count as f64, self.dtype(), self.device())?
            }
        };
        let Some(probs) = fwd.probs else {
            return Ok(out);
        };
        let op = CrossEntropyBackward {
            class_dim,
            opts,
            count: fwd.count,
            probs: SavedTensor::new(&probs, "cross_entropy"),
            targets: SavedTensor::new(targets, "cross_entropy"),
        };
        Ok(attach(out, &[self], op))
    }

    /// Mean squared error `(self − target)²` with `reduction` (mean over all
    /// elements, sum, or elementwise). Shapes must be equal. Saves only the
    /// difference, and only when either input needs grad.
    pub fn mse_loss(&self, target: &Tensor, reduction: Reduction) -> Result<Tensor> {
        expect_float("mse_loss", self)?;
        if self.shape() != target.shape() {
            return Err(Error::ShapeMismatch {
                op: "mse_loss",
                lhs: self.shape().to_vec(),
                rhs: target.shape().to_vec(),
            });
        }
        let diff = binary_map(self, target, &Diff)?;
        let squares = binary_map(&diff, &diff, &ScaledMul(1.0))?;
        let scale = match reduction {
            Reduction::Mean => 1.0 / diff.numel() as f64,
            _ => 1.0,
        };
        let out = match reduction {
            Reduction::None => squares,
            _ => {
                let total = sum_scaled(&squares, &vec![1; squares.rank()], scale)?;
                total.view_with_layout(Layout::contiguous(&[]))
            }
        };
        let needs = needs_grad([self, target]);
        if !(needs[0] || needs[1]) {
            return Ok(out);
        }
        let op = MseBackward {
            diff: SavedTensor::new(&diff, "mse_loss"),
            factor: 2.0 * scale,
            needs,
        };
        Ok(attach(out, &[self, target], op))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::elementwise::BinaryOp;

    /// mse_loss's kernels have their CUDA forms, and `ScaledMul` takes its
    /// products in f64 before one rounding (which the CUDA op reproduces).
    #[test]
    fn kernels_have_their_cuda_forms() {
        assert_eq!(Diff.cuda(), Some(BinaryOp::Sub));
        assert_eq!(ScaledMul(-0.5).cuda(), Some(BinaryOp::ScaledMul(-0.5)));
        // 7 · 7 · (1/7): exactly 7 from f64, 7.0000005 in f32 arithmetic.
        assert_eq!(ScaledMul(1.0 / 7.0).f(7.0f32, 7.0), 7.0);
        assert_ne!(7.0f32 * 7.0 * (1.0 / 7.0f64) as f32, 7.0);
    }
}
