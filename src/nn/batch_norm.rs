//! Batch normalisation (`BatchNorm1d` over `[N, C]` / `[N, C, L]`,
//! `BatchNorm2d` over `[N, C, H, W]`) as one fused op.
//!
//! Saved for backward under the lean policy (`n` = input elements, `C` =
//! channels, statistics in f32, or f64 for f64 inputs):
//! - train mode: the input gradient keeps `x̂` (n, input dtype) and
//!   `scale = weight·invstd` (C statistics); the weight gradient keeps `x̂`;
//!   the bias gradient keeps nothing.
//! - eval mode (running statistics: an affine map): the input gradient keeps
//!   only `scale = weight·invstd` (C); the weight gradient keeps `x̂` (n) —
//!   cheaper than the input plus two C-sized statistics, and immune to later
//!   updates of the running statistics; the bias gradient keeps nothing.
//!
//! Under `SaveAll` it keeps what PyTorch keeps: the input, the weight, the
//! running mean and variance, and in train mode `save_mean`/`save_invstd`.

use super::norm::{
    grad_tensor, grads_of, inputs_of, optional_needs, param_values, recompute_xhat, rstd_of,
    stat_tensor,
};
use super::Module;
use crate::autograd::{attach, save_policy, BackwardOp, SavePolicy, SavedTensor};
use crate::cpu::norm::{
    input_grad, norm_stats, normalize, param_grads, round_stat, write_values, Geo, GradMode,
};
use crate::memory::scope;
use crate::{DType, Device, Error, Result, Tensor};

enum BnSaved {
    Lean {
        xhat: Option<SavedTensor>,
        scale: Option<SavedTensor>,
    },
    All {
        input: SavedTensor,
        weight: Option<SavedTensor>,
        running: Option<(SavedTensor, SavedTensor)>,
        /// `save_mean`, `save_invstd` (train mode only).
        batch: Option<(SavedTensor, SavedTensor)>,
    },
}

/// Backward of batch norm (see the module doc for what is kept).
struct BatchNormBackward {
    geo: Geo,
    train: bool,
    eps: f64,
    needs: [bool; 3],
    present: [bool; 2],
    dtype: DType,
    saved: BnSaved,
}

/// `weight·invstd` per channel (or `invstd`), rounded to the statistics dtype.
fn scale_of(w: Option<&[f64]>, invstd: &[f64], dtype: DType) -> Vec<f64> {
    match w {
        Some(w) => w
            .iter()
            .zip(invstd)
            .map(|(w, s)| round_stat(dtype, w * s))
            .collect(),
        None => invstd.to_vec(),
    }
}

impl BackwardOp for BatchNormBackward {
    fn name(&self) -> &'static str {
        "batch_norm"
    }
    fn backward(self: Box<Self>, g: Tensor) -> Result<Vec<Option<Tensor>>> {
        let [nx, nw, nb] = self.needs;
        let geo = self.geo;
        let (xhat, scale) = match &self.saved {
            BnSaved::Lean { xhat, scale } => (
                xhat.as_ref().map(|t| t.get().cloned()).transpose()?,
                scale.as_ref().map(|t| t.get()?.to_f64_vec()).transpose()?,
            ),
            BnSaved::All {
                input,
                weight,
                running,
                batch,
            } => {
                let (mean, invstd) = match (self.train, batch, running) {
                    (true, Some((m, s)), _) => (m.get()?.to_f64_vec()?, s.get()?.to_f64_vec()?),
                    (false, _, Some((rm, rv))) => (
                        rm.get()?.to_f64_vec()?,
                        rstd_of(&rv.get()?.to_f64_vec()?, self.eps, self.dtype),
                    ),
                    _ => return Err(Error::Backward("batch_norm: statistics missing".into())),
                };
                let xhat = ((self.train && nx) || nw)
                    .then(|| recompute_xhat(input.get()?, geo, &mean, &invstd))
                    .transpose()?;
                let w = weight.as_ref().map(|t| t.get()?.to_f64_vec()).transpose()?;
                (
                    xhat,
                    nx.then(|| scale_of(w.as_deref(), &invstd, self.dtype)),
                )
            }
        };
        let gx = if nx {
            let scale = scale.ok_or_else(|| Error::Backward("batch_norm: scale missing".into()))?;
            let (mode, xh) = if self.train {
                (GradMode::Centered, xhat.as_ref())
            } else {
                (GradMode::Affine, None)
            };
            Some(input_grad(&g, xh, geo, mode, &scale, None)?)
        } else {
            None
        };
        let (gw, gb) = if nw || nb {
            param_grads(&g, xhat.as_ref().filter(|_| nw), geo, nb)?
        } else {
            (None, None)
        };
        let c = [geo.nparam()];
        let gw = gw.map(|v| grad_tensor(v, &c, self.dtype)).transpose()?;
        let gb = gb.map(|v| grad_tensor(v, &c, self.dtype)).transpose()?;
        Ok(grads_of(gx, gw, gb, self.present))
    }
}

fn running_values(op: &'static str, t: &Tensor, c: usize, x: &Tensor) -> Result<Vec<f64>> {
    if t.requires_grad() {
        return Err(Error::InvalidArgument {
            op,
            msg: "running statistics must not require grad".into(),
        });
    }
    param_values(op, Some(t), &[c], x).map(|v| v.unwrap_or_default())
}

/// Batch norm of `x` `[N, C, *]` (like `torch.nn.functional.batch_norm`).
///
/// With `training` (batch statistics): normalises with the biased batch
/// variance and, if running statistics are given, updates them in place
/// (not recorded by autograd): `r ← (1−momentum)·r + momentum·s`, the
/// variance with the unbiased batch variance. Without `training` it uses
/// the running statistics (required). Saves what the module doc lists.
#[allow(clippy::too_many_arguments)]
pub fn batch_norm(
    x: &Tensor,
    running_mean: Option<&Tensor>,
    running_var: Option<&Tensor>,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    training: bool,
    momentum: f64,
    eps: f64,
) -> Result<Tensor> {
    const OP: &str = "batch_norm";
    crate::ops::expect_float(OP, x)?;
    if x.rank() < 2 {
        return Err(Error::InvalidArgument {
            op: OP,
            msg: format!("expected [N, C, *], got {:?}", x.shape()),
        });
    }
    let (c, dt) = (x.shape()[1], x.dtype());
    let geo = Geo::Channel {
        outer: x.shape()[0],
        c,
        inner: x.shape()[2..].iter().product(),
    };
    let w = param_values(OP, weight, &[c], x)?;
    let b = param_values(OP, bias, &[c], x)?;
    let running = match (running_mean, running_var) {
        (Some(m), Some(v)) => Some((m, v)),
        (None, None) => None,
        _ => {
            return Err(Error::InvalidArgument {
                op: OP,
                msg: "give both running_mean and running_var, or neither".into(),
            })
        }
    };
    let run_vals = running
        .map(|(m, v)| Ok::<_, Error>((running_values(OP, m, c, x)?, running_values(OP, v, c, x)?)))
        .transpose()?;
    let (mean, invstd) = if training {
        let count = geo.count();
        if count <= 1 {
            return Err(Error::InvalidArgument {
                op: OP,
                msg: format!(
                    "expected more than 1 value per channel when training, got {:?}",
                    x.shape()
                ),
            });
        }
        let (mean, var) = norm_stats(x, geo, true)?;
        if let (Some((rm, rv)), Some((om, ov))) = (running, &run_vals) {
            let unbias = count as f64 / (count as f64 - 1.0);
            let upd = |old: &[f64], new: &[f64], k: f64| -> Vec<f64> {
                old.iter()
                    .zip(new)
                    .map(|(o, n)| (1.0 - momentum) * o + momentum * n * k)
                    .collect()
            };
            write_values(rm, &upd(om, &mean, 1.0))?;
            write_values(rv, &upd(ov, &var, unbias))?;
        }
        let mean: Vec<f64> = mean.iter().map(|m| round_stat(dt, *m)).collect();
        (mean, rstd_of(&var, eps, dt))
    } else {
        let (rm, rv) = run_vals.ok_or(Error::InvalidArgument {
            op: OP,
            msg: "eval mode needs running statistics".into(),
        })?;
        (rm, rstd_of(&rv, eps, dt))
    };
    let [nx, nw, nb] = optional_needs(x, weight, bias);
    let lean = save_policy() == SavePolicy::Lean;
    let want_xhat = lean && ((training && nx) || nw);
    let (y, xhat) = normalize(
        x,
        geo,
        &mean,
        &invstd,
        w.as_deref(),
        b.as_deref(),
        true,
        want_xhat,
    )?;
    let y = y.ok_or_else(|| Error::Backward("batch_norm: output not computed".into()))?;
    if !(nx || nw || nb) {
        return Ok(y);
    }
    let save = |t: &Tensor| SavedTensor::new(t, OP);
    let saved = if lean {
        BnSaved::Lean {
            xhat: xhat.as_ref().map(save),
            scale: nx
                .then(|| stat_tensor(&scale_of(w.as_deref(), &invstd, dt), x))
                .transpose()?
                .as_ref()
                .map(save),
        }
    } else {
        BnSaved::All {
            input: save(x),
            weight: weight.map(save),
            running: running.map(|(m, v)| (save(m), save(v))),
            batch: training
                .then(|| {
                    Ok::<_, Error>((
                        save(&stat_tensor(&mean, x)?),
                        save(&stat_tensor(&invstd, x)?),
                    ))
                })
                .transpose()?,
        }
    };
    let op = BatchNormBackward {
        geo,
        train: training,
        eps,
        needs: [nx, nw, nb],
        present: [weight.is_some(), bias.is_some()],
        dtype: dt,
        saved,
    };
    Ok(attach(y, &inputs_of(x, weight, bias), op))
}

/// Options of [`BatchNorm`], with PyTorch's defaults.
#[derive(Clone, Copy, Debug)]
pub struct BatchNormOptions {
    /// Added to the variance (default 1e-5).
    pub eps: f64,
    /// Running-statistics factor; `None` = cumulative average (default 0.1).
    pub momentum: Option<f64>,
    /// Learnable per-channel weight (ones) and bias (zeros) (default true).
    pub affine: bool,
    /// Keep running statistics for eval mode (default true).
    pub track_running_stats: bool,
}

impl Default for BatchNormOptions {
    fn default() -> Self {
        BatchNormOptions {
            eps: 1e-5,
            momentum: Some(0.1),
            affine: true,
            track_running_stats: true,
        }
    }
}

/// `torch.nn.BatchNorm1d` (`[N, C]` or `[N, C, L]`) and `BatchNorm2d`
/// (`[N, C, H, W]`). Starts in training mode. Saves what [`batch_norm`]
/// saves (see the module doc).
pub struct BatchNorm {
    /// `[C]` weight (ones), if affine.
    pub weight: Option<Tensor>,
    /// `[C]` bias (zeros), if affine.
    pub bias: Option<Tensor>,
    /// `[C]` running mean (zeros), if tracked.
    pub running_mean: Option<Tensor>,
    /// `[C]` running variance (ones), if tracked.
    pub running_var: Option<Tensor>,
    /// Scalar i64 count of training batches, if tracked.
    pub num_batches_tracked: Option<Tensor>,
    options: BatchNormOptions,
    num_features: usize,
    ranks: &'static [usize],
    training: bool,
    name: String,
}

impl BatchNorm {
    fn new(
        name: &str,
        num_features: usize,
        options: BatchNormOptions,
        ranks: &'static [usize],
        dtype: DType,
        device: Device,
    ) -> Result<BatchNorm> {
        let c = [num_features];
        let param = |v: f64| Tensor::full(&c, v, dtype, device)?.into_parameter();
        let tracked = options.track_running_stats;
        Ok(BatchNorm {
            weight: options.affine.then(|| param(1.0)).transpose()?,
            bias: options.affine.then(|| param(0.0)).transpose()?,
            running_mean: tracked
                .then(|| Tensor::zeros(&c, dtype, device))
                .transpose()?,
            running_var: tracked
                .then(|| Tensor::ones(&c, dtype, device))
                .transpose()?,
            num_batches_tracked: tracked
                .then(|| Tensor::zeros(&[], DType::I64, device))
                .transpose()?,
            options,
            num_features,
            ranks,
            training: true,
            name: name.to_string(),
        })
    }

    /// `BatchNorm1d`: inputs `[N, C]` or `[N, C, L]`.
    pub fn new1d(
        name: &str,
        num_features: usize,
        options: BatchNormOptions,
        dtype: DType,
        device: Device,
    ) -> Result<BatchNorm> {
        BatchNorm::new(name, num_features, options, &[2, 3], dtype, device)
    }

    /// `BatchNorm2d`: inputs `[N, C, H, W]`.
    pub fn new2d(
        name: &str,
        num_features: usize,
        options: BatchNormOptions,
        dtype: DType,
        device: Device,
    ) -> Result<BatchNorm> {
        BatchNorm::new(name, num_features, options, &[4], dtype, device)
    }

    /// Whether the layer is in training mode.
    pub fn is_training(&self) -> bool {
        self.training
    }
}

impl Module for BatchNorm {
    /// Normalises `x`; in training mode (or without running statistics)
    /// with batch statistics, updating the running statistics and
    /// `num_batches_tracked`; in eval mode with the running statistics.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let _s = scope(self.name.clone());
        if !self.ranks.contains(&x.rank()) {
            return Err(Error::InvalidArgument {
                op: "batch_norm",
                msg: format!("expected rank {:?}, got shape {:?}", self.ranks, x.shape()),
            });
        }
        if x.shape()[1] != self.num_features {
            return Err(Error::ShapeMismatch {
                op: "batch_norm",
                lhs: vec![self.num_features],
                rhs: x.shape().to_vec(),
            });
        }
        let mut factor = self.options.momentum.unwrap_or(0.0);
        if self.training {
            if let Some(n) = &self.num_batches_tracked {
                let count = n.to_scalar()? + 1.0;
                write_values(n, &[count])?;
                if self.options.momentum.is_none() {
                    factor = 1.0 / count;
                }
            }
        }
        let use_batch = self.training || self.running_mean.is_none();
        batch_norm(
            x,
            self.running_mean.as_ref(),
            self.running_var.as_ref(),
            self.weight.as_ref(),
            self.bias.as_ref(),
            use_batch,
            factor,
            self.options.eps,
        )
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let mut p: Vec<(String, Tensor)> = Vec::new();
        p.extend(self.weight.clone().map(|t| ("weight".to_string(), t)));
        p.extend(self.bias.clone().map(|t| ("bias".to_string(), t)));
        p
    }

    fn named_buffers(&self) -> Vec<(String, Tensor)> {
        let mut b: Vec<(String, Tensor)> = Vec::new();
        b.extend(
            self.running_mean
                .clone()
                .map(|t| ("running_mean".to_string(), t)),
        );
        b.extend(
            self.running_var
                .clone()
                .map(|t| ("running_var".to_string(), t)),
        );
        b.extend(
            self.num_batches_tracked
                .clone()
                .map(|t| ("num_batches_tracked".to_string(), t)),
        );
        b
    }

    fn set_training(&mut self, training: bool) {
        self.training = training;
    }
}
