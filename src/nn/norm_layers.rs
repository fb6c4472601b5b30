//! Layer, group and RMS normalisation modules over the fused ops of
//! [`super::norm`]. Parameters start as PyTorch's do (weight ones, bias
//! zeros), so the constructors take no seed.

use super::norm::{group_norm, layer_norm, rms_norm};
use super::Module;
use crate::memory::scope;
use crate::{DType, Device, Error, Result, Tensor};

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
    /// A layer norm with PyTorch's parameters (`eps` default there: 1e-5).
    pub fn new(
        name: &str,
        normalized_shape: &[usize],
        eps: f64,
        elementwise_affine: bool,
        bias: bool,
        dtype: DType,
        device: Device,
    ) -> Result<LayerNorm> {
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
            eps,
            name: name.to_string(),
        })
    }
}

impl Module for LayerNorm {
    /// Layer norm of `x` `[…, *normalized_shape]`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let _s = scope(self.name.clone());
        layer_norm(
            x,
            &self.normalized_shape,
            self.weight.as_ref(),
            self.bias.as_ref(),
            self.eps,
        )
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
    /// A group norm; `num_groups` must divide `num_channels`.
    pub fn new(
        name: &str,
        num_groups: usize,
        num_channels: usize,
        eps: f64,
        affine: bool,
        dtype: DType,
        device: Device,
    ) -> Result<GroupNorm> {
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
            eps,
            name: name.to_string(),
        })
    }
}

impl Module for GroupNorm {
    /// Group norm of `x` `[N, C, *]` with `C` the layer's channel count.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let _s = scope(self.name.clone());
        if x.rank() < 2 || x.shape()[1] != self.num_channels {
            return Err(Error::ShapeMismatch {
                op: "group_norm",
                lhs: vec![self.num_channels],
                rhs: x.shape().to_vec(),
            });
        }
        group_norm(
            x,
            self.num_groups,
            self.weight.as_ref(),
            self.bias.as_ref(),
            self.eps,
        )
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
pub struct RMSNorm {
    /// Weight of `normalized_shape` (ones), if `elementwise_affine`.
    pub weight: Option<Tensor>,
    normalized_shape: Vec<usize>,
    eps: Option<f64>,
    name: String,
}

impl RMSNorm {
    /// An RMS norm with PyTorch's parameters.
    pub fn new(
        name: &str,
        normalized_shape: &[usize],
        eps: Option<f64>,
        elementwise_affine: bool,
        dtype: DType,
        device: Device,
    ) -> Result<RMSNorm> {
        if normalized_shape.is_empty() {
            return Err(Error::InvalidArgument {
                op: "RMSNorm",
                msg: "normalized_shape must not be empty".into(),
            });
        }
        Ok(RMSNorm {
            weight: elementwise_affine
                .then(|| param(normalized_shape, 1.0, dtype, device))
                .transpose()?,
            normalized_shape: normalized_shape.to_vec(),
            eps,
            name: name.to_string(),
        })
    }
}

impl Module for RMSNorm {
    /// RMS norm of `x` `[…, *normalized_shape]`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let _s = scope(self.name.clone());
        rms_norm(x, &self.normalized_shape, self.weight.as_ref(), self.eps)
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        named(&self.weight, &None)
    }
}
