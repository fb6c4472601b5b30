//! Optimizers (SGD, Adam, AdamW), with the step fused into backward, and
//! L-BFGS ([`Lbfgs`], driven by a closure as `torch.optim.LBFGS`).
//!
//! One per-parameter update ([`kernels::apply_update`]) serves two paths:
//!
//! - **Usual**: `loss.backward()` collects every `.grad`, then
//!   [`Optimizer::step`] updates each parameter from its `.grad` and
//!   [`Optimizer::zero_grad`] frees them. Peak gradient memory: every
//!   parameter's gradient at once, plus the activation gradients in flight.
//! - **Fused**: [`Optimizer::backward_step`] runs backward with a
//!   [`GradientSink`](crate::autograd::GradientSink) that updates each parameter in place (under
//!   `no_grad`, bumping its version) the moment its gradient is final, and
//!   drops the gradient right away. Peak gradient memory: the largest
//!   single parameter gradient plus the activation gradients in flight.
//!
//! Both give bit-identical parameters. Per-parameter state (moments,
//! momentum buffers) is created lazily on a parameter's first update under
//! [`Category::OptimizerState`]; parameters that do not require grad get no
//! state and no update. Gradient accumulation over `k` micro-batches
//! ([`Optimizer::set_accumulation`]) and clipping ([`Clip`], whose variants
//! say what each mode costs) are fused too.
//!
//! On CUDA both paths run on the device: the update kernels of
//! `optim.cu` (launched from `src/optim/cuda.rs`) compute each algorithm's
//! formula operation by operation in the parameter's dtype, exactly as the
//! CPU does (bit-identical parameters from identical gradients), the state
//! lives on the parameter's device and is counted as on the CPU, and the
//! norms for clipping use the fixed summation order of
//! [`NORM_LANES`] on every device.

mod adam;
mod algorithm;
mod clip;
mod compact;
mod cuda;
mod fused;
mod grad_scaler;
pub mod kernels;
mod lbfgs;
mod rule;
mod schedule;
mod sgd;
mod state;

pub use adam::Adam;
pub use clip::{clip_grad_norm, clip_grad_value, total_norm};
pub use compact::{
    dequantize_block, quantize_block, signed_map, unsigned_map, QuantMap, StateFormat,
    MIN_8BIT_SIZE, QUANT_BLOCK,
};
/// The multi-tensor update's kernel argument (its size is checked
/// against the kernel's by the launch-signature test).
#[doc(hidden)]
pub use cuda::{QuantMaps, TensorList};
pub use grad_scaler::GradScaler;
pub use kernels::{apply_update, apply_update_as, sum_of_squares, Algorithm};
pub use lbfgs::{Lbfgs, LbfgsOptions, LineSearch};
pub use rule::{AdamParams, GradTransform, SgdParams, UpdateRule, NORM_LANES};
pub use schedule::{
    LrScheduler, LrSchedulerState, Schedule, ScheduleState, Scheduler, SequentialLr,
};
pub use sgd::Sgd;
pub use state::{CheckpointHyper, GroupState, OptimizerState, SavedParamState, MAX_STEP_COUNT};

use crate::autograd::backward_with;
use crate::memory::{with_category, Category};
use crate::{Error, Result, Tensor};
use fused::{FusedSink, Mode, NormSink};
use rule::PendingUpdate;
use std::collections::HashMap;

/// Gradient clipping applied inside the update.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub enum Clip {
    /// No clipping.
    #[default]
    None,
    /// Each gradient element limited to `[-c, c]` (as `clip_grad_value_`).
    Value(f64),
    /// Each parameter's gradient scaled by `min(1, max / (‖g‖ + 1e-6))`,
    /// its own norm (one pass; no extra memory).
    ParamNorm(f64),
    /// All gradients scaled by `min(1, max / (‖G‖ + 1e-6))` with `‖G‖` the
    /// norm over every parameter (as `clip_grad_norm_`). The usual path
    /// ([`Optimizer::step`]) computes it from the collected `.grad`s; the
    /// fused path needs a first pass ([`Optimizer::backward_norm_pass`])
    /// over a separate forward, then [`Optimizer::backward_step`] over a
    /// second forward of the same batch.
    GlobalNorm(f64),
}

/// What one [`Optimizer::backward_step`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FusedStep {
    /// The gradients were added to the accumulation buffers: micro-batch
    /// `micro_batch` (1-based) of `of`.
    Accumulated {
        /// This micro-batch's number, from 1.
        micro_batch: usize,
        /// Micro-batches per update.
        of: usize,
    },
    /// Every parameter that had a gradient was updated.
    Updated,
}

/// A set of parameters sharing hyper-parameters.
#[derive(Clone, Debug)]
pub struct ParamGroup<A> {
    /// The group's hyper-parameters (learning rate included).
    pub hyper: A,
    params: Vec<Tensor>,
}

impl<A> ParamGroup<A> {
    /// The group's parameters, in the order given.
    pub fn params(&self) -> &[Tensor] {
        &self.params
    }
}

/// A parameter's optimizer state.
struct ParamState {
    step: u64,
    /// How `tensors` hold the state (the optimizer's format as
    /// [`StateFormat::for_param`] gives it for this parameter).
    format: StateFormat,
    tensors: Vec<Tensor>,
}

/// An optimizer: parameter groups, each with an [`Algorithm`]'s
/// hyper-parameters, plus per-parameter state, clipping and accumulation.
pub struct Optimizer<A: Algorithm> {
    groups: Vec<ParamGroup<A>>,
    /// Leaf id → group index, for parameters that require grad.
    index: HashMap<u64, usize>,
    state: HashMap<u64, ParamState>,
    clip: Clip,
    accumulation: usize,
    micro: usize,
    buffers: HashMap<u64, Tensor>,
    global_norm: Option<f64>,
    steps: u64,
    state_format: StateFormat,
}

impl<A: Algorithm> Optimizer<A> {
    /// An optimizer over `params` (one group) with hyper-parameters `hyper`.
    /// Parameters that do not require grad are kept but never updated.
    pub fn new(params: impl IntoIterator<Item = Tensor>, hyper: A) -> Result<Optimizer<A>> {
        let mut opt = Optimizer {
            groups: Vec::new(),
            index: HashMap::new(),
            state: HashMap::new(),
            clip: Clip::None,
            accumulation: 1,
            micro: 0,
            buffers: HashMap::new(),
            global_norm: None,
            steps: 0,
            state_format: StateFormat::Full,
        };
        opt.add_param_group(params, hyper)?;
        Ok(opt)
    }

    /// Adds a group of parameters with their own hyper-parameters. A
    /// parameter may belong to one group only.
    pub fn add_param_group(
        &mut self,
        params: impl IntoIterator<Item = Tensor>,
        hyper: A,
    ) -> Result<()> {
        hyper.validate()?;
        let params: Vec<Tensor> = params.into_iter().collect();
        let g = self.groups.len();
        let mut ids = Vec::new();
        for p in &params {
            if !p.dtype().is_float() {
                return Err(Error::UnsupportedDType {
                    op: A::NAME,
                    dtype: p.dtype(),
                });
            }
            if let Some(id) = p.leaf_id() {
                if self.index.contains_key(&id) || ids.contains(&id) {
                    return Err(Error::InvalidArgument {
                        op: A::NAME,
                        msg: "some parameters appear in more than one parameter group".into(),
                    });
                }
                ids.push(id);
            } else if p.requires_grad() {
                return Err(Error::InvalidArgument {
                    op: A::NAME,
                    msg: "can only optimize leaf tensors".into(),
                });
            }
        }
        for id in ids {
            self.index.insert(id, g);
        }
        self.groups.push(ParamGroup { hyper, params });
        Ok(())
    }

    /// The parameter groups.
    pub fn groups(&self) -> &[ParamGroup<A>] {
        &self.groups
    }

    /// Mutable hyper-parameters of group `i` (e.g. to change its lr).
    pub fn hyper_mut(&mut self, i: usize) -> Option<&mut A> {
        self.groups.get_mut(i).map(|g| &mut g.hyper)
    }

    /// Each group's learning rate.
    pub fn lrs(&self) -> Vec<f64> {
        self.groups.iter().map(|g| g.hyper.lr()).collect()
    }

    /// Sets each group's learning rate (`lrs` has one per group).
    pub fn set_lrs(&mut self, lrs: &[f64]) -> Result<()> {
        if lrs.len() != self.groups.len() {
            return Err(Error::InvalidArgument {
                op: "set_lrs",
                msg: format!("{} rates for {} groups", lrs.len(), self.groups.len()),
            });
        }
        for (g, &lr) in self.groups.iter_mut().zip(lrs) {
            g.hyper.set_lr(lr);
        }
        Ok(())
    }

    /// Sets the clipping mode (used by both paths).
    pub fn set_clip(&mut self, clip: Clip) -> Result<()> {
        let bad = match clip {
            Clip::None => false,
            Clip::Value(c) | Clip::ParamNorm(c) | Clip::GlobalNorm(c) => !kernels::nonneg(c),
        };
        if bad {
            return Err(Error::InvalidArgument {
                op: "set_clip",
                msg: format!("{clip:?}: the bound must be ≥ 0"),
            });
        }
        self.clip = clip;
        self.global_norm = None;
        Ok(())
    }

    /// The clipping mode.
    pub fn clip(&self) -> Clip {
        self.clip
    }

    /// Accumulates `k ≥ 1` micro-batches per update in the fused path: the
    /// first `k − 1` calls of [`Optimizer::backward_step`] add into one
    /// buffer per parameter (counted as gradient), the `k`-th updates.
    pub fn set_accumulation(&mut self, k: usize) -> Result<()> {
        if k == 0 || self.micro != 0 {
            return Err(Error::InvalidArgument {
                op: "set_accumulation",
                msg: if k == 0 {
                    "k must be at least 1".into()
                } else {
                    "cannot change k in the middle of an accumulation window".into()
                },
            });
        }
        self.accumulation = k;
        Ok(())
    }

    /// Keeps the state of parameters updated from now on in `format`
    /// (bf16 or block-wise 8-bit moments instead of the parameter's dtype;
    /// see [`StateFormat`]). Set it before the first update: changing it
    /// once state exists is an error, as is changing it mid-window.
    pub fn set_state_format(&mut self, format: StateFormat) -> Result<()> {
        if format != self.state_format && (!self.state.is_empty() || self.micro != 0) {
            return Err(Error::InvalidArgument {
                op: "set_state_format",
                msg: format!(
                    "the optimizer already holds {} state; set the format before the first update",
                    self.state_format
                ),
            });
        }
        self.state_format = format;
        Ok(())
    }

    /// The format new state is kept in.
    pub fn state_format(&self) -> StateFormat {
        self.state_format
    }

    /// Number of updates done (by either path).
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Bytes of optimizer state (all parameters).
    pub fn state_bytes(&self) -> usize {
        self.state
            .values()
            .flat_map(|s| &s.tensors)
            .map(|t| t.storage_bytes())
            .sum()
    }

    /// Bytes held in accumulation buffers (between micro-batches).
    pub fn accumulation_bytes(&self) -> usize {
        self.buffers.values().map(|t| t.storage_bytes()).sum()
    }

    /// Parameters in group order, with their group, that may be updated.
    fn trainable(&self) -> impl Iterator<Item = (usize, &Tensor)> {
        self.groups.iter().enumerate().flat_map(|(g, group)| {
            group
                .params
                .iter()
                .filter(|p| p.leaf_id().is_some())
                .map(move |p| (g, p))
        })
    }

    /// THE per-parameter update of the fused path: [`Self::prepare_update`]
    /// then the algorithm's kernel in place.
    fn update_param(
        &mut self,
        group: usize,
        param: &Tensor,
        grad: &Tensor,
        factors: Factors,
    ) -> Result<()> {
        let Some(u) = self.prepare_update(group, param, grad, factors)? else {
            return Ok(());
        };
        kernels::apply_pending(&self.groups[group].hyper, &u)
    }

    /// A parameter's update made ready, shared by both paths: the gradient
    /// transform of the clipping mode, the state created on the first
    /// update (under [`Category::OptimizerState`]), the update counted.
    /// `None` for a parameter that is not a leaf.
    fn prepare_update(
        &mut self,
        group: usize,
        param: &Tensor,
        grad: &Tensor,
        factors: Factors,
    ) -> Result<Option<PendingUpdate>> {
        let Some(id) = param.leaf_id() else {
            return Ok(None);
        };
        let u = factors.unscale;
        // Scaling by `u` (a power of two) commutes with rounding: one
        // factor is unscaling then clipping, each rounded, as PyTorch does.
        let transform = match self.clip {
            Clip::None if u == 1.0 => GradTransform::Identity,
            Clip::None => GradTransform::Scale(u),
            Clip::Value(c) if u == 1.0 => GradTransform::ClampAbs(c),
            Clip::Value(_) => return Err(Error::InvalidArgument {
                op: "backward_step",
                msg: "value clipping of unscaled gradients has no one-pass form in the fused path: use the usual path (scale, backward, unscale, clip_grad_value, step)".into(),
            }),
            Clip::ParamNorm(max) => GradTransform::Scale(
                clip::coefficient(kernels::sum_of_squares(grad)?.sqrt() * u, max) * u,
            ),
            Clip::GlobalNorm(_) => {
                GradTransform::Scale(factors.global.ok_or(Error::InvalidArgument {
                    op: "optimizer step",
                    msg: "global-norm clipping needs the total norm first".into(),
                })? * u)
            }
        };
        let slots = self.groups[group].hyper.state_slots();
        let state = match self.state.entry(id) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                let _state = with_category(Category::OptimizerState);
                let format = self.state_format.for_param(param.numel());
                let tensors = compact::new_state(param, slots, format)?;
                e.insert(ParamState {
                    step: 0,
                    format,
                    tensors,
                })
            }
        };
        state.step = state.step.checked_add(1).ok_or_else(step_overflow)?;
        Ok(Some(PendingUpdate {
            param: param.clone(),
            grad: grad.clone(),
            transform,
            step: state.step,
            format: state.format,
            state: state.tensors.clone(),
        }))
    }

    /// The usual path: updates every parameter from its collected `.grad`
    /// (parameters without one are skipped, as in PyTorch). With
    /// [`Clip::GlobalNorm`] the total norm is taken over the `.grad`s first.
    /// A group's CUDA parameters update in multi-tensor launches (up to 32
    /// parameters each, as PyTorch's `foreach`), the same bits as one by
    /// one.
    pub fn step(&mut self) -> Result<()> {
        // Allocations before the first update kernel are the step's own.
        crate::memory::note_op("optimizer step");
        let params: Vec<(usize, Tensor)> = self.trainable().map(|(g, p)| (g, p.clone())).collect();
        let scale = match self.clip {
            Clip::GlobalNorm(max) => {
                let grads: Vec<Option<Tensor>> = params.iter().map(|(_, p)| p.grad()).collect();
                let norm = clip::combine(grads.iter().map(|g| g.as_ref()))?;
                Some(clip::coefficient(norm, max))
            }
            _ => None,
        };
        // Each group's updates, in parameter order.
        let mut pending: Vec<Vec<PendingUpdate>> = self.groups.iter().map(|_| Vec::new()).collect();
        for (g, p) in &params {
            if let Some(grad) = p.grad() {
                let factors = Factors {
                    global: scale,
                    unscale: 1.0,
                };
                if let Some(u) = self.prepare_update(*g, p, &grad, factors)? {
                    pending[*g].push(u);
                }
            }
        }
        for (group, updates) in self.groups.iter().zip(&pending) {
            kernels::apply_updates(&group.hyper, updates)?;
        }
        self.steps = self.steps.checked_add(1).ok_or_else(step_overflow)?;
        Ok(())
    }

    /// Frees every parameter's collected `.grad` (PyTorch's `set_to_none`).
    pub fn zero_grad(&self) {
        for (_, p) in self.trainable() {
            p.zero_grad();
        }
    }

    /// The fused path: backward from `loss` with each parameter updated the
    /// moment its gradient is final, and the gradient dropped right after.
    ///
    /// With accumulation `k > 1`, calls 1…k−1 only add into the
    /// per-parameter buffers; call `k` adds its gradient to the buffer,
    /// updates and frees the buffer. With [`Clip::GlobalNorm`],
    /// [`Optimizer::backward_norm_pass`] must have run on this batch first.
    /// Gradients of leaves that this optimizer does not own go to their
    /// `.grad` as usual. Existing `.grad`s of owned parameters are ignored.
    pub fn backward_step(&mut self, loss: &Tensor) -> Result<FusedStep> {
        self.fused_backward(loss, 1.0, None)
    }

    /// [`Optimizer::backward_step`] with each final gradient of an updating
    /// micro-batch passed through `relay` (after adding the accumulation
    /// buffer) before its update: the relay hands back the (parameter,
    /// gradient) pairs to update, then or later (data parallel's buckets,
    /// reduced across ranks). Micro-batches that only accumulate do not
    /// reach the relay.
    pub(crate) fn backward_step_relayed(
        &mut self,
        loss: &Tensor,
        relay: &mut dyn GradRelay,
    ) -> Result<FusedStep> {
        if let Clip::GlobalNorm(_) = self.clip {
            return Err(Error::InvalidArgument {
                op: "backward_step",
                msg: "fused global-norm clipping takes its norm from this rank's gradients before they are reduced: clip per parameter (Clip::ParamNorm) or use the usual path".into(),
            });
        }
        self.fused_backward(loss, 1.0, Some(relay))
    }

    /// [`Optimizer::backward_step`] of a loss scaled by `1 / unscale`:
    /// each gradient is multiplied by `unscale` as it updates (converted to
    /// its element type: a power of two, exact), and the global norm of the
    /// norm pass, taken over the scaled gradients, by `unscale` too.
    pub(crate) fn fused_backward(
        &mut self,
        loss: &Tensor,
        unscale: f64,
        mut relay: Option<&mut dyn GradRelay>,
    ) -> Result<FusedStep> {
        let norm = self.global_norm.take();
        let global = match self.clip {
            Clip::GlobalNorm(max) => {
                if self.accumulation > 1 {
                    return Err(global_with_accumulation());
                }
                let norm = norm.ok_or(Error::InvalidArgument {
                    op: "backward_step",
                    msg: "Clip::GlobalNorm in the fused path needs backward_norm_pass on the same batch first".into(),
                })?;
                Some(clip::coefficient(norm * unscale, max))
            }
            _ => None,
        };
        let scale = Factors { global, unscale };
        self.micro += 1;
        if self.micro < self.accumulation {
            let mut sink = FusedSink {
                opt: self,
                mode: Mode::Accumulate,
                relay: None,
            };
            backward_with(loss, None, &mut sink)?;
            return Ok(FusedStep::Accumulated {
                micro_batch: self.micro,
                of: self.accumulation,
            });
        }
        self.micro = 0;
        let mut sink = FusedSink {
            opt: self,
            mode: Mode::Update(scale),
            relay: relay.as_deref_mut(),
        };
        let result = backward_with(loss, None, &mut sink);
        // Parameters that had gradients in earlier micro-batches but none
        // in this one are updated from their buffers now (in parameter
        // order, so that every rank relays them alike).
        let mut leftover: Vec<(u64, Tensor)> = self.buffers.drain().collect();
        result?;
        if leftover.len() > 1 {
            let order: HashMap<u64, usize> = self
                .trainable()
                .enumerate()
                .filter_map(|(i, (_, p))| Some((p.leaf_id()?, i)))
                .collect();
            leftover.sort_by_key(|(id, _)| order.get(id).copied());
        }
        for (id, buffer) in leftover {
            if let Some((_, p)) = self.find(id) {
                match relay.as_deref_mut() {
                    Some(r) => {
                        let ready = r.relay(&p, buffer)?;
                        self.update_ready(ready, scale)?;
                    }
                    None => self.update_ready(vec![(p, buffer)], scale)?,
                }
            }
        }
        if let Some(r) = relay {
            let ready = r.finish()?;
            self.update_ready(ready, scale)?;
            r.after_updates()?;
        }
        self.steps = self.steps.checked_add(1).ok_or_else(step_overflow)?;
        Ok(FusedStep::Updated)
    }

    /// First pass of fused global-norm clipping: backward from `loss` that
    /// only adds up each owned parameter's squared gradient norm, dropping
    /// every gradient (of other leaves too) as soon as it is final. Returns
    /// the total norm, kept for the next [`Optimizer::backward_step`],
    /// which must run on a second forward of the same batch. Cost: two
    /// forwards and two backwards per step, no gradient kept.
    pub fn backward_norm_pass(&mut self, loss: &Tensor) -> Result<f64> {
        if self.accumulation > 1 {
            return Err(global_with_accumulation());
        }
        let mut sink = NormSink {
            index: &self.index,
            squares: HashMap::new(),
        };
        backward_with(loss, None, &mut sink)?;
        let squares = sink.squares;
        // Combined in parameter order, exactly as over collected grads.
        let norm = self
            .trainable()
            .filter_map(|(_, p)| squares.get(&p.leaf_id()?).copied())
            .sum::<f64>()
            .sqrt();
        self.global_norm = Some(norm);
        Ok(norm)
    }

    /// Drops the norm a norm pass left for the next fused step (a loss
    /// scaler's skipped step).
    pub(crate) fn forget_norm(&mut self) {
        self.global_norm = None;
    }

    /// The usual path's global-norm clipping over this optimizer's
    /// collected `.grad`s (scaled in place); returns the total norm. Use it
    /// with [`Clip::None`] before [`Optimizer::step`].
    pub fn clip_grad_norm(&self, max_norm: f64) -> Result<f64> {
        let params: Vec<Tensor> = self.trainable().map(|(_, p)| p.clone()).collect();
        clip_grad_norm(&params, max_norm)
    }

    /// Updates each (parameter, gradient) pair of this optimizer's (others
    /// are skipped), dropping each gradient after its update.
    fn update_ready(&mut self, ready: Vec<(Tensor, Tensor)>, scale: Factors) -> Result<()> {
        for (param, grad) in ready {
            let group = param.leaf_id().and_then(|id| self.index.get(&id).copied());
            if let Some(group) = group {
                self.update_param(group, &param, &grad, scale)?;
            }
        }
        Ok(())
    }

    fn find(&self, id: u64) -> Option<(usize, Tensor)> {
        let g = *self.index.get(&id)?;
        let p = self.groups[g]
            .params
            .iter()
            .find(|p| p.leaf_id() == Some(id))?
            .clone();
        Some((g, p))
    }
}

/// Where the fused step sends each final gradient before its update: the
/// relay may hold gradients (until their bucket has been reduced across
/// ranks, say) and hands back the (parameter, gradient) pairs that are
/// ready, in the order they must be updated.
pub(crate) trait GradRelay {
    /// `grad` is `param`'s final gradient on this process; returns the
    /// pairs now ready (none, this one, or ones held before).
    fn relay(&mut self, param: &Tensor, grad: Tensor) -> Result<Vec<(Tensor, Tensor)>>;
    /// Backward is over: every pair still held.
    fn finish(&mut self) -> Result<Vec<(Tensor, Tensor)>>;
    /// The pairs [`GradRelay::finish`] handed back have been updated.
    fn after_updates(&mut self) -> Result<()> {
        Ok(())
    }
}

/// What multiplies a gradient in its update besides its clipping mode's
/// own rule.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Factors {
    /// The global-norm clipping coefficient (of the unscaled norm), under
    /// [`Clip::GlobalNorm`].
    global: Option<f64>,
    /// A loss scaler's inverse scale (1 without one).
    unscale: f64,
}

/// A step count that would pass `u64::MAX` (only a restored state can be
/// that far along).
fn step_overflow() -> Error {
    Error::InvalidArgument {
        op: "optimizer step",
        msg: "the step count cannot go past u64::MAX".into(),
    }
}

fn global_with_accumulation() -> Error {
    Error::InvalidArgument {
        op: "backward_step",
        msg: "fused global-norm clipping does not combine with accumulation; use the usual path (backward ×k, then step)".into(),
    }
}
