//! Fully connected layer: `y = x Wᵀ + b` with PyTorch's weight layout.

use super::Module;
use crate::memory::scope;
use crate::{DType, Device, Result, Tensor};

/// `y = x Wᵀ + b`, weight `[out, in]` and bias `[out]` as in `torch.nn.Linear`.
///
/// Saved for backward (through matmul): the input only if the weight needs
/// grad, the weight only if the input needs grad; the bias needs nothing.
pub struct Linear {
    /// `[out_features, in_features]`.
    pub weight: Tensor,
    /// `[out_features]`, if any.
    pub bias: Option<Tensor>,
    name: String,
}

impl Linear {
    /// A layer initialised like PyTorch's default (uniform in ±1/√in),
    /// from a seeded Philox stream; parameters are counted as parameters.
    pub fn new(
        name: &str,
        in_features: usize,
        out_features: usize,
        bias: bool,
        dtype: DType,
        device: Device,
        seed: u64,
    ) -> Result<Linear> {
        let bound = 1.0 / (in_features as f64).sqrt();
        let weight = Tensor::rand_range(
            &[out_features, in_features],
            -bound,
            bound,
            dtype,
            device,
            seed,
        )?
        .into_parameter()?;
        let bias = if bias {
            Some(
                Tensor::rand_range(&[out_features], -bound, bound, dtype, device, seed ^ 0x5eed)?
                    .into_parameter()?,
            )
        } else {
            None
        };
        Ok(Linear {
            weight,
            bias,
            name: name.to_string(),
        })
    }

    /// The layer's name in scopes and reports.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Module for Linear {
    /// Applies the layer to `x` of shape `[…, in_features]`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let _s = scope(self.name.clone());
        let y = x.matmul(&self.weight.t()?)?;
        match &self.bias {
            Some(b) => y.add(b),
            None => Ok(y),
        }
    }

    fn parameter_kinds(&self) -> Vec<(String, crate::nn::LayerKind)> {
        crate::nn::parameters_of_kind(self, crate::nn::LayerKind::Linear)
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let mut p = vec![("weight".to_string(), self.weight.clone())];
        p.extend(self.bias.clone().map(|b| ("bias".to_string(), b)));
        p
    }
}
