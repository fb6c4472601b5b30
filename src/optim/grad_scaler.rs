//! Dynamic loss scaling for f16 training: `torch.amp.GradScaler`.
//!
//! The loss is multiplied by a scale before backward so that small f16
//! gradients do not flush to zero; before the update the gradients are
//! multiplied by its inverse, and a step whose gradients hold an inf or a
//! NaN is skipped. The scale halves after such a step and doubles after
//! `growth_interval` clean steps in a row, in PyTorch's arithmetic (an f32
//! scale; the inverse `f32(1 / f64(scale))`; the same factors), so the same
//! losses give the same scales and the same skipped steps.
//!
//! The usual path is PyTorch's: [`GradScaler::scale`] the loss, backward,
//! optionally [`GradScaler::unscale`] (to clip), [`GradScaler::step`], then
//! [`GradScaler::update`]. The fused path ([`GradScaler::backward_step`],
//! with the update inside backward) cannot take back an update once a later
//! gradient turns out not to be finite, so it looks first: one backward
//! that only adds up the squared norms of the scaled gradients
//! ([`Optimizer::backward_norm_pass`], nothing kept), and only when they are
//! finite a second forward and the fused backward, which unscales each
//! gradient as it updates. The memory stays that of the fused step (no
//! gradient is ever held beyond its own update); the cost is one more
//! forward and backward, as for fused global-norm clipping.

use super::{Algorithm, Clip, FusedStep, Optimizer};
use crate::optim::kernels::sum_of_squares;
use crate::{DType, Error, Result, Tensor};

/// Where a scaler is in its cycle (PyTorch's `OptState`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// Nothing since the last update.
    Ready,
    /// The gradients were unscaled; the step has not run.
    Unscaled,
    /// The step ran (or was skipped).
    Stepped,
}

/// Dynamic loss scaling, as `torch.amp.GradScaler` (see the module doc).
#[derive(Clone, Debug)]
pub struct GradScaler {
    scale: f32,
    growth_factor: f64,
    backoff_factor: f64,
    growth_interval: u32,
    growth_tracker: u32,
    enabled: bool,
    stage: Stage,
    found_inf: bool,
}

impl Default for GradScaler {
    fn default() -> Self {
        GradScaler::new()
    }
}

impl GradScaler {
    /// PyTorch's defaults: scale 2¹⁶, growth ×2 after 2000 clean steps,
    /// back-off ×0.5 after a step with an inf or NaN.
    pub fn new() -> GradScaler {
        GradScaler {
            scale: 65536.0,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: 2000,
            growth_tracker: 0,
            enabled: true,
            stage: Stage::Ready,
            found_inf: false,
        }
    }

    /// The starting scale (positive and finite).
    pub fn init_scale(mut self, scale: f64) -> Result<GradScaler> {
        let s = scale as f32;
        if !(s.is_finite() && s > 0.0) {
            return Err(bad(format!(
                "init_scale must be positive and finite, not {scale}"
            )));
        }
        self.scale = s;
        Ok(self)
    }

    /// The factor the scale grows by after `growth_interval` clean steps
    /// (above 1).
    pub fn growth_factor(mut self, factor: f64) -> Result<GradScaler> {
        if !(factor.is_finite() && factor > 1.0) {
            return Err(bad(format!("growth_factor must be above 1, not {factor}")));
        }
        self.growth_factor = factor;
        Ok(self)
    }

    /// The factor the scale shrinks by after a step with an inf or NaN
    /// (in (0, 1)).
    pub fn backoff_factor(mut self, factor: f64) -> Result<GradScaler> {
        if !(factor > 0.0 && factor < 1.0) {
            return Err(bad(format!(
                "backoff_factor must be in (0, 1), not {factor}"
            )));
        }
        self.backoff_factor = factor;
        Ok(self)
    }

    /// Clean steps in a row before the scale grows (at least 1).
    pub fn growth_interval(mut self, steps: u32) -> Result<GradScaler> {
        if steps == 0 {
            return Err(bad("growth_interval must be at least 1".into()));
        }
        self.growth_interval = steps;
        Ok(self)
    }

    /// Off: `scale` returns the loss, `step` steps, nothing is checked.
    pub fn enabled(mut self, enabled: bool) -> GradScaler {
        self.enabled = enabled;
        self
    }

    /// The scale now (1 when disabled).
    pub fn get_scale(&self) -> f64 {
        if self.enabled {
            self.scale as f64
        } else {
            1.0
        }
    }

    /// Clean steps since the scale last changed.
    pub fn growth_tracker(&self) -> u32 {
        self.growth_tracker
    }

    /// Whether the last step found an inf or NaN (and was skipped).
    pub fn found_inf(&self) -> bool {
        self.found_inf
    }

    /// Restores a scale and growth tracker saved from [`Self::get_scale`]
    /// and [`Self::growth_tracker`] (PyTorch's `load_state_dict`).
    pub fn restore(&mut self, scale: f64, growth_tracker: u32) -> Result<()> {
        *self = self.clone().init_scale(scale)?;
        self.growth_tracker = growth_tracker;
        self.stage = Stage::Ready;
        Ok(())
    }

    /// `loss × scale` (the loss itself when disabled).
    pub fn scale(&self, loss: &Tensor) -> Result<Tensor> {
        if !self.enabled {
            return Ok(loss.clone());
        }
        loss.mul_scalar(self.scale as f64)
    }

    /// Multiplies the `.grad` of every parameter of `opt` by the inverse
    /// scale in place and records whether any holds an inf or a NaN. Once
    /// per step, before [`Self::step`] (which does it when not done).
    pub fn unscale<A: Algorithm>(&mut self, opt: &Optimizer<A>) -> Result<()> {
        if !self.enabled {
            return Ok(());
        }
        match self.stage {
            Stage::Unscaled => {
                return Err(bad(
                    "unscale was already called since the last update".into()
                ))
            }
            Stage::Stepped => return Err(bad("unscale was called after step".into())),
            Stage::Ready => {}
        }
        let inv = self.inverse();
        let mut found = false;
        for (_, p) in opt.trainable() {
            let Some(g) = p.grad() else { continue };
            if g.dtype() == DType::F16 {
                return Err(bad(
                    "the gradients are f16: keep the parameters in f32 (f32 master weights) and scale the loss"
                        .into(),
                ));
            }
            // Squares in f64 never overflow for finite f32 values: only an
            // inf or a NaN makes the sum non-finite.
            found |= !sum_of_squares(&g)?.is_finite();
            g.mul_scalar_(inv as f64)?;
        }
        self.found_inf = found;
        self.stage = Stage::Unscaled;
        Ok(())
    }

    /// Unscales (unless done) and runs `opt.step()` unless a gradient holds
    /// an inf or a NaN. Returns whether the step ran.
    pub fn step<A: Algorithm>(&mut self, opt: &mut Optimizer<A>) -> Result<bool> {
        if !self.enabled {
            opt.step()?;
            return Ok(true);
        }
        match self.stage {
            Stage::Stepped => {
                return Err(bad("step was already called since the last update".into()))
            }
            Stage::Ready => self.unscale(opt)?,
            Stage::Unscaled => {}
        }
        self.stage = Stage::Stepped;
        if self.found_inf {
            return Ok(false);
        }
        opt.step()?;
        Ok(true)
    }

    /// The fused path: `forward()` gives the loss of this step's batch (it
    /// is called twice, on the same batch, when the gradients are finite;
    /// once when they are not). Runs the norm pass on the scaled loss, and
    /// when every gradient is finite the fused backward with each gradient
    /// unscaled as it updates (global-norm clipping, if set, on the
    /// unscaled norm). Returns whether the step ran; call [`Self::update`]
    /// after it.
    pub fn backward_step<A: Algorithm>(
        &mut self,
        opt: &mut Optimizer<A>,
        mut forward: impl FnMut() -> Result<Tensor>,
    ) -> Result<bool> {
        if !self.enabled {
            if opt.clip_is_global() {
                opt.backward_norm_pass(&forward()?)?;
            }
            return Ok(matches!(
                opt.backward_step(&forward()?)?,
                FusedStep::Updated
            ));
        }
        if self.stage != Stage::Ready {
            return Err(bad(
                "backward_step needs update() after the previous step".into()
            ));
        }
        let norm = opt.backward_norm_pass(&self.scale(&forward()?)?)?;
        self.stage = Stage::Stepped;
        self.found_inf = !norm.is_finite();
        if self.found_inf {
            opt.forget_norm();
            return Ok(false);
        }
        let loss = self.scale(&forward()?)?;
        let done = opt.fused_backward(&loss, self.inverse() as f64, None)?;
        Ok(matches!(done, FusedStep::Updated))
    }

    /// Moves the scale on after a step: ×`backoff_factor` if it found an
    /// inf or NaN, ×`growth_factor` after `growth_interval` clean steps in
    /// a row (unless that is not finite), as `torch._amp_update_scale_`.
    /// An error when no step ran since the last update.
    pub fn update(&mut self) -> Result<()> {
        if !self.enabled {
            return Ok(());
        }
        if self.stage == Stage::Ready {
            return Err(bad(
                "update without a step (or unscale) since the last update".into(),
            ));
        }
        if self.found_inf {
            self.scale = (self.scale as f64 * self.backoff_factor) as f32;
            self.growth_tracker = 0;
        } else {
            let clean = self.growth_tracker + 1;
            if clean == self.growth_interval {
                let grown = (self.scale as f64 * self.growth_factor) as f32;
                if grown.is_finite() {
                    self.scale = grown;
                }
                self.growth_tracker = 0;
            } else {
                self.growth_tracker = clean;
            }
        }
        self.stage = Stage::Ready;
        Ok(())
    }

    /// `f32(1 / f64(scale))`, as PyTorch's `scale.double().reciprocal().float()`.
    fn inverse(&self) -> f32 {
        (1.0 / self.scale as f64) as f32
    }
}

fn bad(msg: String) -> Error {
    Error::InvalidArgument {
        op: "GradScaler",
        msg,
    }
}

impl<A: Algorithm> Optimizer<A> {
    /// Whether global-norm clipping is set (its fused path needs the norm
    /// pass first).
    fn clip_is_global(&self) -> bool {
        matches!(self.clip, Clip::GlobalNorm(_))
    }
}
