//! Adam and AdamW, as `torch.optim.Adam` / `torch.optim.AdamW`
//! (single-tensor path, bias-corrected, optional amsgrad).

use super::kernels::{c, nonneg, Algorithm, GradPass, GradReader};
use super::AdamParams;
use super::UpdateRule;
use crate::{Error, FloatDType, Result};

/// Adam / AdamW hyper-parameters, with torch.optim's meaning and defaults.
///
/// Per element, in this order (`g` the gradient after clipping, `t` the
/// parameter's update count): AdamW first decays `p = p·(1 − lr·wd)`; Adam
/// instead adds `g = g + wd·p`. Then `m = lerp(m, g, 1 − β₁)`,
/// `v = v·β₂ + (1 − β₂)·g·g`, (amsgrad: `v̂ = max(v̂, v)`, used for `v`),
/// `denom = √v / √(1 − β₂ᵗ) + eps`, `p = p − (lr / (1 − β₁ᵗ))·m / denom`.
/// State: `exp_avg` and `exp_avg_sq` (and `max_exp_avg_sq` with amsgrad),
/// each the parameter's size; the step count is a plain integer.
#[derive(Clone, Debug, PartialEq)]
pub struct Adam {
    /// Learning rate.
    pub lr: f64,
    /// Decay of the first moment.
    pub beta1: f64,
    /// Decay of the second moment.
    pub beta2: f64,
    /// Added to the denominator.
    pub eps: f64,
    /// Weight decay: L2 added to the gradient (Adam) or decoupled (AdamW).
    pub weight_decay: f64,
    /// Keep the running maximum of the second moment (AMSGrad).
    pub amsgrad: bool,
    /// Decoupled weight decay (AdamW).
    pub decoupled_weight_decay: bool,
    /// Maximize the objective instead of minimizing it.
    pub maximize: bool,
}

impl Adam {
    /// Adam with torch's defaults (betas 0.9/0.999, eps 1e-8, no decay).
    pub fn new(lr: f64) -> Adam {
        Adam {
            lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
            amsgrad: false,
            decoupled_weight_decay: false,
            maximize: false,
        }
    }

    /// AdamW with torch's defaults (weight decay 0.01, decoupled).
    pub fn adamw(lr: f64) -> Adam {
        Adam {
            weight_decay: 0.01,
            decoupled_weight_decay: true,
            ..Adam::new(lr)
        }
    }

    /// With moment decays `beta1`, `beta2`.
    pub fn betas(mut self, beta1: f64, beta2: f64) -> Adam {
        self.beta1 = beta1;
        self.beta2 = beta2;
        self
    }

    /// With `eps`.
    pub fn eps(mut self, eps: f64) -> Adam {
        self.eps = eps;
        self
    }

    /// With weight decay `wd` (L2 for Adam, decoupled for AdamW).
    pub fn weight_decay(mut self, wd: f64) -> Adam {
        self.weight_decay = wd;
        self
    }

    /// With AMSGrad on or off.
    pub fn amsgrad(mut self, on: bool) -> Adam {
        self.amsgrad = on;
        self
    }

    /// Maximizing instead of minimizing.
    pub fn maximize(mut self, on: bool) -> Adam {
        self.maximize = on;
        self
    }
}

fn invalid(msg: String) -> Error {
    Error::InvalidArgument { op: "Adam", msg }
}

impl Algorithm for Adam {
    const NAME: &'static str = "Adam";

    fn lr(&self) -> f64 {
        self.lr
    }

    fn set_lr(&mut self, lr: f64) {
        self.lr = lr;
    }

    fn validate(&self) -> Result<()> {
        if !nonneg(self.lr) {
            return Err(invalid(format!("invalid learning rate {}", self.lr)));
        }
        if !nonneg(self.eps) {
            return Err(invalid(format!("invalid epsilon {}", self.eps)));
        }
        for (i, b) in [self.beta1, self.beta2].into_iter().enumerate() {
            if !(0.0..1.0).contains(&b) {
                return Err(invalid(format!("invalid beta parameter at index {i}: {b}")));
            }
        }
        if !nonneg(self.weight_decay) {
            return Err(invalid(format!(
                "invalid weight_decay {}",
                self.weight_decay
            )));
        }
        Ok(())
    }

    fn state_slots(&self) -> usize {
        2 + usize::from(self.amsgrad)
    }

    fn slot_is_nonnegative(&self, slot: usize) -> bool {
        // exp_avg_sq and max_exp_avg_sq.
        slot >= 1
    }

    fn update<T: FloatDType>(
        &self,
        step: u64,
        param: &mut [T],
        grad: &GradReader<'_, T>,
        state: &mut [&mut [T]],
    ) {
        let n = param.len();
        let (first, rest) = state.split_at_mut(1);
        let (second, rest) = rest.split_at_mut(1);
        let pass = AdamPass {
            adam: self,
            step,
            param,
            m: &mut first[0][..n],
            v: &mut second[0][..n],
        };
        match rest.first_mut() {
            Some(vmax) => grad.elements(n, AmsgradPass(pass, &mut vmax[..n])),
            None => grad.elements(n, pass),
        }
    }

    fn rule(&self) -> Option<UpdateRule> {
        Some(UpdateRule::Adam(AdamParams {
            lr: self.lr,
            beta1: self.beta1,
            beta2: self.beta2,
            eps: self.eps,
            weight_decay: self.weight_decay,
            decoupled_weight_decay: self.decoupled_weight_decay,
            amsgrad: self.amsgrad,
            maximize: self.maximize,
        }))
    }
}

/// One Adam update over a parameter and its two moments, run once per form
/// of the gradient by [`GradReader::elements`].
struct AdamPass<'a, T> {
    adam: &'a Adam,
    step: u64,
    param: &'a mut [T],
    m: &'a mut [T],
    v: &'a mut [T],
}

/// An [`AdamPass`] that also keeps the running maximum of the second moment.
struct AmsgradPass<'a, T>(AdamPass<'a, T>, &'a mut [T]);

/// The per-element arithmetic of one Adam update, its scalars converted to
/// the element type once.
struct AdamElement<T> {
    shrink: Option<T>,
    maximize: bool,
    l2: Option<T>,
    weight: T,
    one_minus_weight: T,
    small_weight: bool,
    beta2: T,
    one_minus_beta2: T,
    bc2_sqrt: T,
    eps: T,
    neg_step: T,
}

impl<T: FloatDType> AdamElement<T> {
    fn new(adam: &Adam, step: u64) -> Self {
        let t = step as f64;
        let bias_correction1 = 1.0 - adam.beta1.powf(t);
        let bias_correction2 = 1.0 - adam.beta2.powf(t);
        let w1 = 1.0 - adam.beta1;
        let decay = adam.weight_decay != 0.0;
        AdamElement {
            shrink: (decay && adam.decoupled_weight_decay)
                .then(|| c(1.0 - adam.lr * adam.weight_decay)),
            maximize: adam.maximize,
            l2: (decay && !adam.decoupled_weight_decay).then(|| c(adam.weight_decay)),
            weight: c(w1),
            one_minus_weight: c(1.0 - w1),
            small_weight: w1 < 0.5,
            beta2: c(adam.beta2),
            one_minus_beta2: c(1.0 - adam.beta2),
            bc2_sqrt: c(bias_correction2.sqrt()),
            eps: c(adam.eps),
            neg_step: c(-(adam.lr / bias_correction1)),
        }
    }

    /// Updates one parameter `p` and its moments `m`, `v` from `g`; with
    /// `vmax`, the second moment used is the running maximum of `v`.
    #[inline(always)]
    fn apply(&self, p: &mut T, m: &mut T, v: &mut T, vmax: Option<&mut T>, g: T) {
        let mut x = *p;
        if let Some(shrink) = self.shrink {
            x = x * shrink;
        }
        let g = if self.maximize { -g } else { g };
        let g = match self.l2 {
            Some(wd) => g + wd * x,
            None => g,
        };
        // torch.lerp: the formula depends on which side of ½ the weight is.
        *m = if self.small_weight {
            *m + self.weight * (g - *m)
        } else {
            g - (g - *m) * self.one_minus_weight
        };
        *v = *v * self.beta2;
        *v = *v + self.one_minus_beta2 * g * g;
        let second_moment = match vmax {
            Some(vmax) => {
                // torch.maximum: NaN propagates.
                *vmax = if v.is_nan() || vmax.is_nan() {
                    *v + *vmax
                } else if *v > *vmax {
                    *v
                } else {
                    *vmax
                };
                *vmax
            }
            None => *v,
        };
        let denom = second_moment.sqrt() / self.bc2_sqrt + self.eps;
        *p = x + self.neg_step * *m / denom;
    }
}

impl<T: FloatDType> GradPass<T, ()> for AdamPass<'_, T> {
    #[inline(always)]
    fn run(self, grad: impl Iterator<Item = T>) {
        let e = AdamElement::new(self.adam, self.step);
        let moments = self.m.iter_mut().zip(self.v.iter_mut());
        for ((p, (m, v)), g) in self.param.iter_mut().zip(moments).zip(grad) {
            e.apply(p, m, v, None, g);
        }
    }
}

impl<T: FloatDType> GradPass<T, ()> for AmsgradPass<'_, T> {
    #[inline(always)]
    fn run(self, grad: impl Iterator<Item = T>) {
        let AmsgradPass(pass, vmax) = self;
        let e = AdamElement::new(pass.adam, pass.step);
        let moments = pass.m.iter_mut().zip(pass.v.iter_mut()).zip(vmax);
        for ((p, ((m, v), vmax)), g) in pass.param.iter_mut().zip(moments).zip(grad) {
            e.apply(p, m, v, Some(vmax), g);
        }
    }
}
