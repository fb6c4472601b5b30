//! Repeated training steps of one model, for timing and for counting what
//! a step asks of a device: the model, optimizer, batch and targets are
//! made once; each [`StepRunner::step`] is what a training loop does per
//! batch (the batch copied from the host, forward, loss, backward, SGD
//! with momentum, the loss read back).

use super::{find_model, StepModel, StepSpec};
use crate::optim::{Optimizer, Sgd};
use crate::{Device, Error, Result, Tensor};

/// One model's training step, ready to repeat.
pub struct StepRunner {
    model: Box<dyn StepModel>,
    opt: Optimizer<Sgd>,
    /// The batch on the host (copied to the device at every step, as a
    /// data loader's batch is).
    host_input: Tensor,
    input_grad: bool,
    targets: Tensor,
    spec: StepSpec,
}

impl StepRunner {
    /// Builds the model named `name` (a model of `leangrad memory`) for
    /// `spec` (its batch, input, classes, dtype, case and device; the
    /// optimizer is SGD with momentum 0.9 whatever `spec.optimizer` says,
    /// fused into backward when `spec.fused`), its optimizer, a seeded
    /// batch on the host and the targets on the device.
    pub fn new(name: &str, spec: &StepSpec) -> Result<StepRunner> {
        let entry = find_model(name)?;
        let size = match spec.input {
            super::StepInput::Image { size, .. } => size,
            super::StepInput::Tokens { .. } => 0,
        };
        let mut model = (entry.build)(spec.classes, size, spec.dtype, spec.device)?;
        let params = super::trained_params(model.as_mut(), spec)?;
        let input_grad = spec.case.input_requires_grad();
        let opt = super::optimizer(params, Sgd::new(0.01).momentum(0.9), spec)?;
        // Token ids, or (for the `input` cases of text models) embeddings.
        let host_input = spec
            .input
            .make(spec.batch, input_grad, spec.dtype, Device::Cpu)?
            .set_requires_grad(false)?;
        let targets = spec.input.targets(spec.batch, spec.classes, spec.device)?;
        Ok(StepRunner {
            model,
            opt,
            host_input,
            input_grad,
            targets,
            spec: spec.clone(),
        })
    }

    /// One training step; returns the loss, read back to the host.
    pub fn step(&mut self) -> Result<f64> {
        let x = self
            .host_input
            .to_device(self.spec.device)?
            .set_requires_grad(self.input_grad)?;
        let loss = {
            let _autocast = self.spec.autocast.map(crate::autocast).transpose()?;
            self.model.step_loss(&x, &self.targets)?
        };
        if self.spec.fused {
            self.opt.backward_step(&loss)?;
        } else {
            loss.backward()?;
            self.opt.step()?;
            self.opt.zero_grad();
        }
        let value = loss.to_f64_vec()?;
        value
            .first()
            .copied()
            .ok_or_else(|| Error::InvalidArgument {
                op: "step",
                msg: "the loss is empty".into(),
            })
    }
}
