//! Finite-difference gradient checking in f64 on the CPU.

use super::{backward_with, no_grad, CollectGrads};
use crate::tensor::Tensor;
use crate::{DType, Device, Error, Result};

/// Tolerances and step for [`gradcheck`].
#[derive(Clone, Copy, Debug)]
pub struct GradcheckOptions {
    /// Central-difference step.
    pub eps: f64,
    /// Absolute tolerance.
    pub atol: f64,
    /// Relative tolerance.
    pub rtol: f64,
}

impl Default for GradcheckOptions {
    fn default() -> Self {
        GradcheckOptions {
            eps: 1e-6,
            atol: 1e-7,
            rtol: 1e-5,
        }
    }
}

/// The largest disagreement found, for reporting.
#[derive(Clone, Debug, Default)]
pub struct GradcheckReport {
    /// Number of gradient entries compared.
    pub checked: usize,
    /// Largest |analytic − numeric|.
    pub max_abs_error: f64,
}

/// Checks the gradients of `f` at `inputs` against central differences.
///
/// Every f64 input is differentiated (other dtypes, such as class indices,
/// are passed through). The output is projected on a fixed random tensor so
/// that the whole Jacobian takes part: analytic gradients come from one
/// backward with that projection as `grad_output`, numeric ones from
/// perturbing each input element by ±eps. Returns an error naming the first
/// entry that disagrees.
pub fn gradcheck(
    f: impl Fn(&[Tensor]) -> Result<Tensor>,
    inputs: &[Tensor],
    opts: GradcheckOptions,
) -> Result<GradcheckReport> {
    let leaves: Vec<Tensor> = inputs
        .iter()
        .map(|t| {
            if t.dtype() == DType::F64 {
                t.detach().set_requires_grad(true)
            } else {
                Ok(t.detach())
            }
        })
        .collect::<Result<_>>()?;
    let out = f(&leaves)?;
    if out.dtype() != DType::F64 {
        return Err(Error::DTypeMismatch {
            op: "gradcheck",
            expected: DType::F64,
            got: out.dtype(),
        });
    }
    let projection = Tensor::rand_range(out.shape(), -1.0, 1.0, DType::F64, Device::Cpu, 0x9e37)?;
    let weights = projection.to_f64_vec()?;
    backward_with(&out, Some(projection), &mut CollectGrads)?;
    drop(out);

    let objective = |xs: &[Tensor]| -> Result<f64> {
        let _ng = no_grad();
        let y = f(xs)?.to_f64_vec()?;
        Ok(y.iter().zip(&weights).map(|(a, b)| a * b).sum())
    };
    let mut report = GradcheckReport::default();
    for (i, leaf) in leaves.iter().enumerate() {
        if leaf.dtype() != DType::F64 {
            continue;
        }
        let analytic = match leaf.grad() {
            Some(g) => g.to_f64_vec()?,
            None => vec![0.0; leaf.numel()],
        };
        let base = leaf.to_f64_vec()?;
        for j in 0..base.len() {
            let eval_at = |delta: f64| -> Result<f64> {
                let mut v = base.clone();
                v[j] += delta;
                let mut xs: Vec<Tensor> = leaves.iter().map(|t| t.detach()).collect();
                xs[i] = Tensor::from_vec(v, leaf.shape(), Device::Cpu)?;
                objective(&xs)
            };
            let numeric = (eval_at(opts.eps)? - eval_at(-opts.eps)?) / (2.0 * opts.eps);
            let err = (analytic[j] - numeric).abs();
            report.checked += 1;
            report.max_abs_error = report.max_abs_error.max(err);
            if err > opts.atol + opts.rtol * numeric.abs() {
                return Err(Error::Backward(format!(
                    "gradcheck: input {i} element {j}: analytic {} vs numeric {numeric} (|err| {err})",
                    analytic[j]
                )));
            }
        }
    }
    Ok(report)
}
