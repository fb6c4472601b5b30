//! The layer interface.

use super::stats_sync::BatchStatsSync;
use crate::{Result, Tensor};
use std::sync::Arc;

/// The kind of layer a parameter belongs to; the selective-differentiation
/// cases (norm-only, conv-only, linear-only, …) pick parameters by it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LayerKind {
    /// Convolutions (Conv1d, Conv2d, ConvTranspose2d, a ViT patch embedding).
    Conv,
    /// Fully connected layers, attention projections, GPT-2's `Conv1D`.
    Linear,
    /// BatchNorm, LayerNorm, GroupNorm, RMSNorm.
    Norm,
    /// Embedding tables.
    Embedding,
    /// Anything else (a class token, learned position embeddings, …).
    Other,
}

/// A layer: a forward function plus named parameters and buffers, named as
/// in PyTorch's `state_dict` (relative to the layer: `weight`, `bias`,
/// `running_mean`, …).
///
/// The layers are `Clone`: a clone shares the parameter and buffer tensors
/// (as `Tensor::clone` does) and a dropout layer's random stream, so a
/// clone moved into a checkpointed segment ([`crate::autograd::checkpoint`])
/// is the same layer, not a copy of it.
pub trait Module {
    /// Applies the layer.
    fn forward(&self, x: &Tensor) -> Result<Tensor>;

    /// Applies the layer to an input the caller hands over. A layer that can
    /// write its output over its input (activations, norms whose backward
    /// does not read their input, residual adds) does so when buffer reuse
    /// is on and nothing else holds the input
    /// ([`crate::autograd::may_reuse`]); values, gradients and what is saved
    /// are those of [`Module::forward`], only fewer bytes are allocated. The
    /// models chain their layers through it. The default calls `forward`.
    fn forward_owned(&self, x: Tensor) -> Result<Tensor> {
        self.forward(&x)
    }

    /// Trainable (or frozen) parameters, with their PyTorch names.
    fn named_parameters(&self) -> Vec<(String, Tensor)>;

    /// The kind of layer each parameter belongs to, with the names and in
    /// the order of [`Module::named_parameters`]. The default says
    /// [`LayerKind::Other`] for every parameter.
    fn parameter_kinds(&self) -> Vec<(String, LayerKind)> {
        self.named_parameters()
            .into_iter()
            .map(|(n, _)| (n, LayerKind::Other))
            .collect()
    }

    /// Non-trainable state (e.g. BatchNorm's running statistics).
    fn named_buffers(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }

    /// Switches between training and evaluation behaviour (BatchNorm,
    /// Dropout); layers without such behaviour ignore it.
    fn set_training(&mut self, training: bool) {
        let _ = training;
    }

    /// Makes every batch norm inside normalise training batches with the
    /// statistics of the whole batch over the ranks of `sync`
    /// (`torch.nn.SyncBatchNorm.convert_sync_batchnorm`), or per rank again
    /// with `None`; returns how many batch norms it set. Modules holding
    /// batch norms pass it on to them; the default (no batch norm) sets
    /// none.
    fn sync_batch_norm(&mut self, sync: Option<&Arc<dyn BatchStatsSync>>) -> usize {
        let _ = sync;
        0
    }

    /// The parameters, without names.
    fn parameters(&self) -> Vec<Tensor> {
        self.named_parameters()
            .into_iter()
            .map(|(_, t)| t)
            .collect()
    }
}

/// A boxed module is the module it holds (so `Box<dyn Module>` wraps and
/// chains as any layer does).
impl<M: Module + ?Sized> Module for Box<M> {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        (**self).forward(x)
    }

    fn forward_owned(&self, x: Tensor) -> Result<Tensor> {
        (**self).forward_owned(x)
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        (**self).named_parameters()
    }

    fn parameter_kinds(&self) -> Vec<(String, LayerKind)> {
        (**self).parameter_kinds()
    }

    fn named_buffers(&self) -> Vec<(String, Tensor)> {
        (**self).named_buffers()
    }

    fn set_training(&mut self, training: bool) {
        (**self).set_training(training)
    }

    fn sync_batch_norm(&mut self, sync: Option<&Arc<dyn BatchStatsSync>>) -> usize {
        (**self).sync_batch_norm(sync)
    }
}

/// Every parameter of `module` labelled `kind`: what a layer that is one
/// kind of layer answers for [`Module::parameter_kinds`].
pub fn parameters_of_kind(module: &dyn Module, kind: LayerKind) -> Vec<(String, LayerKind)> {
    module
        .named_parameters()
        .into_iter()
        .map(|(n, _)| (n, kind))
        .collect()
}
