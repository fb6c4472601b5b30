//! Clipping over collected gradients (the usual path), and the norm rules
//! shared with the fused path.

use super::kernels::sum_of_squares;
use crate::{Device, Error, Result, Tensor};

/// `min(1, max_norm / (norm + 1e-6))`, as `torch.nn.utils.clip_grad_norm_`.
pub(crate) fn coefficient(norm: f64, max_norm: f64) -> f64 {
    (max_norm / (norm + 1e-6)).min(1.0)
}

/// √(Σ over the gradients, in order, of their squared norms).
pub(crate) fn combine<'a>(grads: impl Iterator<Item = Option<&'a Tensor>>) -> Result<f64> {
    let mut total = 0.0;
    for g in grads.flatten() {
        total += sum_of_squares(g)?;
    }
    Ok(total.sqrt())
}

/// The 2-norm over the `.grad`s of `params` (those without one are skipped).
pub fn total_norm(params: &[Tensor]) -> Result<f64> {
    let grads: Vec<Option<Tensor>> = params.iter().map(|p| p.grad()).collect();
    combine(grads.iter().map(|g| g.as_ref()))
}

/// Scales the `.grad`s of `params` by `min(1, max_norm / (‖G‖ + 1e-6))`
/// with `‖G‖` their total 2-norm (as `clip_grad_norm_`); returns `‖G‖`.
pub fn clip_grad_norm(params: &[Tensor], max_norm: f64) -> Result<f64> {
    let norm = total_norm(params)?;
    let coef = coefficient(norm, max_norm);
    for p in params {
        if let Some(g) = p.grad() {
            replace_grad(p, g.mul_scalar(coef)?);
        }
    }
    Ok(norm)
}

/// Limits every element of the `.grad`s of `params` to `[-clip, clip]`
/// (as `clip_grad_value_`).
pub fn clip_grad_value(params: &[Tensor], clip: f64) -> Result<()> {
    for p in params {
        if let Some(g) = p.grad() {
            replace_grad(p, clamp_grad(&g, clip)?);
        }
    }
    Ok(())
}

/// `g.clamp(-clip, clip)`; on CUDA (where `clamp` has no kernel yet) the
/// same values and the same one new contiguous buffer from `optim.cu`.
fn clamp_grad(g: &Tensor, clip: f64) -> Result<Tensor> {
    if let Device::Cuda(_) = g.device() {
        if clip.is_nan() || -clip > clip {
            return Err(Error::InvalidArgument {
                op: "clamp",
                msg: format!("bounds [{}, {clip}] are not an interval", -clip),
            });
        }
        return super::cuda::clamp_abs(g, clip);
    }
    g.clamp(-clip, clip)
}

/// Swaps `p`'s `.grad` for `g` (computed under no grad: `.grad` never
/// requires grad), freeing the old one.
fn replace_grad(p: &Tensor, g: Tensor) {
    if let Some(l) = p.leaf() {
        l.set_grad(Some(g));
    }
}
