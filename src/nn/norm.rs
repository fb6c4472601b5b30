//! Row-wise normalisation as fused ops: layer norm, group norm and RMS norm.
//!
//! Each is one op whose backward holds typed saved state. Under the lean
//! policy it keeps the normalised input `x̂` (input dtype, n elements) only
//! when the input or the weight gradient is needed, the per-row `rstd`
//! (f32, or f64 for f64 inputs) only for the input gradient, and the
//! weight only for the input gradient; a bias-only gradient keeps nothing.
//! Under `SaveAll` it keeps what PyTorch keeps: the input, weight (and bias
//! for layer norm), mean and rstd, and recomputes `x̂` in backward.
//! On CUDA the kernels run on the device and exactly the same tensors are
//! saved (`cpu::norm`'s CUDA arms keep the statistics as host vectors, as
//! the CPU does).

use crate::autograd::{attach, needs_grad, save_policy, BackwardOp, SavePolicy, SavedTensor};
use crate::memory::{with_category, Category};
use crate::primitives::norm::{
    input_grad, norm_stats, normalize, param_grads, round_stat, stat_dtype, Geo, GradMode,
};
use crate::{DType, Error, Result, Tensor};

/// The values of an optional parameter, checked against `shape` and `x`.
pub(crate) fn param_values(
    op: &'static str,
    p: Option<&Tensor>,
    shape: &[usize],
    x: &Tensor,
) -> Result<Option<Vec<f64>>> {
    let Some(p) = p else { return Ok(None) };
    if p.shape() != shape {
        return Err(Error::ShapeMismatch {
            op,
            lhs: shape.to_vec(),
            rhs: p.shape().to_vec(),
        });
    }
    if p.dtype() != x.dtype() {
        return Err(Error::DTypeMismatch {
            op,
            expected: x.dtype(),
            got: p.dtype(),
        });
    }
    if p.device() != x.device() {
        return Err(Error::DeviceMismatch {
            op,
            lhs: x.device(),
            rhs: p.device(),
        });
    }
    Ok(Some(p.small_values()?))
}

/// Which of the input, weight and bias (if given) need a gradient now.
pub(crate) fn optional_needs(x: &Tensor, w: Option<&Tensor>, b: Option<&Tensor>) -> [bool; 3] {
    let [nx] = needs_grad([x]);
    let on = |t: Option<&Tensor>| t.is_some_and(|t| needs_grad([t])[0]);
    [nx, on(w), on(b)]
}

/// The op's inputs in gradient order: the input, then the weight and bias if given.
pub(crate) fn inputs_of<'a>(
    x: &'a Tensor,
    w: Option<&'a Tensor>,
    b: Option<&'a Tensor>,
) -> Vec<&'a Tensor> {
    std::iter::once(x).chain(w).chain(b).collect()
}

/// Gradients in the order of [`inputs_of`] (`present`: weight, bias given).
pub(crate) fn grads_of(
    gx: Option<Tensor>,
    gw: Option<Tensor>,
    gb: Option<Tensor>,
    present: [bool; 2],
) -> Vec<Option<Tensor>> {
    let mut v = vec![gx];
    if present[0] {
        v.push(gw);
    }
    if present[1] {
        v.push(gb);
    }
    v
}

/// A statistics vector as a tensor of the statistics dtype for `x`.
pub(crate) fn stat_tensor(values: &[f64], x: &Tensor) -> Result<Tensor> {
    Tensor::from_host_f64(values, &[values.len()], stat_dtype(x.dtype()), x.device())
}

/// `1/√(v + eps)` per value, rounded to the statistics dtype for `dtype`.
pub(crate) fn rstd_of(var: &[f64], eps: f64, dtype: DType) -> Vec<f64> {
    var.iter()
        .map(|v| round_stat(dtype, 1.0 / (v + eps).sqrt()))
        .collect()
}

/// Recomputes `x̂` from the input and statistics, counted as workspace.
pub(crate) fn recompute_xhat(x: &Tensor, geo: Geo, mean: &[f64], rstd: &[f64]) -> Result<Tensor> {
    let _ws = with_category(Category::Workspace);
    let (_, xh) = normalize(x, geo, mean, rstd, None, None, false, true)?;
    xh.ok_or_else(|| Error::Backward("norm: x̂ not computed".into()))
}

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
    geo: Geo,
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
                rstd.as_ref().map(|t| t.get()?.small_values()).transpose()?,
                weight
                    .as_ref()
                    .map(|t| t.get()?.small_values())
                    .transpose()?,
            ),
            RowSaved::All {
                input,
                weight,
                mean,
                rstd,
                ..
            } => {
                let rstd = rstd.get()?.small_values()?;
                let mean = match mean {
                    Some(m) => m.get()?.small_values()?,
                    None => vec![0.0; rstd.len()],
                };
                let xhat = (nx || nw)
                    .then(|| recompute_xhat(input.get()?, geo, &mean, &rstd))
                    .transpose()?;
                let w = weight
                    .as_ref()
                    .map(|t| t.get()?.small_values())
                    .transpose()?;
                (xhat, Some(rstd), w)
            }
        };
        let gx = if nx {
            let rstd = rstd.ok_or_else(|| Error::Backward("norm: rstd missing".into()))?;
            Some(input_grad(
                &g,
                xhat.as_ref(),
                geo,
                self.mode,
                &rstd,
                w.as_deref(),
            )?)
        } else {
            None
        };
        let (gw, gb) = if nw || nb {
            let xh = xhat.as_ref().filter(|_| nw);
            param_grads(&g, xh, geo, nb, &self.param_shape)?
        } else {
            (None, None)
        };
        Ok(grads_of(gx, gw, gb, self.present))
    }
}

/// The shared forward of the row norms.
#[allow(clippy::too_many_arguments)]
fn row_norm(
    name: &'static str,
    x: &Tensor,
    geo: Geo,
    param_shape: &[usize],
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
    centered: bool,
) -> Result<Tensor> {
    crate::ops::expect_float(name, x)?;
    let w = param_values(name, weight, param_shape, x)?;
    let b = param_values(name, bias, param_shape, x)?;
    let (mean, var) = norm_stats(x, geo, centered)?;
    let dt = x.dtype();
    let mean: Vec<f64> = mean.iter().map(|m| round_stat(dt, *m)).collect();
    let rstd = rstd_of(&var, eps, dt);
    let [nx, nw, nb] = optional_needs(x, weight, bias);
    let lean = save_policy() == SavePolicy::Lean;
    let want_xhat = lean && (nx || nw);
    let (y, xhat) = normalize(
        x,
        geo,
        &mean,
        &rstd,
        w.as_deref(),
        b.as_deref(),
        true,
        want_xhat,
    )?;
    let y = y.ok_or_else(|| Error::Backward("norm: output not computed".into()))?;
    if !(nx || nw || nb) {
        return Ok(y);
    }
    let saved = if lean {
        RowSaved::Lean {
            xhat: xhat.as_ref().map(|t| SavedTensor::new(t, name)),
            rstd: nx
                .then(|| stat_tensor(&rstd, x).map(|t| SavedTensor::new(&t, name)))
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
                .then(|| stat_tensor(&mean, x).map(|t| SavedTensor::new(&t, name)))
                .transpose()?,
            rstd: SavedTensor::new(&stat_tensor(&rstd, x)?, name),
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
fn rows_over(op: &'static str, x: &Tensor, normalized_shape: &[usize]) -> Result<Geo> {
    let r = x.rank();
    let k = normalized_shape.len();
    if k == 0 || k > r || x.shape()[r - k..] != *normalized_shape {
        return Err(Error::ShapeMismatch {
            op,
            lhs: normalized_shape.to_vec(),
            rhs: x.shape().to_vec(),
        });
    }
    Ok(Geo::Row {
        rows: x.shape()[..r - k].iter().product(),
        len: normalized_shape.iter().product(),
    })
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
    let geo = rows_over("layer_norm", x, normalized_shape)?;
    row_norm(
        "layer_norm",
        x,
        geo,
        normalized_shape,
        weight,
        bias,
        eps,
        true,
    )
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
    let geo = rows_over("rms_norm", x, normalized_shape)?;
    let eps = eps.unwrap_or(match x.dtype() {
        DType::F64 => f64::EPSILON,
        DType::F16 => half::f16::EPSILON.to_f64(),
        DType::BF16 => half::bf16::EPSILON.to_f64(),
        _ => f32::EPSILON as f64,
    });
    row_norm(
        "rms_norm",
        x,
        geo,
        normalized_shape,
        weight,
        None,
        eps,
        false,
    )
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
    if x.rank() < 2 {
        return Err(Error::InvalidArgument {
            op: "group_norm",
            msg: format!("expected [N, C, *], got {:?}", x.shape()),
        });
    }
    let c = x.shape()[1];
    if num_groups == 0 || !c.is_multiple_of(num_groups) {
        return Err(Error::InvalidArgument {
            op: "group_norm",
            msg: format!("{num_groups} groups do not divide {c} channels"),
        });
    }
    let geo = Geo::Group {
        n: x.shape()[0],
        c,
        spatial: x.shape()[2..].iter().product(),
        groups: num_groups,
    };
    row_norm("group_norm", x, geo, &[c], weight, bias, eps, true)
}
