//! Fully connected layer: `y = x Wᵀ + b` with PyTorch's weight layout.

use super::init::Init;
use super::Module;
use crate::memory::scope;
use crate::nn::input::{check_dtype, check_min_rank, check_size};
use crate::ops::autocast::lower3;
use crate::{DType, Device, Result, Tensor};

/// `y = x Wᵀ + b`, weight `[out, in]` and bias `[out]` as in `torch.nn.Linear`.
///
/// Saved for backward (through matmul): the input only if the weight needs
/// grad, the weight only if the input needs grad; the bias needs nothing,
/// so it is added over the product's own buffer (`Tensor::add_owned`): the
/// layer makes one `[…, out]` buffer, not two.
#[derive(Clone)]
pub struct Linear {
    /// `[out_features, in_features]`.
    pub weight: Tensor,
    /// `[out_features]`, if any.
    pub bias: Option<Tensor>,
    name: String,
}

/// Builds a [`Linear`]: [`Linear::builder`], then the settings that differ
/// from the defaults, then [`build`](LinearBuilder::build).
#[derive(Clone, Debug)]
pub struct LinearBuilder {
    in_features: usize,
    out_features: usize,
    bias: bool,
    dtype: DType,
    seed: u64,
    name: String,
    weight_init: Option<Init>,
    bias_init: Option<Init>,
}

impl Linear {
    /// A builder of a layer from `in_features` to `out_features` with
    /// PyTorch's defaults (a bias) and f32 parameters, seed 0, named
    /// `linear`.
    pub fn builder(in_features: usize, out_features: usize) -> LinearBuilder {
        LinearBuilder {
            in_features,
            out_features,
            bias: true,
            dtype: DType::F32,
            seed: 0,
            name: "linear".into(),
            weight_init: None,
            bias_init: None,
        }
    }

    /// The layer's name in scopes and reports.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl LinearBuilder {
    /// The layer's name in scopes and reports (default: `linear`).
    pub fn name(mut self, name: &str) -> Self {
        self.name = name.to_string();
        self
    }

    /// Whether the layer has a bias (default: true, as PyTorch).
    pub fn bias(mut self, bias: bool) -> Self {
        self.bias = bias;
        self
    }

    /// The parameters' dtype (default: f32).
    pub fn dtype(mut self, dtype: DType) -> Self {
        self.dtype = dtype;
        self
    }

    /// The seed of the Philox stream the weight is drawn from (default: 0;
    /// the bias uses `seed ^ 0x5eed`).
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// How the weight is drawn (default: PyTorch's, uniform in
    /// ±1/√in_features), e.g. `Init::normal(0.01)` as torchvision's VGG.
    pub fn weight_init(mut self, init: Init) -> Self {
        self.weight_init = Some(init);
        self
    }

    /// How the bias is drawn (default: PyTorch's, uniform in
    /// ±1/√in_features), e.g. `Init::zeros()`.
    pub fn bias_init(mut self, init: Init) -> Self {
        self.bias_init = Some(init);
        self
    }

    /// The layer on `device`, initialised as the inits say (by default
    /// like PyTorch: uniform in ±1/√in_features) from the seeded Philox
    /// stream; the tensors are counted as parameters.
    pub fn build(&self, device: &Device) -> Result<Linear> {
        let (ctx, seed) = ((self.dtype, *device), self.seed);
        let (in_features, out_features) = (self.in_features, self.out_features);
        // No inputs: bound 0, as PyTorch's (which skips the empty weight).
        let bound = match in_features {
            0 => 0.0,
            n => 1.0 / (n as f64).sqrt(),
        };
        let default = Init::Uniform {
            low: -bound,
            high: bound,
        };
        let shape = [out_features, in_features];
        let weight = (self.weight_init.unwrap_or(default))
            .tensor_for("Linear", &shape, None, ctx, seed)?
            .into_parameter()?;
        let bias = if self.bias {
            Some(
                (self.bias_init.unwrap_or(default))
                    .tensor_for("Linear", &[out_features], None, ctx, seed ^ 0x5eed)?
                    .into_parameter()?,
            )
        } else {
            None
        };
        Ok(Linear {
            weight,
            bias,
            name: self.name.clone(),
        })
    }
}

impl Module for Linear {
    /// Applies the layer to `x` of shape `[…, in_features]`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let _s = scope(self.name.clone());
        check_min_rank(x, 1, "[.., features]")?;
        check_size(
            x,
            x.rank() - 1,
            self.weight.shape()[1],
            "input features (last dim)",
        )?;
        // Under autocast the product and the bias run in its dtype.
        let (x, w, b) = lower3(x, &self.weight, self.bias.as_ref())?;
        check_dtype(&x, w.dtype())?;
        let y = x.matmul(&w.t()?)?;
        match &b {
            Some(b) => y.add_owned(b),
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
