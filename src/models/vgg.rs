//! VGG as in torchvision (`vgg11` … `vgg19`, with or without BatchNorm),
//! with torchvision's `features.N` / `classifier.N` names, plus small
//! configurations for tests.

use super::surgery::{head_like, HeadInit};
use super::{
    buffers_of, kinds_of, params_of, ran_to_the_end, set_bn, set_conv, set_linear, stop_if,
    FeatureMaps, ReplaceHead,
};
use crate::memory::scope;
use crate::nn::{
    AdaptiveAvgPool2d, BatchNorm, BatchStatsSync, Conv2d, Dropout, FanMode, Init, LayerKind,
    Linear, MaxPool2d, MaxPool2dOptions, Module, ReLU,
};
use crate::{DType, Device, Error, Result, Tensor};
use std::sync::Arc;

/// torchvision's VGG-16 feature plan ("D"): output channels of each 3×3
/// convolution, `0` for a 2×2 max pool.
pub const VGG16_PLAN: [usize; 18] = [
    64, 64, 0, 128, 128, 0, 256, 256, 256, 0, 512, 512, 512, 0, 512, 512, 512, 0,
];

/// torchvision's VGG-19 feature plan ("E"): four 3×3 convolutions in each
/// of the last three stages.
pub const VGG19_PLAN: [usize; 21] = [
    64, 64, 0, 128, 128, 0, 256, 256, 256, 256, 0, 512, 512, 512, 512, 0, 512, 512, 512, 512, 0,
];

/// The shape of a [`Vgg`]; torchvision's VGG-16 is [`VggConfig::vgg16`],
/// VGG-19 [`VggConfig::vgg19`].
#[derive(Clone, Debug, PartialEq)]
pub struct VggConfig {
    /// Convolution widths in order, `0` for a max pool (e.g. [`VGG16_PLAN`]).
    pub plan: Vec<usize>,
    /// A BatchNorm after every convolution (`vgg16_bn`).
    pub batch_norm: bool,
    /// Channels of the input image.
    pub in_channels: usize,
    /// Output size of `avgpool` (torchvision: 7).
    pub pool_size: usize,
    /// Width of the two hidden classifier layers (torchvision: 4096).
    pub hidden: usize,
    /// Outputs of `classifier.6`.
    pub num_classes: usize,
    /// Drop probability of `classifier.2` and `classifier.5` (torchvision: 0.5).
    pub dropout: f64,
}

impl VggConfig {
    /// torchvision's VGG-16 (`vgg16`, or `vgg16_bn` with `batch_norm`).
    pub fn vgg16(batch_norm: bool, num_classes: usize) -> Self {
        VggConfig {
            plan: VGG16_PLAN.to_vec(),
            batch_norm,
            in_channels: 3,
            pool_size: 7,
            hidden: 4096,
            num_classes,
            dropout: 0.5,
        }
    }

    /// torchvision's VGG-19 (`vgg19`, or `vgg19_bn` with `batch_norm`):
    /// its ReLUs are `features.1, 3` (relu1_1, relu1_2), `6, 8`, `11, 13,
    /// 15, 17`, `20, 22, 24, 26`, `29, 31, 33, 35` without BatchNorm.
    pub fn vgg19(batch_norm: bool, num_classes: usize) -> Self {
        VggConfig {
            plan: VGG19_PLAN.to_vec(),
            ..VggConfig::vgg16(batch_norm, num_classes)
        }
    }
}

/// One layer of a plain chain of layers (VGG's and AlexNet's `features`
/// and `classifier`).
pub(super) enum Layer {
    Conv(Conv2d),
    Bn(BatchNorm),
    Relu(String),
    Pool(MaxPool2d),
    Linear(Linear),
    Dropout(Dropout),
}

impl Layer {
    pub(super) fn forward(&self, x: Tensor) -> Result<Tensor> {
        match self {
            Layer::Conv(m) => m.forward(&x),
            Layer::Bn(m) => m.forward_owned(x),
            Layer::Relu(name) => {
                let _s = scope(name.clone());
                ReLU { inplace: true }.apply(x)
            }
            Layer::Pool(m) => m.forward(&x),
            Layer::Linear(m) => m.forward(&x),
            Layer::Dropout(m) => m.forward_owned(x),
        }
    }

    fn module(&self) -> Option<&dyn Module> {
        match self {
            Layer::Conv(m) => Some(m),
            Layer::Bn(m) => Some(m),
            Layer::Linear(m) => Some(m),
            _ => None,
        }
    }
}

/// A chain of named layers with an adaptive average pool and a flatten
/// between the first `features` of them and the rest: what VGG and
/// AlexNet are. Each model keeps one and hands its [`Module`],
/// [`FeatureMaps`] and freezing work to it.
pub(super) struct Chain {
    pub(super) layers: Vec<(String, Layer)>,
    pub(super) avgpool: AdaptiveAvgPool2d,
    pub(super) features: usize,
}

impl Chain {
    /// See [`Vgg::set_requires_grad`].
    pub(super) fn set_requires_grad(&mut self, want: &mut dyn FnMut(&str) -> bool) -> Result<()> {
        for (name, layer) in &mut self.layers {
            match layer {
                Layer::Conv(m) => set_conv(m, name, want)?,
                Layer::Bn(m) => set_bn(m, name, want)?,
                Layer::Linear(m) => set_linear(m, name, want)?,
                _ => {}
            }
        }
        Ok(())
    }

    /// The layer names in order, `avgpool` and `flatten` where they run.
    pub(super) fn feature_names(&self) -> Vec<String> {
        let mut names: Vec<String> = Vec::new();
        for (i, (name, _)) in self.layers.iter().enumerate() {
            if i == self.features {
                names.extend(["avgpool", "flatten"].map(String::from));
            }
            names.push(name.clone());
        }
        names
    }

    /// [`FeatureMaps::walk`] over the chain.
    pub(super) fn walk(
        &self,
        x: &Tensor,
        visit: &mut dyn FnMut(&str, &Tensor) -> bool,
    ) -> Result<Option<Tensor>> {
        let mut h = x.clone();
        for (i, (name, layer)) in self.layers.iter().enumerate() {
            if i == self.features {
                h = self.avgpool.forward(&h)?;
                stop_if!(visit("avgpool", &h));
                h = h.flatten(1, -1)?;
                stop_if!(visit("flatten", &h));
            }
            h = layer.forward(h)?;
            stop_if!(visit(name, &h));
        }
        Ok(Some(h))
    }

    /// The last Linear layer, mutable.
    pub(super) fn head_mut(&mut self) -> Option<&mut Linear> {
        self.layers.iter_mut().rev().find_map(|(_, l)| match l {
            Layer::Linear(m) => Some(m),
            _ => None,
        })
    }

    /// The last Linear layer and its name.
    pub(super) fn head(&self) -> Option<(&String, &Linear)> {
        self.layers.iter().rev().find_map(|(n, l)| match l {
            Layer::Linear(m) => Some((n, m)),
            _ => None,
        })
    }

    /// [`Module::named_parameters`] of every layer.
    pub(super) fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let layers = self.layers.iter();
        layers
            .filter_map(|(n, l)| l.module().map(|m| params_of(n, m)))
            .flatten()
            .collect()
    }

    /// [`Module::parameter_kinds`] of every layer.
    pub(super) fn parameter_kinds(&self) -> Vec<(String, LayerKind)> {
        let layers = self.layers.iter();
        layers
            .filter_map(|(n, l)| l.module().map(|m| kinds_of(n, m)))
            .flatten()
            .collect()
    }

    /// [`Module::named_buffers`] of every layer.
    pub(super) fn named_buffers(&self) -> Vec<(String, Tensor)> {
        let layers = self.layers.iter();
        layers
            .filter_map(|(n, l)| l.module().map(|m| buffers_of(n, m)))
            .flatten()
            .collect()
    }

    /// Training or evaluation mode for every BatchNorm and Dropout.
    pub(super) fn set_training(&mut self, training: bool) {
        for (_, layer) in &mut self.layers {
            match layer {
                Layer::Bn(m) => m.set_training(training),
                Layer::Dropout(m) => m.set_training(training),
                _ => {}
            }
        }
    }

    /// [`Module::sync_batch_norm`] for every BatchNorm.
    pub(super) fn sync_batch_norm(&mut self, sync: Option<&Arc<dyn BatchStatsSync>>) -> usize {
        let mut n = 0;
        for (_, layer) in &mut self.layers {
            if let Layer::Bn(m) = layer {
                n += m.sync_batch_norm(sync);
            }
        }
        n
    }
}

/// torchvision's VGG: `features` (3×3 convolutions with bias, optional
/// BatchNorm, ReLU, 2×2 max pools), `avgpool` (adaptive), flatten,
/// `classifier` (Linear, ReLU, Dropout, Linear, ReLU, Dropout, Linear).
/// Starts in training mode.
pub struct Vgg {
    chain: Chain,
}

impl Vgg {
    /// A VGG of `config` initialised as torchvision's (seeded): every
    /// convolution `kaiming_normal_(mode="fan_out", nonlinearity="relu")`
    /// with bias 0, every BatchNorm weight 1 and bias 0, every Linear
    /// weight N(0, 0.01²) and bias 0; ready for
    /// [`crate::io::load_state_dict`].
    pub fn new(config: &VggConfig, dtype: DType, device: Device, seed: u64) -> Result<Vgg> {
        let c = config;
        if c.in_channels == 0 || c.pool_size == 0 || c.hidden == 0 || c.num_classes == 0 {
            return Err(Error::InvalidArgument {
                op: "Vgg",
                msg: format!("every size must be positive: {c:?}"),
            });
        }
        let mut layers = Vec::new();
        let mut cin = c.in_channels;
        for &w in &c.plan {
            let name = format!("features.{}", layers.len());
            if w == 0 {
                layers.push((
                    name.clone(),
                    Layer::Pool(MaxPool2d::new(&name, MaxPool2dOptions::new([2, 2]))),
                ));
                continue;
            }
            let s = seed.wrapping_add(layers.len() as u64);
            let conv = Conv2d::builder(cin, w, 3)
                .name(&name)
                .padding(1)
                .weight_init(Init::kaiming_normal_relu(FanMode::FanOut))
                .bias_init(Init::zeros())
                .dtype(dtype)
                .seed(s)
                .build(&device)?;
            layers.push((name, Layer::Conv(conv)));
            if c.batch_norm {
                let name = format!("features.{}", layers.len());
                let bn = BatchNorm::builder(w)
                    .name(&name)
                    .dtype(dtype)
                    .build2d(&device)?;
                layers.push((name, Layer::Bn(bn)));
            }
            layers.push((
                format!("features.{}", layers.len()),
                Layer::Relu(format!("features.{}", layers.len())),
            ));
            cin = w;
        }
        let features = layers.len();
        let sizes = [
            cin * c.pool_size * c.pool_size,
            c.hidden,
            c.hidden,
            c.num_classes,
        ];
        for i in 0..3 {
            let name = format!("classifier.{}", 3 * i);
            let s = seed.wrapping_add(500 + i as u64);
            let fc = Linear::builder(sizes[i], sizes[i + 1])
                .name(&name)
                .weight_init(Init::normal(0.01))
                .bias_init(Init::zeros())
                .dtype(dtype)
                .seed(s)
                .build(&device)?;
            layers.push((name, Layer::Linear(fc)));
            if i < 2 {
                let (r, d) = (
                    format!("classifier.{}", 3 * i + 1),
                    format!("classifier.{}", 3 * i + 2),
                );
                layers.push((r.clone(), Layer::Relu(r)));
                let drop = Dropout::new(&d, c.dropout, seed.wrapping_add(900 + i as u64))?;
                layers.push((d, Layer::Dropout(drop)));
            }
        }
        Ok(Vgg {
            chain: Chain {
                layers,
                avgpool: AdaptiveAvgPool2d::new("avgpool", [c.pool_size; 2]),
                features,
            },
        })
    }

    /// Makes each parameter require grad exactly when `want(name)` is true
    /// (names as in [`Module::named_parameters`]); values are kept.
    pub fn set_requires_grad(&mut self, mut want: impl FnMut(&str) -> bool) -> Result<()> {
        self.chain.set_requires_grad(&mut want)
    }
}

impl FeatureMaps for Vgg {
    fn model_name(&self) -> &'static str {
        "Vgg"
    }

    /// `features.0` … (every convolution, BatchNorm, ReLU and pool, by
    /// torchvision's index), `avgpool`, `flatten`, `classifier.0` …
    /// `classifier.6`.
    fn feature_names(&self) -> Vec<String> {
        self.chain.feature_names()
    }

    fn walk(
        &self,
        x: &Tensor,
        visit: &mut dyn FnMut(&str, &Tensor) -> bool,
    ) -> Result<Option<Tensor>> {
        self.chain.walk(x, visit)
    }
}

impl ReplaceHead for Vgg {
    fn head_name(&self) -> &str {
        self.chain
            .head()
            .map_or("classifier.6", |(n, _)| n.as_str())
    }

    fn num_classes(&self) -> usize {
        self.chain.head().map_or(0, |(_, l)| l.weight.shape()[0])
    }

    /// A fresh `classifier.6`, initialised as torchvision's VGG initialises
    /// its Linear layers (weight normal with std 0.01, bias zero).
    fn replace_head(&mut self, num_classes: usize, seed: u64) -> Result<()> {
        if let Some(head) = self.chain.head_mut() {
            *head = head_like(head, num_classes, HeadInit::Normal(0.01), seed)?;
        }
        Ok(())
    }
}

impl Module for Vgg {
    /// Class scores `[n, num_classes]` of images `[n, in_channels, h, w]`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        ran_to_the_end(self.walk(x, &mut |_, _| false)?, "Vgg")
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        self.chain.named_parameters()
    }

    fn parameter_kinds(&self) -> Vec<(String, LayerKind)> {
        self.chain.parameter_kinds()
    }

    fn named_buffers(&self) -> Vec<(String, Tensor)> {
        self.chain.named_buffers()
    }

    fn set_training(&mut self, training: bool) {
        self.chain.set_training(training)
    }

    fn sync_batch_norm(&mut self, sync: Option<&Arc<dyn BatchStatsSync>>) -> usize {
        self.chain.sync_batch_norm(sync)
    }
}
