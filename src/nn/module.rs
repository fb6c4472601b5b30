//! The layer interface.

use crate::{Result, Tensor};

/// A layer: a forward function plus named parameters and buffers, named as
/// in PyTorch's `state_dict` (relative to the layer: `weight`, `bias`,
/// `running_mean`, …).
pub trait Module {
    /// Applies the layer.
    fn forward(&self, x: &Tensor) -> Result<Tensor>;

    /// Trainable (or frozen) parameters, with their PyTorch names.
    fn named_parameters(&self) -> Vec<(String, Tensor)>;

    /// Non-trainable state (e.g. BatchNorm's running statistics).
    fn named_buffers(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }

    /// Switches between training and evaluation behaviour (BatchNorm,
    /// Dropout); layers without such behaviour ignore it.
    fn set_training(&mut self, training: bool) {
        let _ = training;
    }

    /// The parameters, without names.
    fn parameters(&self) -> Vec<Tensor> {
        self.named_parameters()
            .into_iter()
            .map(|(_, t)| t)
            .collect()
    }
}
