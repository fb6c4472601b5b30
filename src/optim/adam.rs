//! Adam and AdamW, as `torch.optim.Adam` / `torch.optim.AdamW`
//! (single-tensor path, bias-corrected, optional amsgrad).

use super::kernels::{c, nonneg, Algorithm, GradReader};
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

    fn update<T: FloatDType>(
        &self,
        step: u64,
        param: &mut [T],
        grad: &GradReader<'_, T>,
        state: &mut [&mut [T]],
    ) {
        let t = step as f64;
        let bias_correction1 = 1.0 - self.beta1.powf(t);
        let bias_correction2 = 1.0 - self.beta2.powf(t);
        let step_size = self.lr / bias_correction1;
        let bc2_sqrt: T = c(bias_correction2.sqrt());
        let neg_step: T = c(-step_size);
        let eps: T = c(self.eps);
        let w1 = 1.0 - self.beta1;
        let weight: T = c(w1);
        let one_minus_weight: T = c(1.0 - w1);
        let small_weight = w1 < 0.5;
        let beta2: T = c(self.beta2);
        let one_minus_beta2: T = c(1.0 - self.beta2);
        let wd: T = c(self.weight_decay);
        let l2 = self.weight_decay != 0.0 && !self.decoupled_weight_decay;
        let decoupled = self.weight_decay != 0.0 && self.decoupled_weight_decay;
        let shrink: T = c(1.0 - self.lr * self.weight_decay);
        let (first, rest) = state.split_at_mut(1);
        let (second, rest) = rest.split_at_mut(1);
        let m = &mut *first[0];
        let v = &mut *second[0];
        let mut vmax = rest.first_mut();
        for i in 0..param.len() {
            let mut p = param[i];
            if decoupled {
                p = p * shrink;
            }
            let g = grad.get(i);
            let g = if self.maximize { -g } else { g };
            let g = if l2 { g + wd * p } else { g };
            // torch.lerp: the formula depends on which side of ½ the weight is.
            m[i] = if small_weight {
                m[i] + weight * (g - m[i])
            } else {
                g - (g - m[i]) * one_minus_weight
            };
            v[i] = v[i] * beta2;
            v[i] = v[i] + one_minus_beta2 * g * g;
            let second_moment = match vmax.as_deref_mut() {
                Some(vmax) => {
                    // torch.maximum: NaN propagates.
                    vmax[i] = if v[i].is_nan() || vmax[i].is_nan() {
                        v[i] + vmax[i]
                    } else if v[i] > vmax[i] {
                        v[i]
                    } else {
                        vmax[i]
                    };
                    vmax[i]
                }
                None => v[i],
            };
            let denom = second_moment.sqrt() / bc2_sqrt + eps;
            param[i] = p + neg_step * m[i] / denom;
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
