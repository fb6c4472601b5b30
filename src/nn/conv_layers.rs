//! Convolution modules: `Conv1d`, `Conv2d` and `ConvTranspose2d`, holding
//! PyTorch-layout parameters and calling the fused ops of `nn::conv`.

use super::conv::{
    conv1d, conv2d, conv_transpose2d, Conv1dOptions, Conv2dOptions, ConvTranspose2dOptions,
};
use super::Module;
use crate::memory::scope;
use crate::{DType, Device, Error, Result, Tensor};

/// Weight `shape` and optional bias `[bias_len]`, uniform in ±1/√fan_in like
/// PyTorch's default (kaiming_uniform with a = √5), as parameters.
fn init(
    op: &'static str,
    shape: &[usize],
    fan_in: usize,
    bias_len: Option<usize>,
    (dtype, device, seed): (DType, Device, u64),
) -> Result<(Tensor, Option<Tensor>)> {
    if fan_in == 0 || shape.contains(&0) {
        return Err(Error::InvalidArgument {
            op,
            msg: format!("weight shape {shape:?} has no elements"),
        });
    }
    let bound = 1.0 / (fan_in as f64).sqrt();
    let weight = Tensor::rand_range(shape, -bound, bound, dtype, device, seed)?.into_parameter()?;
    let bias = match bias_len {
        Some(n) => Some(
            Tensor::rand_range(&[n], -bound, bound, dtype, device, seed ^ 0x5eed)?
                .into_parameter()?,
        ),
        None => None,
    };
    Ok((weight, bias))
}

fn check_divides(op: &'static str, groups: usize, chans: [usize; 2]) -> Result<()> {
    if groups == 0 || chans.iter().any(|c| c % groups != 0) {
        return Err(Error::InvalidArgument {
            op,
            msg: format!("groups ({groups}) must divide the channel counts {chans:?}"),
        });
    }
    Ok(())
}

fn params(weight: &Tensor, bias: &Option<Tensor>) -> Vec<(String, Tensor)> {
    let mut p = vec![("weight".to_string(), weight.clone())];
    p.extend(bias.clone().map(|b| ("bias".to_string(), b)));
    p
}

/// `torch.nn.Conv2d`: weight `[out, in/groups, kh, kw]`, bias `[out]`.
///
/// Saved for backward: the input only if the weight needs grad, the weight
/// only if the input needs grad; nothing for the bias.
pub struct Conv2d {
    /// `[out_channels, in_channels/groups, kh, kw]`.
    pub weight: Tensor,
    /// `[out_channels]`, if any.
    pub bias: Option<Tensor>,
    /// Stride, padding, dilation and groups.
    pub options: Conv2dOptions,
    name: String,
}

impl Conv2d {
    /// A layer initialised like PyTorch's default (uniform in ±1/√fan_in,
    /// fan_in = in/groups·kh·kw) from a seeded Philox stream.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        name: &str,
        in_channels: usize,
        out_channels: usize,
        kernel_size: [usize; 2],
        options: Conv2dOptions,
        bias: bool,
        dtype: DType,
        device: Device,
        seed: u64,
    ) -> Result<Conv2d> {
        check_divides("Conv2d", options.groups, [in_channels, out_channels])?;
        let cig = in_channels / options.groups;
        let shape = [out_channels, cig, kernel_size[0], kernel_size[1]];
        let fan_in = cig * kernel_size[0] * kernel_size[1];
        let bias_len = bias.then_some(out_channels);
        let (weight, bias) = init("Conv2d", &shape, fan_in, bias_len, (dtype, device, seed))?;
        Ok(Conv2d {
            weight,
            bias,
            options,
            name: name.to_string(),
        })
    }

    /// The layer's name in scopes and reports.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Module for Conv2d {
    /// Applies the layer to `x` `[n, in, h, w]`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let _s = scope(self.name.clone());
        conv2d(x, &self.weight, self.bias.as_ref(), &self.options)
    }

    fn parameter_kinds(&self) -> Vec<(String, crate::nn::LayerKind)> {
        crate::nn::parameters_of_kind(self, crate::nn::LayerKind::Conv)
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        params(&self.weight, &self.bias)
    }
}

/// `torch.nn.Conv1d`: weight `[out, in/groups, k]`, bias `[out]`.
///
/// Saved for backward: the input only if the weight needs grad, the weight
/// only if the input needs grad; nothing for the bias.
pub struct Conv1d {
    /// `[out_channels, in_channels/groups, k]`.
    pub weight: Tensor,
    /// `[out_channels]`, if any.
    pub bias: Option<Tensor>,
    /// Stride, padding, dilation and groups.
    pub options: Conv1dOptions,
    name: String,
}

impl Conv1d {
    /// A layer initialised like PyTorch's default (uniform in ±1/√fan_in,
    /// fan_in = in/groups·k) from a seeded Philox stream.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        name: &str,
        in_channels: usize,
        out_channels: usize,
        kernel_size: usize,
        options: Conv1dOptions,
        bias: bool,
        dtype: DType,
        device: Device,
        seed: u64,
    ) -> Result<Conv1d> {
        check_divides("Conv1d", options.groups, [in_channels, out_channels])?;
        let cig = in_channels / options.groups;
        let shape = [out_channels, cig, kernel_size];
        let bias_len = bias.then_some(out_channels);
        let (weight, bias) = init(
            "Conv1d",
            &shape,
            cig * kernel_size,
            bias_len,
            (dtype, device, seed),
        )?;
        Ok(Conv1d {
            weight,
            bias,
            options,
            name: name.to_string(),
        })
    }

    /// The layer's name in scopes and reports.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Module for Conv1d {
    /// Applies the layer to `x` `[n, in, l]`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let _s = scope(self.name.clone());
        conv1d(x, &self.weight, self.bias.as_ref(), &self.options)
    }

    fn parameter_kinds(&self) -> Vec<(String, crate::nn::LayerKind)> {
        crate::nn::parameters_of_kind(self, crate::nn::LayerKind::Conv)
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        params(&self.weight, &self.bias)
    }
}

/// `torch.nn.ConvTranspose2d`: weight `[in, out/groups, kh, kw]`, bias `[out]`.
///
/// Saved for backward: the input only if the weight needs grad, the weight
/// only if the input needs grad; nothing for the bias.
pub struct ConvTranspose2d {
    /// `[in_channels, out_channels/groups, kh, kw]`.
    pub weight: Tensor,
    /// `[out_channels]`, if any.
    pub bias: Option<Tensor>,
    /// Stride, padding, output padding, dilation and groups.
    pub options: ConvTranspose2dOptions,
    name: String,
}

impl ConvTranspose2d {
    /// A layer initialised like PyTorch's default (uniform in ±1/√fan_in,
    /// where PyTorch's fan_in is `out/groups·kh·kw` for this weight layout)
    /// from a seeded Philox stream.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        name: &str,
        in_channels: usize,
        out_channels: usize,
        kernel_size: [usize; 2],
        options: ConvTranspose2dOptions,
        bias: bool,
        dtype: DType,
        device: Device,
        seed: u64,
    ) -> Result<ConvTranspose2d> {
        check_divides(
            "ConvTranspose2d",
            options.groups,
            [in_channels, out_channels],
        )?;
        let cog = out_channels / options.groups;
        let shape = [in_channels, cog, kernel_size[0], kernel_size[1]];
        let fan_in = cog * kernel_size[0] * kernel_size[1];
        let bias_len = bias.then_some(out_channels);
        let (weight, bias) = init(
            "ConvTranspose2d",
            &shape,
            fan_in,
            bias_len,
            (dtype, device, seed),
        )?;
        Ok(ConvTranspose2d {
            weight,
            bias,
            options,
            name: name.to_string(),
        })
    }

    /// The layer's name in scopes and reports.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Module for ConvTranspose2d {
    /// Applies the layer to `x` `[n, in, h, w]`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let _s = scope(self.name.clone());
        conv_transpose2d(x, &self.weight, self.bias.as_ref(), &self.options)
    }

    fn parameter_kinds(&self) -> Vec<(String, crate::nn::LayerKind)> {
        crate::nn::parameters_of_kind(self, crate::nn::LayerKind::Conv)
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        params(&self.weight, &self.bias)
    }
}
