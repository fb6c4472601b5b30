//! Row-wise normalisation as fused ops: layer norm, group norm and RMS
//! norm, and their shared backward.
//!
//! Each is one op whose backward holds typed saved state. Under the lean
//! policy it keeps the normalised input `x̂` (input dtype, n elements) only
//! when the input or the weight gradient is needed, the per-row `rstd`
//! (f32, or f64 for f64 inputs) only for the input gradient, and the
//! weight only for the input gradient; a bias-only gradient keeps nothing.
//! Under `SaveAll` it keeps what PyTorch keeps: the input, weight (and bias
//! for layer norm), mean and rstd, and recomputes `x̂` in backward. The
//! family's saved-state table is in `norm/mod.rs`.

use super::{
    check_param, grads_of, input_grad, inputs_of, norm_stats, normalize, optional_needs,
    param_grads, prepare, recompute_xhat, GradMode, GradScale, NormGeom, Normalize, Prep,
    StatSource,
};
use crate::autograd::{attach, may_reuse, save_policy, BackwardOp, SavePolicy, SavedTensor};
use crate::ops::autocast::{widen, widen_opt, widens};
use crate::primitives::contiguous_copy;
use crate::{DType, Error, Result, Tensor};

enum RowSaved {
    Lean {
        xhat: Option<SavedTensor>,
        rstd: Option<SavedTensor>,
        weight: Option<SavedTensor>,
    },
    All {
        input: SavedTensor,
        weight: Option<SavedTensor>,
        _bias: Option<SavedTensor>,
        mean: Option<SavedTensor>,
        rstd: SavedTensor,
    },
}

/// Backward of layer/group/RMS norm (see the module doc for what is kept).
struct RowNormBackward {
    name: &'static str,
    geo: NormGeom,
    mode: GradMode,
    needs: [bool; 3],
    present: [bool; 2],
    param_shape: Vec<usize>,
    saved: RowSaved,
}

impl BackwardOp for RowNormBackward {
    fn name(&self) -> &'static str {
        self.name
    }
    fn backward(self: Box<Self>, g: Tensor) -> Result<Vec<Option<Tensor>>> {
        let [nx, nw, nb] = self.needs;
        let geo = self.geo;
        let (xhat, rstd, w) = match &self.saved {
            RowSaved::Lean { xhat, rstd, weight } => (
                xhat.as_ref().map(|t| t.get().cloned()).transpose()?,
                rstd.as_ref().map(|t| t.get().cloned()).transpose()?,
                weight.as_ref().map(|t| t.get().cloned()).transpose()?,
            ),
            RowSaved::All {
                input,
                weight,
                mean,
                rstd,
                ..
            } => {
                let rstd = rstd.get()?.clone();
                let mean = mean.as_ref().map(|m| m.get().cloned()).transpose()?;
                let xhat = (nx || nw)
                    .then(|| recompute_xhat(input.get()?, geo, mean.as_ref(), &rstd))
                    .transpose()?;
                let w = weight.as_ref().map(|t| t.get().cloned()).transpose()?;
                (xhat, Some(rstd), w)
            }
        };
        // The parameters' sums read `g` first: the input gradient may then
        // be written over it.
        let (gw, gb) = if nw || nb {
            let xh = xhat.as_ref().filter(|_| nw);
            param_grads(&g, xh, geo, nb, &self.param_shape)?
        } else {
            (None, None)
        };
        let gx = if nx {
            let rstd = rstd.ok_or_else(|| Error::Backward("norm: rstd missing".into()))?;
            let by = GradScale {
                scale: &rstd,
                w: w.as_ref(),
            };
            Some(input_grad(g, xhat.as_ref(), geo, self.mode, by, None)?)
        } else {
            None
        };
        Ok(grads_of(gx, gw, gb, self.present))
    }
}

/// One row norm's call: which norm, its geometry and parameters.
struct RowNorm<'a> {
    name: &'static str,
    geo: NormGeom,
    param_shape: &'a [usize],
    weight: Option<&'a Tensor>,
    bias: Option<&'a Tensor>,
    eps: f64,
    centered: bool,
}

/// The shared forward of the row norms; `y` is written over `x` when
/// `reuse` (the caller handed `x` over and nothing else holds it) and
/// backward will not read `x` (never under the lean policy).
fn row_norm(x: &Tensor, spec: &RowNorm<'_>, reuse: bool) -> Result<Tensor> {
    let RowNorm {
        name,
        geo,
        param_shape,
        weight,
        bias,
        eps,
        centered,
    } = *spec;
    crate::ops::expect_float(name, x)?;
    check_param(name, weight, param_shape, x)?;
    check_param(name, bias, param_shape, x)?;
    let (mean64, var64) = norm_stats(x, geo, centered)?;
    let prepared = prepare(&Prep {
        source: StatSource::Moments,
        mean: Some(&mean64),
        var: &var64,
        eps,
        dtype: x.dtype(),
        update: None,
        want_mean: true,
        want_rstd: true,
        want_scale: false,
        weight: None,
    })?;
    let missing = || Error::Backward("norm: statistics not computed".into());
    let mean = prepared.mean.ok_or_else(missing)?;
    let rstd = prepared.rstd.ok_or_else(missing)?;
    let [nx, nw, nb] = optional_needs(x, weight, bias);
    let lean = save_policy() == SavePolicy::Lean;
    let want_xhat = lean && (nx || nw);
    let y_over_x = reuse && (lean || !(nx || nw || nb));
    let (y, xhat) = normalize(
        x,
        geo,
        &Normalize {
            mean: Some(&mean),
            rstd: &rstd,
            w: weight,
            b: bias,
            want_y: true,
            want_xhat,
            y_over_x,
        },
    )?;
    let y = y.ok_or_else(|| Error::Backward("norm: output not computed".into()))?;
    if !(nx || nw || nb) {
        return Ok(y);
    }
    let saved = if lean {
        RowSaved::Lean {
            xhat: xhat.as_ref().map(|t| SavedTensor::new(t, name)),
            // The statistics were made outside the ledger: the saved ones
            // are counted copies.
            rstd: nx
                .then(|| contiguous_copy(&rstd).map(|t| SavedTensor::new(&t, name)))
                .transpose()?,
            weight: weight.filter(|_| nx).map(|t| SavedTensor::new(t, name)),
        }
    } else {
        RowSaved::All {
            input: SavedTensor::new(x, name),
            weight: weight.map(|t| SavedTensor::new(t, name)),
            _bias: bias
                .filter(|_| name == "layer_norm")
                .map(|t| SavedTensor::new(t, name)),
            mean: centered
                .then(|| contiguous_copy(&mean).map(|t| SavedTensor::new(&t, name)))
                .transpose()?,
            rstd: SavedTensor::new(&contiguous_copy(&rstd)?, name),
        }
    };
    let op = RowNormBackward {
        name,
        geo,
        mode: if centered {
            GradMode::Centered
        } else {
            GradMode::Uncentered
        },
        needs: [nx, nw, nb],
        present: [weight.is_some(), bias.is_some()],
        param_shape: param_shape.to_vec(),
        saved,
    };
    Ok(attach(y, &inputs_of(x, weight, bias), op))
}

/// Splits `x`'s shape into (rows, len) over `normalized_shape`, its trailing dims.
fn rows_over(op: &'static str, x: &Tensor, normalized_shape: &[usize]) -> Result<NormGeom> {
    let r = x.rank();
    let k = normalized_shape.len();
    if k == 0 || k > r || x.shape()[r - k..] != *normalized_shape {
        return Err(Error::ShapeMismatch {
            op,
            lhs: normalized_shape.to_vec(),
            rhs: x.shape().to_vec(),
        });
    }
    Ok(NormGeom::row(
        x.shape()[..r - k].iter().product(),
        normalized_shape.iter().product(),
    ))
}

/// Layer norm over the trailing dims `normalized_shape` (like
/// `torch.nn.functional.layer_norm`): `(x − mean)/√(var + eps)·w + b`.
///
/// Saves (lean): `x̂` if the input or weight needs grad; per-row rstd and
/// the weight if the input needs grad; nothing for bias only. SaveAll:
/// input, weight, bias, per-row mean and rstd.
pub fn layer_norm(
    x: &Tensor,
    normalized_shape: &[usize],
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
) -> Result<Tensor> {
    layer_norm_reusing(x, normalized_shape, weight, bias, eps, false)
}

/// [`layer_norm`] of an input the caller hands over: the output is written
/// over it when buffer reuse is on and nothing else holds it (the lean
/// policy's backward never reads the input). Same values and gradients.
pub(super) fn layer_norm_owned(
    x: Tensor,
    normalized_shape: &[usize],
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
) -> Result<Tensor> {
    let reuse = may_reuse(&x);
    layer_norm_reusing(&x, normalized_shape, weight, bias, eps, reuse)
}

fn layer_norm_reusing(
    x: &Tensor,
    normalized_shape: &[usize],
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
    reuse: bool,
) -> Result<Tensor> {
    if widens(x) || weight.is_some_and(widens) || bias.is_some_and(widens) {
        let (x, w, b) = (widen(x)?, widen_opt(weight)?, widen_opt(bias)?);
        // The f32 copy is this call's own: the output may go over it.
        let reuse = may_reuse(&x);
        return layer_norm_reusing(&x, normalized_shape, w.as_ref(), b.as_ref(), eps, reuse);
    }
    let geo = rows_over("layer_norm", x, normalized_shape)?;
    let spec = RowNorm {
        name: "layer_norm",
        geo,
        param_shape: normalized_shape,
        weight,
        bias,
        eps,
        centered: true,
    };
    row_norm(x, &spec, reuse)
}

/// RMS norm over the trailing dims `normalized_shape` (like
/// `torch.nn.functional.rms_norm`): `x/√(mean(x²) + eps)·w`; `eps` of
/// `None` is the dtype's machine epsilon.
///
/// Saves (lean): `x̂` if the input or weight needs grad; per-row rstd and
/// the weight if the input needs grad. SaveAll: input, weight, rstd.
pub fn rms_norm(
    x: &Tensor,
    normalized_shape: &[usize],
    weight: Option<&Tensor>,
    eps: Option<f64>,
) -> Result<Tensor> {
    if widens(x) || weight.is_some_and(widens) {
        return rms_norm(
            &widen(x)?,
            normalized_shape,
            widen_opt(weight)?.as_ref(),
            eps,
        );
    }
    let geo = rows_over("rms_norm", x, normalized_shape)?;
    let eps = eps.unwrap_or(match x.dtype() {
        DType::F64 => f64::EPSILON,
        DType::F16 => half::f16::EPSILON.to_f64(),
        DType::BF16 => half::bf16::EPSILON.to_f64(),
        _ => f32::EPSILON as f64,
    });
    let spec = RowNorm {
        name: "rms_norm",
        geo,
        param_shape: normalized_shape,
        weight,
        bias: None,
        eps,
        centered: false,
    };
    row_norm(x, &spec, false)
}

/// Group norm of `x` `[N, C, *]` in `num_groups` groups of channels (like
/// `torch.nn.functional.group_norm`), with per-channel weight and bias.
///
/// Saves (lean): `x̂` if the input or weight needs grad; per-(sample, group)
/// rstd and the weight if the input needs grad. SaveAll: input, weight,
/// mean and rstd.
pub fn group_norm(
    x: &Tensor,
    num_groups: usize,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
) -> Result<Tensor> {
    group_norm_reusing(x, num_groups, weight, bias, eps, false)
}

/// [`group_norm`] of an input the caller hands over, written over it as
/// [`layer_norm_owned`] is.
pub(super) fn group_norm_owned(
    x: Tensor,
    num_groups: usize,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
) -> Result<Tensor> {
    let reuse = may_reuse(&x);
    group_norm_reusing(&x, num_groups, weight, bias, eps, reuse)
}

fn group_norm_reusing(
    x: &Tensor,
    num_groups: usize,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
    reuse: bool,
) -> Result<Tensor> {
    if widens(x) || weight.is_some_and(widens) || bias.is_some_and(widens) {
        let (x, w, b) = (widen(x)?, widen_opt(weight)?, widen_opt(bias)?);
        // The f32 copy is this call's own: the output may go over it.
        let reuse = may_reuse(&x);
        return group_norm_reusing(&x, num_groups, w.as_ref(), b.as_ref(), eps, reuse);
    }
    if x.rank() < 2 {
        return Err(Error::InvalidArgument {
            op: "group_norm",
            msg: format!("expected [N, C, *], got {:?}", x.shape()),
        });
    }
    let c = x.shape()[1];
    let spatial = x.shape()[2..].iter().product();
    let geo = NormGeom::group(x.shape()[0], c, spatial, num_groups)?;
    let spec = RowNorm {
        name: "group_norm",
        geo,
        param_shape: &[c],
        weight,
        bias,
        eps,
        centered: true,
    };
    row_norm(x, &spec, reuse)
}
