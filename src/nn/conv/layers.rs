//! The convolution modules `Conv1d`, `Conv2d` and `ConvTranspose2d`: PyTorch-
//! layout parameters, built by a builder
//! (`Conv2d::builder(in, out, kernel).stride(2).padding(1).build(&device)`),
//! applied through the fused ops of this family.

use super::{
    conv1d, conv2d, conv_transpose2d, Conv1dOptions, Conv2dOptions, ConvTranspose2dOptions,
};
use crate::memory::scope;
use crate::nn::init::Init;
use crate::nn::input::{check_dtype, check_rank, check_size};
use crate::nn::Module;
use crate::ops::autocast::lower3;
use crate::{DType, Device, Error, Result, Tensor};

/// A 2-d size: one value for both axes (`3`) or `[height, width]`
/// (`[3, 1]`), as PyTorch's `int or tuple` arguments.
pub trait Size2 {
    /// The size as `[height, width]`.
    fn size2(self) -> [usize; 2];
}

impl Size2 for usize {
    fn size2(self) -> [usize; 2] {
        [self, self]
    }
}

impl Size2 for [usize; 2] {
    fn size2(self) -> [usize; 2] {
        self
    }
}

impl Size2 for (usize, usize) {
    fn size2(self) -> [usize; 2] {
        [self.0, self.1]
    }
}

/// What every convolution builder holds besides its geometry: the name,
/// whether there is a bias, and how the parameters are initialised.
#[derive(Clone, Debug)]
struct Common {
    name: String,
    bias: bool,
    dtype: DType,
    seed: u64,
    weight_init: Option<Init>,
    bias_init: Option<Init>,
}

impl Common {
    fn new(name: &str) -> Common {
        Common {
            name: name.to_string(),
            bias: true,
            dtype: DType::F32,
            seed: 0,
            weight_init: None,
            bias_init: None,
        }
    }
}

/// The setters every builder shares (name, bias, dtype, seed, inits).
macro_rules! common_setters {
    () => {
        /// The layer's name in scopes and reports (default: the op's name).
        pub fn name(mut self, name: &str) -> Self {
            self.common.name = name.to_string();
            self
        }

        /// Whether the layer has a bias (default: true, as PyTorch).
        pub fn bias(mut self, bias: bool) -> Self {
            self.common.bias = bias;
            self
        }

        /// The parameters' dtype (default: f32).
        pub fn dtype(mut self, dtype: DType) -> Self {
            self.common.dtype = dtype;
            self
        }

        /// The seed of the Philox stream the parameters are drawn from
        /// (default: 0; the bias uses `seed ^ 0x5eed`).
        pub fn seed(mut self, seed: u64) -> Self {
            self.common.seed = seed;
            self
        }

        /// How the weight is drawn (default: PyTorch's, uniform in
        /// ±1/√fan_in), e.g. torchvision's
        /// `Init::kaiming_normal_relu(FanMode::FanOut)`.
        pub fn weight_init(mut self, init: Init) -> Self {
            self.common.weight_init = Some(init);
            self
        }

        /// How the bias is drawn (default: PyTorch's, uniform in
        /// ±1/√fan_in), e.g. `Init::zeros()`.
        pub fn bias_init(mut self, init: Init) -> Self {
            self.common.bias_init = Some(init);
            self
        }
    };
}

/// The geometry setters every builder shares: each sets the option of that
/// name, converting the argument with `$size` (`Size2::size2` for 2-d
/// layers); `options` sets them all at once.
macro_rules! geometry_setters {
    ($arg:ty, $size:expr, $opts:ty, stride: $stride_doc:literal, padding: $padding_doc:literal) => {
        #[doc = $stride_doc]
        pub fn stride(mut self, stride: $arg) -> Self {
            self.options.stride = $size(stride);
            self
        }

        #[doc = $padding_doc]
        pub fn padding(mut self, padding: $arg) -> Self {
            self.options.padding = $size(padding);
            self
        }

        /// Spacing between kernel taps.
        pub fn dilation(mut self, dilation: $arg) -> Self {
            self.options.dilation = $size(dilation);
            self
        }

        /// Channel groups (`groups == in_channels`: depthwise); must divide
        /// both channel counts.
        pub fn groups(mut self, groups: usize) -> Self {
            self.options.groups = groups;
            self
        }

        /// Every option at once.
        pub fn options(mut self, options: $opts) -> Self {
            self.options = options;
            self
        }
    };
}

/// Weight `shape` and optional bias `[bias_len]` as parameters, drawn as
/// the builder's inits say; by default uniform in ±1/√fan_in like
/// PyTorch's (kaiming_uniform with a = √5).
fn init(
    op: &'static str,
    shape: &[usize],
    fan_in: usize,
    bias_len: Option<usize>,
    c: &Common,
    device: Device,
) -> Result<(Tensor, Option<Tensor>)> {
    if fan_in == 0 || shape.contains(&0) {
        return Err(Error::InvalidArgument {
            op,
            msg: format!("weight shape {shape:?} has no elements"),
        });
    }
    let (ctx, seed) = ((c.dtype, device), c.seed);
    let bound = 1.0 / (fan_in as f64).sqrt();
    let default = Init::Uniform {
        low: -bound,
        high: bound,
    };
    let weight = c.weight_init.unwrap_or(default);
    let weight = weight
        .tensor_for(op, shape, None, ctx, seed)?
        .into_parameter()?;
    let bias = match bias_len {
        Some(n) => Some(
            (c.bias_init.unwrap_or(default))
                .tensor_for(op, &[n], None, ctx, seed ^ 0x5eed)?
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
#[derive(Clone)]
pub struct Conv2d {
    /// `[out_channels, in_channels/groups, kh, kw]`.
    pub weight: Tensor,
    /// `[out_channels]`, if any.
    pub bias: Option<Tensor>,
    /// Stride, padding, dilation and groups.
    pub options: Conv2dOptions,
    name: String,
}

/// Builds a [`Conv2d`]: [`Conv2d::builder`], then the options that differ
/// from PyTorch's defaults, then [`build`](Conv2dBuilder::build).
#[derive(Clone, Debug)]
pub struct Conv2dBuilder {
    in_channels: usize,
    out_channels: usize,
    kernel: [usize; 2],
    options: Conv2dOptions,
    common: Common,
}

impl Conv2d {
    /// A builder of a layer from `in_channels` to `out_channels` with a
    /// `kernel` (`3` or `[3, 1]`) and PyTorch's defaults: stride 1, no
    /// padding, dilation 1, one group, a bias; f32, seed 0, named `conv2d`.
    pub fn builder(in_channels: usize, out_channels: usize, kernel: impl Size2) -> Conv2dBuilder {
        Conv2dBuilder {
            in_channels,
            out_channels,
            kernel: kernel.size2(),
            options: Conv2dOptions::default(),
            common: Common::new("conv2d"),
        }
    }

    /// The layer's name in scopes and reports.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Conv2dBuilder {
    common_setters!();
    geometry_setters!(
        impl Size2,
        Size2::size2,
        Conv2dOptions,
        stride: "Step between output positions (`2` or `[2, 1]`).",
        padding: "Zeros added on both sides of the input, per axis."
    );

    /// The layer on `device`, initialised like PyTorch's default (uniform
    /// in ±1/√fan_in, fan_in = in/groups·kh·kw) from the seeded Philox
    /// stream.
    pub fn build(&self, device: &Device) -> Result<Conv2d> {
        let (options, k) = (self.options, self.kernel);
        check_divides(
            "Conv2d",
            options.groups,
            [self.in_channels, self.out_channels],
        )?;
        let cig = self.in_channels / options.groups;
        let shape = [self.out_channels, cig, k[0], k[1]];
        let bias_len = self.common.bias.then_some(self.out_channels);
        let fan_in = cig * k[0] * k[1];
        let (weight, bias) = init("Conv2d", &shape, fan_in, bias_len, &self.common, *device)?;
        Ok(Conv2d {
            weight,
            bias,
            options,
            name: self.common.name.clone(),
        })
    }
}

impl Module for Conv2d {
    /// Applies the layer to `x` `[n, in, h, w]`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let _s = scope(self.name.clone());
        let channels = self.weight.shape()[1] * self.options.groups;
        let (x, w, b) = lower3(x, &self.weight, self.bias.as_ref())?;
        check_input(&x, &w, 4, "[N, C, H, W]", channels)?;
        conv2d(&x, &w, b.as_ref(), &self.options)
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
#[derive(Clone)]
pub struct Conv1d {
    /// `[out_channels, in_channels/groups, k]`.
    pub weight: Tensor,
    /// `[out_channels]`, if any.
    pub bias: Option<Tensor>,
    /// Stride, padding, dilation and groups.
    pub options: Conv1dOptions,
    name: String,
}

/// Builds a [`Conv1d`]: [`Conv1d::builder`], then the options that differ
/// from PyTorch's defaults, then [`build`](Conv1dBuilder::build).
#[derive(Clone, Debug)]
pub struct Conv1dBuilder {
    in_channels: usize,
    out_channels: usize,
    kernel: usize,
    options: Conv1dOptions,
    common: Common,
}

impl Conv1d {
    /// A builder of a layer from `in_channels` to `out_channels` with a
    /// `kernel` of that many taps and PyTorch's defaults: stride 1, no
    /// padding, dilation 1, one group, a bias; f32, seed 0, named `conv1d`.
    pub fn builder(in_channels: usize, out_channels: usize, kernel: usize) -> Conv1dBuilder {
        Conv1dBuilder {
            in_channels,
            out_channels,
            kernel,
            options: Conv1dOptions::default(),
            common: Common::new("conv1d"),
        }
    }

    /// The layer's name in scopes and reports.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Conv1dBuilder {
    common_setters!();
    geometry_setters!(
        usize,
        std::convert::identity,
        Conv1dOptions,
        stride: "Step between output positions.",
        padding: "Zeros added on both sides of the input."
    );

    /// The layer on `device`, initialised like PyTorch's default (uniform
    /// in ±1/√fan_in, fan_in = in/groups·k) from the seeded Philox stream.
    pub fn build(&self, device: &Device) -> Result<Conv1d> {
        let options = self.options;
        check_divides(
            "Conv1d",
            options.groups,
            [self.in_channels, self.out_channels],
        )?;
        let cig = self.in_channels / options.groups;
        let shape = [self.out_channels, cig, self.kernel];
        let bias_len = self.common.bias.then_some(self.out_channels);
        let fan_in = cig * self.kernel;
        let (weight, bias) = init("Conv1d", &shape, fan_in, bias_len, &self.common, *device)?;
        Ok(Conv1d {
            weight,
            bias,
            options,
            name: self.common.name.clone(),
        })
    }
}

impl Module for Conv1d {
    /// Applies the layer to `x` `[n, in, l]`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let _s = scope(self.name.clone());
        let channels = self.weight.shape()[1] * self.options.groups;
        let (x, w, b) = lower3(x, &self.weight, self.bias.as_ref())?;
        check_input(&x, &w, 3, "[N, C, L]", channels)?;
        conv1d(&x, &w, b.as_ref(), &self.options)
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
#[derive(Clone)]
pub struct ConvTranspose2d {
    /// `[in_channels, out_channels/groups, kh, kw]`.
    pub weight: Tensor,
    /// `[out_channels]`, if any.
    pub bias: Option<Tensor>,
    /// Stride, padding, output padding, dilation and groups.
    pub options: ConvTranspose2dOptions,
    name: String,
}

/// Builds a [`ConvTranspose2d`]: [`ConvTranspose2d::builder`], then the
/// options that differ from PyTorch's defaults, then
/// [`build`](ConvTranspose2dBuilder::build).
#[derive(Clone, Debug)]
pub struct ConvTranspose2dBuilder {
    in_channels: usize,
    out_channels: usize,
    kernel: [usize; 2],
    options: ConvTranspose2dOptions,
    common: Common,
}

impl ConvTranspose2d {
    /// A builder of a layer from `in_channels` to `out_channels` with a
    /// `kernel` (`3` or `[3, 1]`) and PyTorch's defaults: stride 1, no
    /// padding or output padding, dilation 1, one group, a bias; f32, seed
    /// 0, named `conv_transpose2d`.
    pub fn builder(
        in_channels: usize,
        out_channels: usize,
        kernel: impl Size2,
    ) -> ConvTranspose2dBuilder {
        ConvTranspose2dBuilder {
            in_channels,
            out_channels,
            kernel: kernel.size2(),
            options: ConvTranspose2dOptions::default(),
            common: Common::new("conv_transpose2d"),
        }
    }

    /// The layer's name in scopes and reports.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl ConvTranspose2dBuilder {
    common_setters!();
    geometry_setters!(
        impl Size2,
        Size2::size2,
        ConvTranspose2dOptions,
        stride: "Step between input positions in the output (`2` or `[2, 1]`).",
        padding: "Removed from both sides of the full output, per axis."
    );

    /// Added to one side of the output (must be below the stride or the
    /// dilation).
    pub fn output_padding(mut self, output_padding: impl Size2) -> Self {
        self.options.output_padding = output_padding.size2();
        self
    }

    /// The layer on `device`, initialised like PyTorch's default (uniform
    /// in ±1/√fan_in, where PyTorch's fan_in is `out/groups·kh·kw` for this
    /// weight layout) from the seeded Philox stream.
    pub fn build(&self, device: &Device) -> Result<ConvTranspose2d> {
        const OP: &str = "ConvTranspose2d";
        let (options, k) = (self.options, self.kernel);
        check_divides(OP, options.groups, [self.in_channels, self.out_channels])?;
        let cog = self.out_channels / options.groups;
        let shape = [self.in_channels, cog, k[0], k[1]];
        let bias_len = self.common.bias.then_some(self.out_channels);
        let fan_in = cog * k[0] * k[1];
        let (weight, bias) = init(OP, &shape, fan_in, bias_len, &self.common, *device)?;
        Ok(ConvTranspose2d {
            weight,
            bias,
            options,
            name: self.common.name.clone(),
        })
    }
}

impl Module for ConvTranspose2d {
    /// Applies the layer to `x` `[n, in, h, w]`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let _s = scope(self.name.clone());
        let (x, w, b) = lower3(x, &self.weight, self.bias.as_ref())?;
        check_input(&x, &w, 4, "[N, C, H, W]", self.weight.shape()[0])?;
        conv_transpose2d(&x, &w, b.as_ref(), &self.options)
    }

    fn parameter_kinds(&self) -> Vec<(String, crate::nn::LayerKind)> {
        crate::nn::parameters_of_kind(self, crate::nn::LayerKind::Conv)
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        params(&self.weight, &self.bias)
    }
}

/// What every convolution layer checks of its input, naming itself: the
/// rank, the channel count (dim 1) and the weight's dtype.
fn check_input(
    x: &Tensor,
    weight: &Tensor,
    rank: usize,
    layout: &str,
    channels: usize,
) -> Result<()> {
    check_rank(x, &[rank], layout)?;
    check_size(x, 1, channels, "input channels")?;
    check_dtype(x, weight.dtype())
}
