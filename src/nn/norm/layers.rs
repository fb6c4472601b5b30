//! Batch, layer, group and RMS normalisation modules over the fused ops
//! [`batch_norm`](super::batch_norm), [`layer_norm`], [`group_norm`] and [`rms_norm`] (what
//! each saves for backward: the table in `norm/mod.rs`). Parameters start
//! as PyTorch's do (weight ones, bias zeros), so the constructors take no
//! seed. Each module is made by a builder with PyTorch's defaults
//! (`LayerNorm::builder(&[768]).eps(1e-12).build(&device)`).

use super::batch_norm::{
    batch_norm_borrowed, batch_norm_owned, batch_norm_relu_owned, BnState, Mode as BnMode,
    NormThenRelu,
};
use super::row_norms::{group_norm_owned, layer_norm_owned};
use super::{group_norm, layer_norm, rms_norm};
use crate::memory::scope;
use crate::memory::Category;
use crate::nn::input::{check_dtype_of, check_min_rank, check_rank, check_size, check_trailing};
use crate::nn::{BatchStatsSync, Module};
use crate::ops::autocast::{widen, widen_owned, widens};
use crate::{DType, Device, Error, Result, Tensor};
use std::sync::Arc;

fn param(shape: &[usize], v: f64, dtype: DType, device: Device) -> Result<Tensor> {
    Tensor::full(shape, v, dtype, device)?.into_parameter()
}

fn named(w: &Option<Tensor>, b: &Option<Tensor>) -> Vec<(String, Tensor)> {
    let mut p: Vec<(String, Tensor)> = Vec::new();
    p.extend(w.clone().map(|t| ("weight".to_string(), t)));
    p.extend(b.clone().map(|t| ("bias".to_string(), t)));
    p
}

/// `torch.nn.LayerNorm`: normalises over the trailing `normalized_shape`.
///
/// Saves (lean): `x̂` if the input or weight needs grad; per-row rstd and
/// the weight if the input needs grad; nothing for bias only. SaveAll:
/// input, weight, bias, per-row mean and rstd.
#[derive(Clone)]
pub struct LayerNorm {
    /// Weight of `normalized_shape` (ones), if `elementwise_affine`.
    pub weight: Option<Tensor>,
    /// Bias of `normalized_shape` (zeros), if `elementwise_affine` and `bias`.
    pub bias: Option<Tensor>,
    normalized_shape: Vec<usize>,
    eps: f64,
    name: String,
}

impl LayerNorm {
    /// The layer `b` describes, its parameters on `device`.
    fn new(b: &LayerNormBuilder, device: Device) -> Result<LayerNorm> {
        let (normalized_shape, dtype) = (&b.normalized_shape[..], b.dtype);
        let (elementwise_affine, bias) = (b.elementwise_affine, b.bias);
        if normalized_shape.is_empty() {
            return Err(Error::InvalidArgument {
                op: "LayerNorm",
                msg: "normalized_shape must not be empty".into(),
            });
        }
        let s = normalized_shape;
        Ok(LayerNorm {
            weight: elementwise_affine
                .then(|| param(s, 1.0, dtype, device))
                .transpose()?,
            bias: (elementwise_affine && bias)
                .then(|| param(s, 0.0, dtype, device))
                .transpose()?,
            normalized_shape: s.to_vec(),
            eps: b.eps,
            name: b.name.clone(),
        })
    }

    /// The layer's name in scopes and reports.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A builder with PyTorch's defaults (`eps` 1e-5, affine with bias,
    /// f32, named `layer_norm`).
    pub fn builder(normalized_shape: &[usize]) -> LayerNormBuilder {
        LayerNormBuilder {
            name: "layer_norm".into(),
            normalized_shape: normalized_shape.to_vec(),
            eps: 1e-5,
            elementwise_affine: true,
            bias: true,
            dtype: DType::F32,
        }
    }
}

/// Builds a [`LayerNorm`]; see [`LayerNorm::builder`] for the defaults.
#[derive(Clone, Debug)]
pub struct LayerNormBuilder {
    name: String,
    normalized_shape: Vec<usize>,
    eps: f64,
    elementwise_affine: bool,
    bias: bool,
    dtype: DType,
}

impl LayerNormBuilder {
    /// The layer's name (its scope in memory reports).
    pub fn name(mut self, name: &str) -> Self {
        self.name = name.to_string();
        self
    }
    /// Added to the variance.
    pub fn eps(mut self, eps: f64) -> Self {
        self.eps = eps;
        self
    }
    /// Learnable weight (and bias, unless [`Self::bias`] is false).
    pub fn elementwise_affine(mut self, on: bool) -> Self {
        self.elementwise_affine = on;
        self
    }
    /// Learnable bias (only with `elementwise_affine`).
    pub fn bias(mut self, on: bool) -> Self {
        self.bias = on;
        self
    }
    /// Dtype of the parameters.
    pub fn dtype(mut self, dtype: DType) -> Self {
        self.dtype = dtype;
        self
    }
    /// The layer norm, its parameters on `device` (an error if
    /// `normalized_shape` is empty).
    pub fn build(&self, device: &Device) -> Result<LayerNorm> {
        LayerNorm::new(self, *device)
    }
}

impl Module for LayerNorm {
    /// Layer norm of `x` `[…, *normalized_shape]`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let _s = scope(self.name.clone());
        let x = &widen(x)?;
        check_trailing(x, &self.normalized_shape)?;
        check_dtype_of(x, self.weight.as_ref())?;
        layer_norm(
            x,
            &self.normalized_shape,
            self.weight.as_ref(),
            self.bias.as_ref(),
            self.eps,
        )
    }

    /// As `forward`, writing the output over `x` when nothing else holds it
    /// and buffer reuse is on.
    fn forward_owned(&self, x: Tensor) -> Result<Tensor> {
        let _s = scope(self.name.clone());
        let x = widen_owned(x)?;
        check_trailing(&x, &self.normalized_shape)?;
        check_dtype_of(&x, self.weight.as_ref())?;
        layer_norm_owned(
            x,
            &self.normalized_shape,
            self.weight.as_ref(),
            self.bias.as_ref(),
            self.eps,
        )
    }

    fn parameter_kinds(&self) -> Vec<(String, crate::nn::LayerKind)> {
        crate::nn::parameters_of_kind(self, crate::nn::LayerKind::Norm)
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        named(&self.weight, &self.bias)
    }
}

/// `torch.nn.GroupNorm`: normalises `[N, C, *]` over groups of channels.
///
/// Saves (lean): `x̂` if the input or weight needs grad; per-(sample,
/// group) rstd and the weight if the input needs grad; nothing for bias
/// only. SaveAll: input, weight, mean and rstd.
#[derive(Clone)]
pub struct GroupNorm {
    /// `[C]` weight (ones), if affine.
    pub weight: Option<Tensor>,
    /// `[C]` bias (zeros), if affine.
    pub bias: Option<Tensor>,
    num_groups: usize,
    num_channels: usize,
    eps: f64,
    name: String,
}

impl GroupNorm {
    /// The layer `b` describes, its parameters on `device`.
    fn new(b: &GroupNormBuilder, device: Device) -> Result<GroupNorm> {
        let (num_groups, num_channels) = (b.num_groups, b.num_channels);
        let (affine, dtype) = (b.affine, b.dtype);
        if num_groups == 0 || !num_channels.is_multiple_of(num_groups) {
            return Err(Error::InvalidArgument {
                op: "GroupNorm",
                msg: format!("{num_groups} groups do not divide {num_channels} channels"),
            });
        }
        let c = [num_channels];
        Ok(GroupNorm {
            weight: affine.then(|| param(&c, 1.0, dtype, device)).transpose()?,
            bias: affine.then(|| param(&c, 0.0, dtype, device)).transpose()?,
            num_groups,
            num_channels,
            eps: b.eps,
            name: b.name.clone(),
        })
    }

    /// A builder with PyTorch's defaults (`eps` 1e-5, affine, f32, named
    /// `group_norm`).
    pub fn builder(num_groups: usize, num_channels: usize) -> GroupNormBuilder {
        GroupNormBuilder {
            name: "group_norm".into(),
            num_groups,
            num_channels,
            eps: 1e-5,
            affine: true,
            dtype: DType::F32,
        }
    }
}

/// Builds a [`GroupNorm`]; see [`GroupNorm::builder`] for the defaults.
#[derive(Clone, Debug)]
pub struct GroupNormBuilder {
    name: String,
    num_groups: usize,
    num_channels: usize,
    eps: f64,
    affine: bool,
    dtype: DType,
}

impl GroupNormBuilder {
    /// The layer's name (its scope in memory reports).
    pub fn name(mut self, name: &str) -> Self {
        self.name = name.to_string();
        self
    }
    /// Added to the variance.
    pub fn eps(mut self, eps: f64) -> Self {
        self.eps = eps;
        self
    }
    /// Learnable per-channel weight and bias.
    pub fn affine(mut self, on: bool) -> Self {
        self.affine = on;
        self
    }
    /// Dtype of the parameters.
    pub fn dtype(mut self, dtype: DType) -> Self {
        self.dtype = dtype;
        self
    }
    /// The group norm, its parameters on `device` (an error unless the
    /// groups divide the channels).
    pub fn build(&self, device: &Device) -> Result<GroupNorm> {
        GroupNorm::new(self, *device)
    }
}

impl Module for GroupNorm {
    /// Group norm of `x` `[N, C, *]` with `C` the layer's channel count.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let _s = scope(self.name.clone());
        let x = &widen(x)?;
        check_min_rank(x, 2, "[N, C, *]")?;
        check_size(x, 1, self.num_channels, "channels (dim 1)")?;
        check_dtype_of(x, self.weight.as_ref())?;
        group_norm(
            x,
            self.num_groups,
            self.weight.as_ref(),
            self.bias.as_ref(),
            self.eps,
        )
    }

    /// As `forward`, writing the output over `x` when nothing else holds it
    /// and buffer reuse is on.
    fn forward_owned(&self, x: Tensor) -> Result<Tensor> {
        let _s = scope(self.name.clone());
        let x = widen_owned(x)?;
        check_min_rank(&x, 2, "[N, C, *]")?;
        check_size(&x, 1, self.num_channels, "channels (dim 1)")?;
        check_dtype_of(&x, self.weight.as_ref())?;
        group_norm_owned(
            x,
            self.num_groups,
            self.weight.as_ref(),
            self.bias.as_ref(),
            self.eps,
        )
    }

    fn parameter_kinds(&self) -> Vec<(String, crate::nn::LayerKind)> {
        crate::nn::parameters_of_kind(self, crate::nn::LayerKind::Norm)
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        named(&self.weight, &self.bias)
    }
}

/// `torch.nn.RMSNorm`: `x/√(mean(x²) + eps)·w` over the trailing
/// `normalized_shape`; `eps` of `None` is the dtype's machine epsilon.
///
/// Saves (lean): `x̂` if the input or weight needs grad; per-row rstd and
/// the weight if the input needs grad. SaveAll: input, weight and rstd.
#[derive(Clone)]
pub struct RMSNorm {
    /// Weight of `normalized_shape` (ones), if `elementwise_affine`.
    pub weight: Option<Tensor>,
    normalized_shape: Vec<usize>,
    eps: Option<f64>,
    name: String,
}

impl RMSNorm {
    /// The layer `b` describes, its parameters on `device`.
    fn new(b: &RMSNormBuilder, device: Device) -> Result<RMSNorm> {
        let (normalized_shape, dtype) = (&b.normalized_shape[..], b.dtype);
        if normalized_shape.is_empty() {
            return Err(Error::InvalidArgument {
                op: "RMSNorm",
                msg: "normalized_shape must not be empty".into(),
            });
        }
        Ok(RMSNorm {
            weight: b
                .elementwise_affine
                .then(|| param(normalized_shape, 1.0, dtype, device))
                .transpose()?,
            normalized_shape: normalized_shape.to_vec(),
            eps: b.eps,
            name: b.name.clone(),
        })
    }

    /// A builder with PyTorch's defaults (`eps` `None`: the dtype's machine
    /// epsilon; affine; f32; named `rms_norm`).
    pub fn builder(normalized_shape: &[usize]) -> RMSNormBuilder {
        RMSNormBuilder {
            name: "rms_norm".into(),
            normalized_shape: normalized_shape.to_vec(),
            eps: None,
            elementwise_affine: true,
            dtype: DType::F32,
        }
    }
}

/// Builds an [`RMSNorm`]; see [`RMSNorm::builder`] for the defaults.
#[derive(Clone, Debug)]
pub struct RMSNormBuilder {
    name: String,
    normalized_shape: Vec<usize>,
    eps: Option<f64>,
    elementwise_affine: bool,
    dtype: DType,
}

impl RMSNormBuilder {
    /// The layer's name (its scope in memory reports).
    pub fn name(mut self, name: &str) -> Self {
        self.name = name.to_string();
        self
    }
    /// Added to the mean square (`None`: the dtype's machine epsilon).
    pub fn eps(mut self, eps: Option<f64>) -> Self {
        self.eps = eps;
        self
    }
    /// Learnable weight.
    pub fn elementwise_affine(mut self, on: bool) -> Self {
        self.elementwise_affine = on;
        self
    }
    /// Dtype of the parameters.
    pub fn dtype(mut self, dtype: DType) -> Self {
        self.dtype = dtype;
        self
    }
    /// The RMS norm, its parameters on `device` (an error if
    /// `normalized_shape` is empty).
    pub fn build(&self, device: &Device) -> Result<RMSNorm> {
        RMSNorm::new(self, *device)
    }
}

impl Module for RMSNorm {
    /// RMS norm of `x` `[…, *normalized_shape]`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let _s = scope(self.name.clone());
        let x = &widen(x)?;
        check_trailing(x, &self.normalized_shape)?;
        check_dtype_of(x, self.weight.as_ref())?;
        rms_norm(x, &self.normalized_shape, self.weight.as_ref(), self.eps)
    }

    fn parameter_kinds(&self) -> Vec<(String, crate::nn::LayerKind)> {
        crate::nn::parameters_of_kind(self, crate::nn::LayerKind::Norm)
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        named(&self.weight, &None)
    }
}

/// Options of [`BatchNorm`], with PyTorch's defaults.
#[derive(Clone, Copy, Debug)]
pub struct BatchNormOptions {
    /// Added to the variance (default 1e-5).
    pub eps: f64,
    /// Running-statistics factor; `None` = cumulative average (default 0.1).
    pub momentum: Option<f64>,
    /// Learnable per-channel weight (ones) and bias (zeros) (default true).
    pub affine: bool,
    /// Keep running statistics for eval mode (default true).
    pub track_running_stats: bool,
}

impl Default for BatchNormOptions {
    fn default() -> Self {
        BatchNormOptions {
            eps: 1e-5,
            momentum: Some(0.1),
            affine: true,
            track_running_stats: true,
        }
    }
}

/// `torch.nn.BatchNorm1d` (`[N, C]` or `[N, C, L]`) and `BatchNorm2d`
/// (`[N, C, H, W]`). Starts in training mode. Saves what [`batch_norm`](super::batch_norm)
/// saves: train mode `x̂` + C-sized `weight·invstd` for the input gradient,
/// `x̂` for the weight gradient; eval mode only `weight·invstd` for the
/// input gradient, `x̂` for the weight gradient; nothing for bias only.
#[derive(Clone)]
pub struct BatchNorm {
    /// `[C]` weight (ones), if affine.
    pub weight: Option<Tensor>,
    /// `[C]` bias (zeros), if affine.
    pub bias: Option<Tensor>,
    /// `[C]` running mean (zeros), if tracked.
    pub running_mean: Option<Tensor>,
    /// `[C]` running variance (ones), if tracked.
    pub running_var: Option<Tensor>,
    /// Scalar i64 count of training batches, if tracked.
    pub num_batches_tracked: Option<Tensor>,
    options: BatchNormOptions,
    num_features: usize,
    ranks: &'static [usize],
    training: bool,
    name: String,
    /// The ranks whose batches are normalised together in training mode
    /// (`SyncBatchNorm`); `None`: this rank's batch alone.
    sync: Option<Arc<dyn BatchStatsSync>>,
}

impl BatchNorm {
    fn new(
        name: &str,
        num_features: usize,
        options: BatchNormOptions,
        ranks: &'static [usize],
        dtype: DType,
        device: Device,
    ) -> Result<BatchNorm> {
        let c = [num_features];
        let param = |v: f64| Tensor::full(&c, v, dtype, device)?.into_parameter();
        // Buffers are model state: counted with the parameters.
        let buffer = |t: Tensor| {
            t.set_memory_category(Category::Parameter);
            t
        };
        let tracked = options.track_running_stats;
        Ok(BatchNorm {
            weight: options.affine.then(|| param(1.0)).transpose()?,
            bias: options.affine.then(|| param(0.0)).transpose()?,
            running_mean: tracked
                .then(|| Tensor::zeros(&c, dtype, device).map(buffer))
                .transpose()?,
            running_var: tracked
                .then(|| Tensor::ones(&c, dtype, device).map(buffer))
                .transpose()?,
            num_batches_tracked: tracked
                .then(|| Tensor::zeros(&[], DType::I64, device).map(buffer))
                .transpose()?,
            options,
            num_features,
            ranks,
            training: true,
            name: name.to_string(),
            sync: None,
        })
    }

    /// Whether the layer is in training mode.
    pub fn is_training(&self) -> bool {
        self.training
    }

    /// Whether training batches are normalised with statistics over the
    /// ranks of a group of more than one rank (see
    /// [`Module::sync_batch_norm`]).
    pub fn is_synced(&self) -> bool {
        self.sync.as_ref().is_some_and(|s| s.world_size() > 1)
    }

    /// A builder with PyTorch's defaults ([`BatchNormOptions::default`],
    /// f32, named `batch_norm`):
    /// `BatchNorm::builder(64).momentum(None).build2d(&device)`.
    pub fn builder(num_features: usize) -> BatchNormBuilder {
        BatchNormBuilder {
            name: "batch_norm".into(),
            num_features,
            options: BatchNormOptions::default(),
            dtype: DType::F32,
        }
    }
}

/// Builds a [`BatchNorm`] (`BatchNorm1d` by [`build1d`](Self::build1d),
/// `BatchNorm2d` by [`build2d`](Self::build2d)); see [`BatchNorm::builder`].
#[derive(Clone, Debug)]
pub struct BatchNormBuilder {
    name: String,
    num_features: usize,
    options: BatchNormOptions,
    dtype: DType,
}

impl BatchNormBuilder {
    /// The layer's name (its scope in memory reports).
    pub fn name(mut self, name: &str) -> Self {
        self.name = name.to_string();
        self
    }
    /// Added to the variance.
    pub fn eps(mut self, eps: f64) -> Self {
        self.options.eps = eps;
        self
    }
    /// Running-statistics factor; `None` = cumulative average.
    pub fn momentum(mut self, momentum: Option<f64>) -> Self {
        self.options.momentum = momentum;
        self
    }
    /// Learnable per-channel weight and bias.
    pub fn affine(mut self, on: bool) -> Self {
        self.options.affine = on;
        self
    }
    /// Keep running statistics for eval mode.
    pub fn track_running_stats(mut self, on: bool) -> Self {
        self.options.track_running_stats = on;
        self
    }
    /// Every option at once.
    pub fn options(mut self, options: BatchNormOptions) -> Self {
        self.options = options;
        self
    }
    /// Dtype of the parameters and running statistics.
    pub fn dtype(mut self, dtype: DType) -> Self {
        self.dtype = dtype;
        self
    }
    /// `BatchNorm1d` (inputs `[N, C]` or `[N, C, L]`) on `device`.
    pub fn build1d(&self, device: &Device) -> Result<BatchNorm> {
        let (name, options) = (&self.name, self.options);
        BatchNorm::new(
            name,
            self.num_features,
            options,
            &[2, 3],
            self.dtype,
            *device,
        )
    }
    /// `BatchNorm2d` (inputs `[N, C, H, W]`) on `device`.
    pub fn build2d(&self, device: &Device) -> Result<BatchNorm> {
        let (name, options) = (&self.name, self.options);
        BatchNorm::new(name, self.num_features, options, &[4], self.dtype, *device)
    }
}

impl BatchNorm {
    /// `relu(self(x))` on an input handed over, the ReLU in place (as
    /// `ReLU { inplace: true }.forward_owned(self.forward_owned(x))`: the
    /// same values, nodes and saved tensors, a 1-bit mask for the ReLU).
    /// Where the output goes over `x` under the lean policy on CUDA, the
    /// ReLU and its mask come from the norm's own kernel (one pass over
    /// the activations instead of two).
    pub fn forward_relu_owned(&self, x: Tensor) -> Result<Tensor> {
        let _s = scope(self.name.clone());
        let y = self.run(x, Entry::OwnedRelu)?;
        // The ReLU is recorded outside the norm's scope, where a ReLU layer
        // after it would run.
        drop(_s);
        y.finish()
    }

    /// The forward of every entry point (the caller opened the norm's
    /// scope).
    fn run(&self, x: Tensor, entry: Entry) -> Result<NormThenRelu> {
        let layout = match self.ranks {
            [4] => "[N, C, H, W]",
            [5] => "[N, C, D, H, W]",
            _ => "[N, C] or [N, C, L]",
        };
        check_rank(&x, self.ranks, layout)?;
        check_size(&x, 1, self.num_features, "channels (dim 1)")?;
        // Under autocast an f16/bf16 input meets f32 parameters (batch_norm
        // normalises it in f32).
        if !widens(&x) {
            check_dtype_of(&x, self.weight.as_ref().or(self.running_mean.as_ref()))?;
        }
        // `num_batches_tracked` moves on with the running statistics, on
        // their device. Only the cumulative average (momentum None) needs
        // its value here: a host read, as PyTorch's `float(...)` is.
        let counter = self.num_batches_tracked.as_ref().filter(|_| self.training);
        let factor = match (self.options.momentum, counter) {
            (Some(m), _) => m,
            (None, Some(n)) => 1.0 / (n.small_values()?.first().copied().unwrap_or(0.0) + 1.0),
            (None, None) => 0.0,
        };
        let state = BnState {
            running_mean: self.running_mean.as_ref(),
            running_var: self.running_var.as_ref(),
            weight: self.weight.as_ref(),
            bias: self.bias.as_ref(),
            num_batches_tracked: counter,
            // Eval mode normalises with the running statistics: nothing to
            // exchange.
            sync: self
                .sync
                .as_ref()
                .filter(|s| s.world_size() > 1 && self.training),
        };
        let mode = BnMode {
            training: self.training || self.running_mean.is_none(),
            momentum: factor,
            eps: self.options.eps,
        };
        match entry {
            Entry::Borrowed => batch_norm_borrowed(&x, &state, mode).map(NormThenRelu::from),
            Entry::Owned => batch_norm_owned(x, &state, mode).map(NormThenRelu::from),
            Entry::OwnedRelu => batch_norm_relu_owned(x, &state, mode),
        }
    }
}

/// How a batch norm's forward was entered.
#[derive(Clone, Copy)]
enum Entry {
    /// `x` borrowed: never written.
    Borrowed,
    /// `x` handed over: the output may take its buffer.
    Owned,
    /// Handed over, and ReLU in place after the norm.
    OwnedRelu,
}

impl Module for BatchNorm {
    /// Normalises `x`; in training mode (or without running statistics)
    /// with batch statistics, updating the running statistics and
    /// `num_batches_tracked`; in eval mode with the running statistics.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let _s = scope(self.name.clone());
        self.run(x.clone(), Entry::Borrowed)?.without_relu()
    }

    /// As `forward`, writing the output over `x` when nothing else holds it
    /// and buffer reuse is on (batch norm's backward never reads its input
    /// under the lean policy), in train and eval mode alike.
    fn forward_owned(&self, x: Tensor) -> Result<Tensor> {
        let _s = scope(self.name.clone());
        self.run(x, Entry::Owned)?.without_relu()
    }

    fn parameter_kinds(&self) -> Vec<(String, crate::nn::LayerKind)> {
        crate::nn::parameters_of_kind(self, crate::nn::LayerKind::Norm)
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let mut p: Vec<(String, Tensor)> = Vec::new();
        p.extend(self.weight.clone().map(|t| ("weight".to_string(), t)));
        p.extend(self.bias.clone().map(|t| ("bias".to_string(), t)));
        p
    }

    fn named_buffers(&self) -> Vec<(String, Tensor)> {
        let mut b: Vec<(String, Tensor)> = Vec::new();
        b.extend(
            self.running_mean
                .clone()
                .map(|t| ("running_mean".to_string(), t)),
        );
        b.extend(
            self.running_var
                .clone()
                .map(|t| ("running_var".to_string(), t)),
        );
        b.extend(
            self.num_batches_tracked
                .clone()
                .map(|t| ("num_batches_tracked".to_string(), t)),
        );
        b
    }

    fn set_training(&mut self, training: bool) {
        self.training = training;
    }

    /// With a group of more than one rank, training batches are normalised
    /// with the mean and variance of all ranks' batches together (as
    /// `torch.nn.SyncBatchNorm`): the forward all-gathers each rank's
    /// per-channel mean, variance and count (combined in f64 in rank
    /// order, the same on every rank), the running statistics move with
    /// the global ones, and the input gradient's two per-channel sums are
    /// all-reduced in backward. It saves what the layer saves unsynced;
    /// the weight and bias gradients stay this rank's (data parallel
    /// averages them). Eval mode exchanges nothing.
    fn sync_batch_norm(&mut self, sync: Option<&Arc<dyn BatchStatsSync>>) -> usize {
        self.sync = sync.cloned();
        1
    }
}
