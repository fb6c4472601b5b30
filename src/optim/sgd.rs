//! Stochastic gradient descent, as `torch.optim.SGD` (single-tensor path).

use super::kernels::{c, nonneg, Algorithm, GradPass, GradReader};
use super::SgdParams;
use super::UpdateRule;
use crate::{Error, FloatDType, Result};

/// SGD hyper-parameters, with torch.optim.SGD's meaning and defaults.
///
/// Per element, in this order (`g` the gradient after clipping):
/// `g = g + weight_decay·p`; with momentum, `buf = g` on the first update
/// and `buf = buf·momentum + (1 − dampening)·g` after, then
/// `g = g + momentum·buf` (Nesterov) or `g = buf`; finally `p = p − lr·g`.
/// State: one momentum buffer per parameter when `momentum != 0`, else none.
#[derive(Clone, Debug, PartialEq)]
pub struct Sgd {
    /// Learning rate.
    pub lr: f64,
    /// Momentum factor (0 disables the buffer).
    pub momentum: f64,
    /// Dampening of the momentum's gradient term.
    pub dampening: f64,
    /// L2 penalty added to the gradient.
    pub weight_decay: f64,
    /// Nesterov momentum (needs momentum > 0 and dampening 0).
    pub nesterov: bool,
    /// Maximize the objective instead of minimizing it.
    pub maximize: bool,
}

impl Sgd {
    /// Plain SGD with learning rate `lr`.
    pub fn new(lr: f64) -> Sgd {
        Sgd {
            lr,
            momentum: 0.0,
            dampening: 0.0,
            weight_decay: 0.0,
            nesterov: false,
            maximize: false,
        }
    }

    /// With momentum factor `m`.
    pub fn momentum(mut self, m: f64) -> Sgd {
        self.momentum = m;
        self
    }

    /// With dampening `d`.
    pub fn dampening(mut self, d: f64) -> Sgd {
        self.dampening = d;
        self
    }

    /// With L2 weight decay `wd`.
    pub fn weight_decay(mut self, wd: f64) -> Sgd {
        self.weight_decay = wd;
        self
    }

    /// With Nesterov momentum on or off.
    pub fn nesterov(mut self, on: bool) -> Sgd {
        self.nesterov = on;
        self
    }

    /// Maximizing instead of minimizing.
    pub fn maximize(mut self, on: bool) -> Sgd {
        self.maximize = on;
        self
    }
}

fn invalid(msg: String) -> Error {
    Error::InvalidArgument { op: "SGD", msg }
}

impl Algorithm for Sgd {
    const NAME: &'static str = "SGD";

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
        if !nonneg(self.momentum) {
            return Err(invalid(format!("invalid momentum {}", self.momentum)));
        }
        if !nonneg(self.weight_decay) {
            return Err(invalid(format!(
                "invalid weight_decay {}",
                self.weight_decay
            )));
        }
        if self.nesterov && (self.momentum <= 0.0 || self.dampening != 0.0) {
            return Err(invalid(
                "Nesterov momentum requires a momentum and zero dampening".into(),
            ));
        }
        Ok(())
    }

    fn state_slots(&self) -> usize {
        usize::from(self.momentum != 0.0)
    }

    fn update<T: FloatDType>(
        &self,
        step: u64,
        param: &mut [T],
        grad: &GradReader<'_, T>,
        state: &mut [&mut [T]],
    ) {
        let n = param.len();
        let buf = state.first_mut().map(|b| &mut b[..n]);
        grad.elements(
            n,
            SgdPass {
                sgd: self,
                step,
                param,
                buf,
            },
        );
    }

    fn rule(&self) -> Option<UpdateRule> {
        Some(UpdateRule::Sgd(SgdParams {
            lr: self.lr,
            momentum: self.momentum,
            dampening: self.dampening,
            weight_decay: self.weight_decay,
            nesterov: self.nesterov,
            maximize: self.maximize,
        }))
    }
}

/// One SGD update over a parameter (and its momentum buffer), run once per
/// form of the gradient by [`GradReader::elements`].
struct SgdPass<'a, T> {
    sgd: &'a Sgd,
    step: u64,
    param: &'a mut [T],
    buf: Option<&'a mut [T]>,
}

impl<T: FloatDType> GradPass<T, ()> for SgdPass<'_, T> {
    #[inline(always)]
    fn run(self, grad: impl Iterator<Item = T>) {
        let sgd = self.sgd;
        let wd: T = c(sgd.weight_decay);
        let m: T = c(sgd.momentum);
        let keep: T = c(1.0 - sgd.dampening);
        let neg_lr: T = c(-sgd.lr);
        let (decay, maximize, nesterov) = (sgd.weight_decay != 0.0, sgd.maximize, sgd.nesterov);
        // Branch-free in the loop's eyes: each flag is the same for every
        // element, and both arms are plain arithmetic.
        let direction = |g: T, p: T| {
            let g = if maximize { -g } else { g };
            if decay {
                g + wd * p
            } else {
                g
            }
        };
        match self.buf {
            None => {
                for (p, g) in self.param.iter_mut().zip(grad) {
                    let g = direction(g, *p);
                    *p = *p + neg_lr * g;
                }
            }
            Some(buf) if self.step == 1 => {
                for ((p, b), g) in self.param.iter_mut().zip(buf.iter_mut()).zip(grad) {
                    let g = direction(g, *p);
                    *b = g;
                    let g = if nesterov { g + m * g } else { g };
                    *p = *p + neg_lr * g;
                }
            }
            Some(buf) => {
                for ((p, b), g) in self.param.iter_mut().zip(buf.iter_mut()).zip(grad) {
                    let g = direction(g, *p);
                    let nb = *b * m + keep * g;
                    *b = nb;
                    let g = if nesterov { g + m * nb } else { nb };
                    *p = *p + neg_lr * g;
                }
            }
        }
    }
}
