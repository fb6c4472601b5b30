//! Losses: cross-entropy over class logits (a fused log-softmax and
//! negative log-likelihood with label smoothing and an ignored target:
//! CPU kernels in `cpu.rs`, CUDA in `cuda.rs` and `loss.cu`, logits read in
//! the lanes of `ops::softmax`) and mean squared error (elementwise
//! primitives only), and [`Tensor::linear_cross_entropy`] (a Linear layer
//! and cross-entropy over row chunks, in `linear.rs`).
//!
//! Saved for backward, for logits of `n` elements of `b` bytes, `s` samples
//! (targets I64) and `m` elements in `mse_loss`:
//!
//! | op | requires grad | saved for backward | why |
//! |---|---|---|---|
//! | `cross_entropy` (lean) | logits | the softmax probabilities: `n·b` bytes, or nothing of its own while another op keeps the logits (they are read back and the probabilities recomputed by the forward's kernel, the same bits; when that op lets go, the probabilities are made again); the targets: `8·s` bytes (the caller's tensor, not copied) | the gradient is `w·(p − ε/C − (1−ε)·onehot(t))`: never more bytes than the logits, never beside logits kept anyway |
//! | `cross_entropy` (`SaveAll`) | logits | the softmax probabilities and the targets | what PyTorch's log-softmax keeps (its output, the same bytes) |
//! | `cross_entropy` | nothing | — (no node; no probabilities computed) | |
//! | `mse_loss` | either input | `self − target`: `m·b` bytes | both gradients are `±2·(self − target)·g` (scaled for the mean) |
//! | `mse_loss` | nothing | — (no node) | |
//!
//! The targets never need grad.

mod cpu;
mod cuda;
mod linear;
mod saved_probs;

pub use linear::CHUNK_ELEMENTS;
#[cfg(test)]
mod tests;

use super::autocast::{widen, widens};
use super::expect_float;
use crate::autograd::{attach, needs_grad, save_policy, BackwardOp, SavePolicy, SavedTensor};
use crate::meta::{backend, Backend};
use crate::primitives::{binary_map, sum_scaled, BinaryKernel};
use crate::tensor::Layout;
use crate::{DType, Error, FloatDType, Result, Tensor, WithDType};
use saved_probs::ProbSlot;
use std::sync::Arc;

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

/// What the cross-entropy forward computes.
struct CrossEntropyForward {
    /// The per-sample losses and how many samples are not ignored.
    stats: SampleLosses,
    /// The softmax probabilities (logits' shape and dtype), when asked for.
    probs: Option<Tensor>,
}

/// The loss of every sample (0 where the target is ignored) and how many
/// samples are not ignored: host values on the CPU (on meta: no losses,
/// every sample counted); on CUDA, device tensors outside the ledger (f64
/// losses, one i64 count) that stay there unless a caller asks.
enum SampleLosses {
    Host { losses: Vec<f64>, count: usize },
    Device { losses: Tensor, count: Tensor },
}

/// How many samples are not ignored, where the backward reads it.
#[derive(Clone)]
enum SampleCount {
    Host(usize),
    /// One i64 on the device.
    Device(Tensor),
}

impl SampleLosses {
    /// The count, for the backward.
    fn count(&self) -> SampleCount {
        match self {
            SampleLosses::Host { count, .. } => SampleCount::Host(*count),
            SampleLosses::Device { count, .. } => SampleCount::Device(count.clone()),
        }
    }

    /// The samples of `parts` one after another, as one forward over all of
    /// them gives: the losses in order, the counts summed (on the device for
    /// CUDA parts: nothing is read back). No parts: no samples.
    fn join(parts: Vec<SampleLosses>) -> Result<SampleLosses> {
        let (mut host, mut host_count) = (Vec::new(), 0);
        let (mut losses, mut counts) = (Vec::new(), Vec::new());
        for part in parts {
            match part {
                SampleLosses::Host { losses, count } => {
                    host.extend(losses);
                    host_count += count;
                }
                SampleLosses::Device { losses: l, count } => {
                    losses.push(l);
                    counts.push(count);
                }
            }
        }
        match (losses.is_empty(), host.is_empty() && host_count == 0) {
            (true, _) => Ok(SampleLosses::Host {
                losses: host,
                count: host_count,
            }),
            (false, true) => {
                let (losses, count) = cuda::join(&losses, &counts)?;
                Ok(SampleLosses::Device { losses, count })
            }
            (false, false) => Err(Error::InvalidArgument {
                op: "cross_entropy",
                msg: "sample losses on the host and on a device cannot be joined".into(),
            }),
        }
    }

    /// The op's output as `reduction` asks (`shape`: one loss per sample),
    /// in `like`'s dtype on its device, counted under the current category.
    fn reduce(&self, reduction: Reduction, shape: &[usize], like: &Tensor) -> Result<Tensor> {
        let (dtype, device) = (like.dtype(), like.device());
        match self {
            SampleLosses::Host { losses, count } => {
                let total = || losses.iter().sum::<f64>();
                match reduction {
                    Reduction::None => Tensor::from_host_f64(losses, shape, dtype, device),
                    Reduction::Sum => Tensor::scalar(total(), dtype, device),
                    Reduction::Mean => Tensor::scalar(total() / *count as f64, dtype, device),
                }
            }
            SampleLosses::Device { losses, count } => {
                cuda::reduce(losses, count, reduction, shape, dtype)
            }
        }
    }
}

// The dispatch seam: one small function per kernel, the only place here
// (besides cuda.rs) that names CUDA.

/// Per-sample cross-entropy of `logits` (classes on `class_dim`) against the
/// I64 `targets` (one per sample), and the probabilities when `want_probs`.
fn cross_entropy_forward(
    logits: &Tensor,
    class_dim: usize,
    targets: &Tensor,
    opts: &CrossEntropyOptions,
    want_probs: bool,
) -> Result<CrossEntropyForward> {
    let (ignore, eps) = (opts.ignore_index, opts.label_smoothing);
    match backend("cross_entropy", &[logits, targets])? {
        Backend::Cpu | Backend::Meta => {
            cpu::forward(logits, class_dim, targets, ignore, eps, want_probs)
        }
        Backend::Cuda(_) => cuda::forward(logits, class_dim, targets, ignore, eps, want_probs),
    }
}

/// The gradient with respect to the logits from the saved probabilities
/// and targets and the incoming gradient `g` (read into per-sample weights
/// by [`sample_weights`], then dropped).
fn cross_entropy_backward(
    g: Tensor,
    probs: &Tensor,
    targets: &Tensor,
    class_dim: usize,
    opts: &CrossEntropyOptions,
    count: &SampleCount,
) -> Result<Tensor> {
    match backend("cross_entropy", &[&g, probs])? {
        Backend::Cpu | Backend::Meta => match count {
            SampleCount::Host(n) => cpu::backward(g, probs, targets, class_dim, opts, *n),
            SampleCount::Device(_) => Err(Error::Backward(
                "cross_entropy: the sample count is on another device".into(),
            )),
        },
        Backend::Cuda(_) => cuda::backward(g, probs, targets, class_dim, opts, count),
    }
}

/// The per-sample weights of the cross-entropy gradient from the incoming
/// gradient `g` (read to the host, then dropped; CUDA makes them on the
/// device alike): one per sample for no
/// reduction, one for all otherwise (over the `count` samples not ignored
/// for the mean).
fn sample_weights(g: Tensor, reduction: Reduction, count: usize) -> Result<Vec<f64>> {
    Ok(match reduction {
        Reduction::None => g.to_f64_vec()?,
        Reduction::Sum => vec![g.to_scalar()?],
        Reduction::Mean => vec![g.to_scalar()? / count as f64],
    })
}

/// `a − b`.
struct Diff;

impl BinaryKernel for Diff {
    const NAME: &'static str = "mse_loss";
    fn f<T: FloatDType>(&self, a: T, b: T) -> T {
        a - b
    }
    fn cuda(&self) -> Option<crate::op_code::BinaryOp> {
        Some(crate::op_code::BinaryOp::Sub)
    }
}

/// `a · b · factor`, the factor applied in f64.
struct ScaledMul(f64);

impl BinaryKernel for ScaledMul {
    const NAME: &'static str = "mse_loss";
    fn f<T: FloatDType>(&self, a: T, b: T) -> T {
        T::from_f64(WithDType::to_f64(a) * WithDType::to_f64(b) * self.0)
    }
    fn cuda(&self) -> Option<crate::op_code::BinaryOp> {
        Some(crate::op_code::BinaryOp::ScaledMul(self.0))
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
    count: SampleCount,
    probs: SavedProbs,
    targets: SavedTensor,
}

/// The probabilities as each policy keeps them.
enum SavedProbs {
    /// Lean: the probabilities, or the logits while another op keeps them.
    Lean(Arc<ProbSlot>),
    /// SaveAll: the probabilities, always.
    All(SavedTensor),
}

impl BackwardOp for CrossEntropyBackward {
    fn name(&self) -> &'static str {
        "cross_entropy"
    }
    fn backward(self: Box<Self>, g: Tensor) -> Result<Vec<Option<Tensor>>> {
        let probs = match &self.probs {
            SavedProbs::Lean(slot) => slot.probs()?,
            SavedProbs::All(p) => p.get()?.clone(),
        };
        let targets = self.targets.get()?;
        let grad =
            cross_entropy_backward(g, &probs, targets, self.class_dim, &self.opts, &self.count)?;
        Ok(vec![Some(grad)])
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
    /// need grad (see the backward's doc). Under [`crate::autocast`] f16
    /// and bf16 logits are cast to f32 first.
    pub fn cross_entropy(&self, targets: &Tensor, opts: CrossEntropyOptions) -> Result<Tensor> {
        if widens(self) {
            return widen(self)?.cross_entropy(targets, opts);
        }
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
        let lean = save_policy() == SavePolicy::Lean;
        // Logits another op saved already are read back in backward: the
        // probabilities are not even made.
        let kept_anyway = need && lean && ProbSlot::logits_kept_anyway(self);
        let fwd = cross_entropy_forward(self, class_dim, targets, &opts, need && !kept_anyway)?;
        let out = fwd.stats.reduce(opts.reduction, &sample_shape, self)?;
        if !need {
            return Ok(out);
        }
        let probs = match (lean, fwd.probs) {
            (true, probs) => {
                SavedProbs::Lean(ProbSlot::new(self, probs, class_dim, targets, opts)?)
            }
            (false, Some(p)) => SavedProbs::All(SavedTensor::new(&p, "cross_entropy")),
            (false, None) => {
                return Err(Error::Backward(
                    "cross_entropy: probabilities not computed".into(),
                ))
            }
        };
        let op = CrossEntropyBackward {
            class_dim,
            opts,
            count: fwd.stats.count(),
            probs,
            targets: SavedTensor::new(targets, "cross_entropy"),
        };
        Ok(attach(out, &[self], op))
    }

    /// Mean squared error `(self − target)²` with `reduction` (mean over all
    /// elements, sum, or elementwise). Shapes must be equal. Saves only the
    /// difference, and only when either input needs grad. Under
    /// [`crate::autocast`] f16 and bf16 inputs are cast to f32 first.
    pub fn mse_loss(&self, target: &Tensor, reduction: Reduction) -> Result<Tensor> {
        if widens(self) || widens(target) {
            return widen(self)?.mse_loss(&widen(target)?, reduction);
        }
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
