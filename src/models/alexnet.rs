//! AlexNet as in torchvision (`alexnet`, the one-GPU variant of "One weird
//! trick…"), with torchvision's `features.N` / `classifier.N` names, plus
//! small configurations for tests.
//!
//! It is built from the existing layers only (convolutions with bias,
//! in-place ReLUs, 3×3 max pools of stride 2, an adaptive average pool,
//! dropout, Linear layers), so it saves for backward exactly what those
//! layers save (see their tables in `docs/ARCHITECTURE.md`).

use super::surgery::{head_like, HeadInit};
use super::vgg::{Chain, Layer};
use super::{ran_to_the_end, FeatureMaps, ReplaceHead};
use crate::nn::{
    AdaptiveAvgPool2d, BatchStatsSync, Conv2d, Dropout, LayerKind, Linear, MaxPool2d,
    MaxPool2dOptions, Module,
};
use crate::{DType, Device, Error, Result, Tensor};
use std::sync::Arc;

/// The shape of an [`AlexNet`]; torchvision's is [`AlexNetConfig::alexnet`].
#[derive(Clone, Debug, PartialEq)]
pub struct AlexNetConfig {
    /// Channels of the input image.
    pub in_channels: usize,
    /// Output channels of the five convolutions `features.0, 3, 6, 8, 10`
    /// (torchvision: 64, 192, 384, 256, 256).
    pub widths: [usize; 5],
    /// Output size of `avgpool` (torchvision: 6).
    pub pool_size: usize,
    /// Width of the two hidden classifier layers (torchvision: 4096).
    pub hidden: usize,
    /// Outputs of `classifier.6`.
    pub num_classes: usize,
    /// Drop probability of `classifier.0` and `classifier.3`
    /// (torchvision: 0.5).
    pub dropout: f64,
}

impl AlexNetConfig {
    /// torchvision's AlexNet (`alexnet`; 61,100,840 parameters with 1000
    /// classes).
    pub fn alexnet(num_classes: usize) -> Self {
        AlexNetConfig {
            in_channels: 3,
            widths: [64, 192, 384, 256, 256],
            pool_size: 6,
            hidden: 4096,
            num_classes,
            dropout: 0.5,
        }
    }
}

/// The five convolutions: (kernel, stride, padding, max pool after it).
const CONVS: [(usize, usize, usize, bool); 5] = [
    (11, 4, 2, true),
    (5, 1, 2, true),
    (3, 1, 1, false),
    (3, 1, 1, false),
    (3, 1, 1, true),
];

/// torchvision's AlexNet: `features` (convolutions 11×11/4, 5×5, 3×3 ×3,
/// each with bias and an in-place ReLU, 3×3/2 max pools after the first,
/// second and fifth), `avgpool` (adaptive, 6×6), flatten, `classifier`
/// (Dropout, Linear, ReLU, Dropout, Linear, ReLU, Linear). Images need at
/// least 63×63 pixels. Starts in training mode.
pub struct AlexNet {
    chain: Chain,
}

impl AlexNet {
    /// An AlexNet of `config` initialised as torchvision's (which keeps
    /// PyTorch's defaults: every convolution's and Linear's weight and bias
    /// uniform in ±1/√fan_in; seeded), ready for
    /// [`crate::io::load_state_dict`]. A size of 0 or a drop probability
    /// outside [0, 1] is [`Error::InvalidArgument`].
    pub fn new(config: &AlexNetConfig, dtype: DType, device: Device, seed: u64) -> Result<AlexNet> {
        let c = config;
        if c.in_channels == 0
            || c.widths.contains(&0)
            || c.pool_size == 0
            || c.hidden == 0
            || c.num_classes == 0
        {
            return Err(Error::InvalidArgument {
                op: "AlexNet",
                msg: format!("every size must be positive: {c:?}"),
            });
        }
        let mut layers = Vec::new();
        let mut cin = c.in_channels;
        for (&w, &(k, stride, padding, pool)) in c.widths.iter().zip(&CONVS) {
            let name = format!("features.{}", layers.len());
            let conv = Conv2d::builder(cin, w, k)
                .name(&name)
                .stride(stride)
                .padding(padding)
                .dtype(dtype)
                .seed(seed.wrapping_add(layers.len() as u64))
                .build(&device)?;
            layers.push((name, Layer::Conv(conv)));
            let relu = format!("features.{}", layers.len());
            layers.push((relu.clone(), Layer::Relu(relu)));
            if pool {
                let name = format!("features.{}", layers.len());
                let mut options = MaxPool2dOptions::new([3, 3]);
                options.stride = Some([2, 2]);
                layers.push((name.clone(), Layer::Pool(MaxPool2d::new(&name, options))));
            }
            cin = w;
        }
        let features = layers.len();
        let flat = c
            .pool_size
            .checked_mul(c.pool_size)
            .and_then(|p| p.checked_mul(cin))
            .ok_or_else(|| Error::InvalidArgument {
                op: "AlexNet",
                msg: format!("the classifier's input overflows: {c:?}"),
            })?;
        let sizes = [flat, c.hidden, c.hidden, c.num_classes];
        // `classifier.N`: N counts the classifier's layers.
        let next =
            |layers: &Vec<(String, Layer)>| format!("classifier.{}", layers.len() - features);
        for i in 0..3 {
            if i < 2 {
                let name = next(&layers);
                let drop = Dropout::new(&name, c.dropout, seed.wrapping_add(900 + i as u64))?;
                layers.push((name, Layer::Dropout(drop)));
            }
            let name = next(&layers);
            let fc = Linear::builder(sizes[i], sizes[i + 1])
                .name(&name)
                .dtype(dtype)
                .seed(seed.wrapping_add(500 + i as u64))
                .build(&device)?;
            layers.push((name, Layer::Linear(fc)));
            if i < 2 {
                let relu = next(&layers);
                layers.push((relu.clone(), Layer::Relu(relu)));
            }
        }
        Ok(AlexNet {
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

impl FeatureMaps for AlexNet {
    fn model_name(&self) -> &'static str {
        "AlexNet"
    }

    /// `features.0` … `features.12` (every convolution, ReLU and pool, by
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

impl ReplaceHead for AlexNet {
    fn head_name(&self) -> &str {
        self.chain
            .head()
            .map_or("classifier.6", |(n, _)| n.as_str())
    }

    fn num_classes(&self) -> usize {
        self.chain.head().map_or(0, |(_, l)| l.weight.shape()[0])
    }

    /// A fresh `classifier.6`, initialised as torchvision's AlexNet leaves
    /// it (PyTorch's default: uniform in ±1/√in).
    fn replace_head(&mut self, num_classes: usize, seed: u64) -> Result<()> {
        if let Some(head) = self.chain.head_mut() {
            *head = head_like(head, num_classes, HeadInit::Default, seed)?;
        }
        Ok(())
    }
}

impl Module for AlexNet {
    /// Class scores `[n, num_classes]` of images `[n, in_channels, h, w]`
    /// (h, w ≥ 63).
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        ran_to_the_end(self.walk(x, &mut |_, _| false)?, "AlexNet")
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

    /// AlexNet has no batch norm: sets none, as the default; kept for
    /// symmetry with [`super::Vgg`].
    fn sync_batch_norm(&mut self, sync: Option<&Arc<dyn BatchStatsSync>>) -> usize {
        self.chain.sync_batch_norm(sync)
    }
}
