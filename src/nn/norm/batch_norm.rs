//! Batch normalisation (`BatchNorm1d` over `[N, C]` / `[N, C, L]`,
//! `BatchNorm2d` over `[N, C, H, W]`) as one fused op, and its backward.
//!
//! Saved for backward under the lean policy (`n` = input elements, `C` =
//! channels, statistics in f32, or f64 for f64 inputs; the family's table
//! is in `norm/mod.rs`):
//! - train mode: the input gradient keeps `x̂` (n, input dtype) and
//!   `scale = weight·invstd` (C statistics); the weight gradient keeps `x̂`;
//!   the bias gradient keeps nothing.
//! - eval mode (running statistics: an affine map): the input gradient keeps
//!   only `scale = weight·invstd` (C), or nothing when the weight and the
//!   running variance are model state (it reads them in backward); the
//!   weight gradient keeps `x̂` (n) — cheaper than the input plus two
//!   C-sized statistics, and immune to later updates of the running
//!   statistics; the bias gradient keeps nothing.
//!
//! Under `SaveAll` it keeps what PyTorch keeps: the input, the weight, the
//! running mean and variance, and in train mode `save_mean`/`save_invstd`.
//!
//! The running statistics (and `num_batches_tracked`) are updated in
//! place, in f64 from the unrounded batch moments, by the same pass that
//! rounds the statistics; on CUDA nothing crosses to the host.

use super::sync::{synced_input_grad, synced_moments, SyncedGrad};
use super::{
    check_param, grads_of, input_grad, inputs_of, norm_stats, normalize, normalize_relu,
    optional_needs, param_grads, prepare, recompute_xhat, scale_tensor, stat_sums, GradMode,
    GradScale, NormGeom, Normalize, Prep, Prepared, ReluMask, RunningUpdate, StatSource,
};
use crate::autograd::{attach, may_reuse, save_policy, BackwardOp, SavePolicy, SavedTensor};
use crate::memory::uncounted;
use crate::nn::BatchStatsSync;
use crate::ops::autocast::widens;
use crate::ops::relu_applied_in_place;
use crate::primitives::contiguous_copy;
use crate::{DType, Error, Result, Tensor};
use std::sync::Arc;

/// Where the lean input gradient's per-channel `weight·invstd` comes from.
enum Scale {
    /// A C-sized vector made in forward.
    Vector(SavedTensor),
    /// Eval mode with model-state weight and running variance: references to
    /// tensors alive anyway, so the input gradient costs no bytes at all.
    FromState {
        weight: Option<SavedTensor>,
        running_var: SavedTensor,
    },
}

enum BnSaved {
    Lean {
        xhat: Option<SavedTensor>,
        scale: Option<Scale>,
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
    geo: NormGeom,
    train: bool,
    eps: f64,
    needs: [bool; 3],
    present: [bool; 2],
    /// The dtype backward computes in (the input's, f32 under autocast).
    dtype: DType,
    /// The dtype `x̂` (or the input) was kept in: `dtype`, or autocast's.
    kept: DType,
    saved: BnSaved,
    /// Train mode over several ranks: the group and the global count per
    /// channel (`[1]` f64, outside the ledger).
    sync: Option<(Arc<dyn BatchStatsSync>, Tensor)>,
}

/// A [`Prep`] from `mean` and `var` of `source` that wants nothing yet.
fn prep<'a>(
    source: StatSource,
    mean: Option<&'a Tensor>,
    var: &'a Tensor,
    eps: f64,
    dtype: DType,
) -> Prep<'a> {
    Prep {
        source,
        mean,
        var,
        eps,
        dtype,
        update: None,
        want_mean: false,
        want_rstd: false,
        want_scale: false,
        weight: None,
    }
}

impl BatchNormBackward {
    /// A kept tensor in the dtype backward computes in (a Workspace copy
    /// when it was kept in autocast's dtype).
    fn widened(&self, t: &Tensor) -> Result<Tensor> {
        if t.dtype() == self.dtype {
            return Ok(t.clone());
        }
        let _ws = crate::memory::with_category(crate::memory::Category::Workspace);
        t.to_dtype(self.dtype)
    }

    /// The saved `x̂` (or recomputed, under SaveAll) and the input
    /// gradient's `scale` per channel, each when needed.
    fn xhat_and_scale(&self) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let [nx, nw, _] = self.needs;
        let (geo, eps, dt) = (self.geo, self.eps, self.dtype);
        match &self.saved {
            BnSaved::Lean { xhat, scale } => {
                let xhat = xhat.as_ref().map(|t| self.widened(t.get()?)).transpose()?;
                let scale = match scale {
                    None => None,
                    Some(Scale::Vector(t)) => Some(t.get()?.clone()),
                    Some(Scale::FromState {
                        weight,
                        running_var,
                    }) => {
                        let w = weight.as_ref().map(|t| t.get().cloned()).transpose()?;
                        let rv = running_var.get()?.clone();
                        let mut p = prep(StatSource::Running, None, &rv, eps, dt);
                        p.want_scale = true;
                        p.weight = w.as_ref();
                        prepare(&p)?.scale
                    }
                };
                Ok((xhat, scale))
            }
            BnSaved::All {
                input,
                weight,
                running,
                batch,
            } => {
                let (mean, invstd) = match (self.train, batch, running) {
                    (true, Some((m, s)), _) => (m.get()?.clone(), s.get()?.clone()),
                    (false, _, Some((rm, rv))) => {
                        let (rm, rv) = (rm.get()?.clone(), rv.get()?.clone());
                        let mut p = prep(StatSource::Running, Some(&rm), &rv, eps, dt);
                        (p.want_mean, p.want_rstd) = (true, true);
                        let got = prepare(&p)?;
                        let missing = || Error::Backward("batch_norm: statistics missing".into());
                        (got.mean.ok_or_else(missing)?, got.rstd.ok_or_else(missing)?)
                    }
                    _ => return Err(Error::Backward("batch_norm: statistics missing".into())),
                };
                let xhat = ((self.train && nx) || nw)
                    .then(|| {
                        let input = self.widened(input.get()?)?;
                        let xh = recompute_xhat(&input, geo, Some(&mean), &invstd)?;
                        // Rounded as the lean policy keeps it: the same bits.
                        match self.kept == self.dtype {
                            true => Ok(xh),
                            false => self.widened(&xh.to_dtype_owned(self.kept)?),
                        }
                    })
                    .transpose()?;
                let w = weight.as_ref().map(|t| t.get().cloned()).transpose()?;
                let scale = nx
                    .then(|| uncounted(|| scale_tensor(w.as_ref(), &invstd)))
                    .transpose()?;
                Ok((xhat, scale))
            }
        }
    }
}

impl BackwardOp for BatchNormBackward {
    fn name(&self) -> &'static str {
        "batch_norm"
    }
    fn backward(self: Box<Self>, g: Tensor) -> Result<Vec<Option<Tensor>>> {
        let [nx, nw, nb] = self.needs;
        let geo = self.geo;
        let (xhat, scale) = self.xhat_and_scale()?;
        if self.train && nx && self.sync.is_some() {
            let BatchNormBackward {
                saved,
                sync,
                present,
                ..
            } = *self;
            // The node's saved `x̂` goes now: ours may then be written over.
            drop(saved);
            let missing = || Error::Backward("sync_batch_norm: saved state missing".into());
            let (sync, count) = sync.ok_or_else(missing)?;
            let how = SyncedGrad {
                xhat: xhat.ok_or_else(missing)?,
                scale: &scale.ok_or_else(missing)?,
                count: &count,
                sync: sync.as_ref(),
            };
            let (gx, gw, gb) = synced_input_grad(g, geo, how)?;
            return Ok(grads_of(
                Some(gx),
                nw.then_some(gw),
                nb.then_some(gb),
                present,
            ));
        }
        // In train mode with x̂ at hand the weight and bias gradients are the
        // sums the input gradient's means need (one statistic per channel,
        // one parameter per channel): one pass makes all of them (on the
        // CPU; other devices sum on their own).
        let sums = match (&xhat, self.train && nx) {
            (Some(xh), true) => stat_sums(&g, xh, geo)?,
            _ => None,
        };
        // The parameters' sums read `g` first: the input gradient may then
        // be written over it.
        let (gw, gb) = if let Some(sums) = sums.as_ref().filter(|_| nw || nb) {
            let wrap = |want: bool, pick: fn(&(f64, f64)) -> f64| {
                want.then(|| {
                    let v: Vec<f64> = sums.iter().map(pick).collect();
                    Tensor::from_host_f64(&v, &[geo.nparam()], g.dtype(), g.device())
                })
                .transpose()
            };
            (wrap(nw, |s| s.1)?, wrap(nb, |s| s.0)?)
        } else if nw || nb {
            let xh = xhat.as_ref().filter(|_| nw);
            param_grads(&g, xh, geo, nb, &[geo.nparam()])?
        } else {
            (None, None)
        };
        let gx = if nx {
            let scale = scale.ok_or_else(|| Error::Backward("batch_norm: scale missing".into()))?;
            let (mode, xh) = if self.train {
                (GradMode::Centered, xhat.as_ref())
            } else {
                (GradMode::Affine, None)
            };
            let by = GradScale {
                scale: &scale,
                w: None,
            };
            Some(input_grad(g, xh, geo, mode, by, sums.as_deref())?)
        } else {
            None
        };
        Ok(grads_of(gx, gw, gb, self.present))
    }
}

/// Checks a running statistic (it must not require grad).
fn check_running(op: &'static str, t: &Tensor, c: usize, x: &Tensor) -> Result<()> {
    if t.requires_grad() {
        return Err(Error::InvalidArgument {
            op,
            msg: "running statistics must not require grad".into(),
        });
    }
    check_param(op, Some(t), &[c], x)
}

/// Batch norm of `x` `[N, C, *]` (like `torch.nn.functional.batch_norm`).
///
/// With `training` (batch statistics): normalises with the biased batch
/// variance and, if running statistics are given, updates them in place
/// (not recorded by autograd): `r ← (1−momentum)·r + momentum·s`, the
/// variance with the unbiased batch variance. Without `training` it uses
/// the running statistics (required).
///
/// Saves (lean): train mode `x̂` and C-sized `weight·invstd` for the input
/// gradient, `x̂` for the weight gradient; eval mode `weight·invstd` alone
/// for the input gradient, `x̂` for the weight gradient; nothing for the
/// bias gradient alone. SaveAll: input, weight, running statistics, and in
/// train mode `save_mean`/`save_invstd` (see the module doc).
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
    let state = BnState {
        running_mean,
        running_var,
        weight,
        bias,
        num_batches_tracked: None,
        sync: None,
    };
    let mode = Mode {
        training,
        momentum,
        eps,
    };
    batch_norm_borrowed(x, &state, mode)
}

/// [`batch_norm`] with its tensors and mode gathered (never writes `x`).
pub(super) fn batch_norm_borrowed(x: &Tensor, state: &BnState<'_>, mode: Mode) -> Result<Tensor> {
    run(x, state, mode, false, false)?.without_relu()
}

/// The tensors batch norm reads besides its input.
pub(super) struct BnState<'a> {
    pub running_mean: Option<&'a Tensor>,
    pub running_var: Option<&'a Tensor>,
    pub weight: Option<&'a Tensor>,
    pub bias: Option<&'a Tensor>,
    /// Incremented with the running statistics' update (train mode).
    pub num_batches_tracked: Option<&'a Tensor>,
    /// The ranks whose batches are normalised together (train mode,
    /// `SyncBatchNorm`); `None`: this batch alone.
    pub sync: Option<&'a Arc<dyn BatchStatsSync>>,
}

/// Batch statistics or running ones, the running statistics' momentum and
/// the variance's epsilon.
#[derive(Clone, Copy)]
pub(super) struct Mode {
    pub training: bool,
    pub momentum: f64,
    pub eps: f64,
}

/// [`batch_norm`] of an input the caller hands over: the output is written
/// over `x`'s storage when buffer reuse is on, nothing else holds `x`, and
/// backward will not read `x` (the lean policy never saves it; SaveAll
/// does whenever a node is recorded). Values, gradients and saved tensors
/// are those of [`batch_norm`].
pub(super) fn batch_norm_owned(x: Tensor, state: &BnState<'_>, mode: Mode) -> Result<Tensor> {
    if widens(&x) {
        return run_autocast(x, state, mode)?.without_relu();
    }
    let reuse = may_reuse(&x);
    run(&x, state, mode, reuse, false)?.without_relu()
}

/// [`batch_norm_owned`] to be followed by an in-place ReLU
/// ([`NormThenRelu::finish`], which the caller runs outside the norm's
/// scope, where the ReLU would run): the same values, nodes and saved
/// tensors as the two ops one after the other. Where the output goes over
/// `x` under the lean policy and the device has the kernel (CUDA), the ReLU
/// and its mask come from the norm's own pass: one launch instead of two,
/// the same bits.
pub(super) fn batch_norm_relu_owned(
    x: Tensor,
    state: &BnState<'_>,
    mode: Mode,
) -> Result<NormThenRelu> {
    if widens(&x) {
        return run_autocast(x, state, mode);
    }
    let reuse = may_reuse(&x);
    run(&x, state, mode, reuse, true)
}

/// A batch norm's output and the ReLU still to be recorded over it.
pub(super) struct NormThenRelu {
    y: Tensor,
    /// The mask when the norm's kernel already applied the ReLU.
    applied: Option<ReluMask>,
}

impl From<Tensor> for NormThenRelu {
    /// A norm's output with no ReLU applied.
    fn from(y: Tensor) -> Self {
        NormThenRelu { y, applied: None }
    }
}

impl NormThenRelu {
    /// The output without a ReLU (for callers that asked for none).
    pub(super) fn without_relu(self) -> Result<Tensor> {
        match self.applied {
            None => Ok(self.y),
            Some(_) => Err(Error::Backward(
                "batch_norm: a ReLU was applied that was not asked for".into(),
            )),
        }
    }

    /// The ReLU in place over the output: its node and mask recorded over
    /// the values the fused kernel made, or `relu_inplace` run now.
    pub(super) fn finish(self) -> Result<Tensor> {
        match self.applied {
            Some(mask) => relu_applied_in_place(self.y, || mask.into_tensor()),
            None => self.y.relu_inplace(),
        }
    }
}

/// The statistics a batch norm normalises with.
struct Statistics {
    /// Per-channel mean, statistics dtype, outside the ledger.
    mean: Tensor,
    /// Per-channel `invstd`, statistics dtype, outside the ledger.
    invstd: Tensor,
    /// Train mode over several ranks: the global count per channel (`[1]`
    /// f64), which the input gradient divides by.
    global_count: Option<Tensor>,
}

/// The per-channel mean and `invstd` batch norm normalises with (outside
/// the ledger): the batch's (over every rank when synchronised), updating
/// the running statistics, in train mode; the running statistics'
/// otherwise.
fn statistics(x: &Tensor, geo: NormGeom, state: &BnState<'_>, mode: Mode) -> Result<Statistics> {
    const OP: &str = "batch_norm";
    let running = match (state.running_mean, state.running_var) {
        (Some(m), Some(v)) => Some((m, v)),
        (None, None) => None,
        _ => {
            return Err(Error::InvalidArgument {
                op: OP,
                msg: "give both running_mean and running_var, or neither".into(),
            })
        }
    };
    if let Some((m, v)) = running {
        check_running(OP, m, geo.s, x)?;
        check_running(OP, v, geo.s, x)?;
    }
    let (got, global_count) = if mode.training {
        batch_statistics(x, geo, state, mode, running)?
    } else {
        let (rm, rv) = running.ok_or(Error::InvalidArgument {
            op: OP,
            msg: "eval mode needs running statistics".into(),
        })?;
        let mut p = prep(StatSource::Running, Some(rm), rv, mode.eps, x.dtype());
        (p.want_mean, p.want_rstd) = (true, true);
        (prepare(&p)?, None)
    };
    let missing = || Error::Backward("batch_norm: statistics not computed".into());
    Ok(Statistics {
        mean: got.mean.ok_or_else(missing)?,
        invstd: got.rstd.ok_or_else(missing)?,
        global_count,
    })
}

/// Train mode's statistics: the batch's moments (combined over every rank
/// when `state.sync` says so), rounded, the running statistics moved with
/// them; and the global count when synchronised.
fn batch_statistics(
    x: &Tensor,
    geo: NormGeom,
    state: &BnState<'_>,
    mode: Mode,
    running: Option<(&Tensor, &Tensor)>,
) -> Result<(Prepared, Option<Tensor>)> {
    let count = geo.count();
    // Over several ranks one value here is enough: there are others.
    let least = if state.sync.is_some() { 1 } else { 2 };
    if count < least {
        return Err(Error::InvalidArgument {
            op: "batch_norm",
            msg: format!(
                "expected more than 1 value per channel when training, got {:?}",
                x.shape()
            ),
        });
    }
    let (mean, var) = norm_stats(x, geo, true)?;
    let dt = x.dtype();
    // A checkpointed segment's recompute leaves them: its forward moved them.
    let update = running.filter(|_| !crate::autograd::is_recomputing());
    let moving = |unbias: f64| {
        update.map(|(m, v)| RunningUpdate {
            mean: m,
            var: v,
            momentum: mode.momentum,
            unbias,
            counter: state.num_batches_tracked,
        })
    };
    let Some(sync) = state.sync else {
        let mut p = prep(StatSource::Moments, Some(&mean), &var, mode.eps, dt);
        p.update = moving(count as f64 / (count as f64 - 1.0));
        (p.want_mean, p.want_rstd) = (true, true);
        return Ok((prepare(&p)?, None));
    };
    let all = synced_moments(&mean, &var, count, sync.as_ref())?;
    let mut p = prep(StatSource::Moments, Some(&all.mean), &all.var, mode.eps, dt);
    (p.want_mean, p.want_rstd) = (true, true);
    let got = prepare(&p)?;
    // The global count is on the device: the running variance moves with
    // the variance already unbiased there.
    if update.is_some() {
        let mut q = prep(
            StatSource::Moments,
            Some(&all.mean),
            &all.var_unbiased,
            mode.eps,
            dt,
        );
        q.update = moving(1.0);
        prepare(&q)?;
    }
    Ok((got, Some(all.count)))
}

/// Batch norm of `x` (written over it when `reuse`), with the ReLU after it
/// applied by the norm's kernel where `relu` asks for one and the kernel
/// can (see [`batch_norm_relu_owned`]).
fn run(
    x: &Tensor,
    state: &BnState<'_>,
    mode: Mode,
    reuse: bool,
    relu: bool,
) -> Result<NormThenRelu> {
    if widens(x) {
        return run_autocast(x.clone(), state, mode);
    }
    run_in(x, state, mode, (reuse, relu), x.dtype())
}

/// Batch norm of an f16/bf16 `x` under autocast, as cuDNN's under
/// PyTorch's CUDA autocast: normalised in f32 (an f32 copy of `x`, f32
/// weights and running statistics), the output and what backward keeps in
/// `x`'s dtype (`x̂` under the lean policy, the input under `SaveAll`).
/// The f32 copy and the f32 output are this call's own (the output is
/// written over the copy) and freed before it returns; `x` goes once
/// copied (its buffer too, when nothing else holds it).
fn run_autocast(x: Tensor, state: &BnState<'_>, mode: Mode) -> Result<NormThenRelu> {
    let low = x.dtype();
    let wide = x.to_dtype(DType::F32)?;
    drop(x);
    let reuse = may_reuse(&wide);
    let y = run_in(&wide, state, mode, (reuse, false), low)?.without_relu()?;
    drop(wide);
    Ok(NormThenRelu::from(y.to_dtype_owned(low)?))
}

/// [`run`] with `x̂` (or, under `SaveAll`, the input) kept for backward in
/// `kept` (`x`'s dtype, or autocast's low dtype).
fn run_in(
    x: &Tensor,
    state: &BnState<'_>,
    mode: Mode,
    (reuse, relu): (bool, bool),
    kept: DType,
) -> Result<NormThenRelu> {
    const OP: &str = "batch_norm";
    let BnState {
        running_mean,
        running_var,
        weight,
        bias,
        ..
    } = *state;
    crate::ops::expect_float(OP, x)?;
    if x.rank() < 2 {
        return Err(Error::InvalidArgument {
            op: OP,
            msg: format!("expected [N, C, *], got {:?}", x.shape()),
        });
    }
    let c = x.shape()[1];
    let geo = NormGeom::batch(x.shape()[0], c, x.shape()[2..].iter().product());
    check_param(OP, weight, &[c], x)?;
    check_param(OP, bias, &[c], x)?;
    let Statistics {
        mean,
        invstd,
        global_count,
    } = statistics(x, geo, state, mode)?;
    let training = mode.training;
    let [nx, nw, nb] = optional_needs(x, weight, bias);
    let lean = save_policy() == SavePolicy::Lean;
    let want_xhat = lean && ((training && nx) || nw);
    // Backward reads the input only under SaveAll with a node recorded.
    let y_over_x = reuse && (lean || !(nx || nw || nb));
    let how = Normalize {
        mean: Some(&mean),
        rstd: &invstd,
        w: weight,
        b: bias,
        want_y: true,
        want_xhat,
        y_over_x,
    };
    let fused = match relu && lean && y_over_x {
        true => normalize_relu(x, geo, &how)?,
        false => None,
    };
    let (y, xhat, applied) = match fused {
        Some((xhat, mask)) => (Some(x.detach()), xhat, Some(mask)),
        None => {
            let (y, xhat) = normalize(x, geo, &how)?;
            (y, xhat, None)
        }
    };
    let y = y.ok_or_else(|| Error::Backward("batch_norm: output not computed".into()))?;
    if !(nx || nw || nb) {
        return Ok(NormThenRelu { y, applied });
    }
    let save = |t: &Tensor| SavedTensor::new(t, OP);
    // What autocast keeps in its low dtype: a counted copy (the f32 one is
    // this call's own and goes).
    let save_kept = |t: &Tensor| -> Result<SavedTensor> {
        Ok(if t.dtype() == kept {
            save(t)
        } else {
            save(&t.detach().to_dtype(kept)?)
        })
    };
    let running = running_mean.zip(running_var);
    let saved = if lean {
        let state_only = !training
            && weight.is_none_or(|w| w.is_model_state())
            && running.is_some_and(|(_, v)| v.is_model_state());
        let scale = match (nx, running) {
            (false, _) => None,
            (true, Some((_, running_var))) if state_only => Some(Scale::FromState {
                weight: weight.map(save),
                running_var: save(running_var),
            }),
            (true, _) => Some(Scale::Vector(save(&scale_tensor(weight, &invstd)?))),
        };
        BnSaved::Lean {
            xhat: xhat.as_ref().map(save_kept).transpose()?,
            scale,
        }
    } else {
        BnSaved::All {
            input: save_kept(x)?,
            weight: weight.map(save),
            running: running.map(|(m, v)| (save(m), save(v))),
            batch: training
                .then(|| {
                    // The statistics were made outside the ledger: the
                    // saved ones are counted copies.
                    Ok::<_, Error>((
                        save(&contiguous_copy(&mean)?),
                        save(&contiguous_copy(&invstd)?),
                    ))
                })
                .transpose()?,
        }
    };
    let op = BatchNormBackward {
        geo,
        train: training,
        eps: mode.eps,
        needs: [nx, nw, nb],
        present: [weight.is_some(), bias.is_some()],
        dtype: x.dtype(),
        kept,
        saved,
        sync: state.sync.cloned().zip(global_count),
    };
    Ok(NormThenRelu {
        y: attach(y, &inputs_of(x, weight, bias), op),
        applied,
    })
}
