//! The gradient sinks of the fused path: the one that updates each
//! parameter the moment its gradient is final, and the one of the first
//! pass of global-norm clipping, which only adds up squared norms.

use super::{kernels, Algorithm, GradRelay, Optimizer};
use crate::autograd::engine::merge_leaf_gradient;
use crate::autograd::{CollectGrads, GradientSink};
use crate::tensor::Leaf;
use crate::{Result, Tensor};
use std::collections::HashMap;
use std::sync::Arc;

/// What the fused sink does with a final gradient.
pub(super) enum Mode {
    Accumulate,
    Update(super::Factors),
}

/// The fused optimizer's gradient sink.
pub(super) struct FusedSink<'o, 'r, A: Algorithm> {
    pub(super) opt: &'o mut Optimizer<A>,
    pub(super) mode: Mode,
    /// Where an updating micro-batch's gradients go before their update.
    pub(super) relay: Option<&'o mut (dyn GradRelay + 'r)>,
}

impl<A: Algorithm> GradientSink for FusedSink<'_, '_, A> {
    fn gradient_ready(
        &mut self,
        leaf: &Arc<Leaf>,
        param: Option<&Tensor>,
        grad: Tensor,
    ) -> Result<()> {
        let id = leaf.id();
        let (Some(&group), Some(param)) = (self.opt.index.get(&id), param) else {
            return CollectGrads.gradient_ready(leaf, param, grad);
        };
        // The buffer (if any) and this gradient, added as `.grad` would be.
        let grad = merge_leaf_gradient(self.opt.buffers.remove(&id), grad, Some(param))?;
        match self.mode {
            Mode::Accumulate => {
                self.opt.buffers.insert(id, grad);
                Ok(())
            }
            Mode::Update(scale) => match self.relay.as_deref_mut() {
                Some(relay) => {
                    let ready = relay.relay(param, grad)?;
                    self.opt.update_ready(ready, scale)
                }
                None => {
                    let param = param.clone();
                    self.opt.update_param(group, &param, &grad, scale)
                    // `grad` (and the buffer it may be) is dropped here.
                }
            },
        }
    }
}

/// Sink of the first global-norm pass: squared norms only.
pub(super) struct NormSink<'o> {
    pub(super) index: &'o HashMap<u64, usize>,
    pub(super) squares: HashMap<u64, f64>,
}

impl GradientSink for NormSink<'_> {
    fn gradient_ready(
        &mut self,
        leaf: &Arc<Leaf>,
        _param: Option<&Tensor>,
        grad: Tensor,
    ) -> Result<()> {
        if self.index.contains_key(&leaf.id()) {
            self.squares
                .insert(leaf.id(), kernels::sum_of_squares(&grad)?);
        }
        Ok(())
    }
}
