//! Model surgery as PyTorch users do it: a new classifier head of another
//! class count ([`ReplaceHead`]) and intermediate feature maps by layer
//! name ([`FeatureMaps`]), for fine-tuning frozen backbones, adversarial
//! attacks and style transfer.
//!
//! ```
//! use leangrad::models::{FeatureMaps, ReplaceHead, Vgg, VggConfig};
//! use leangrad::{DType, Device, Tensor};
//!
//! // A small VGG: conv, relu, conv, relu, pool, conv, relu, conv, relu, pool.
//! let plan = vec![4, 4, 0, 8, 8, 0];
//! let tiny = VggConfig { plan, pool_size: 1, hidden: 16, ..VggConfig::vgg16(false, 1000) };
//! let mut vgg = Vgg::new(&tiny, DType::F32, Device::Cpu, 0)?;
//! vgg.replace_head(10, 7)?; // classifier.6 is now 16 → 10, trainable
//! let x = Tensor::randn(&[1, 3, 32, 32], DType::F32, Device::Cpu, 1)?;
//! // Runs features.0 … features.8 only.
//! let maps = vgg.features(&x, &["features.3", "features.8"])?;
//! assert_eq!(maps[1].0, "features.8");
//! assert_eq!(maps[1].1.shape(), &[1, 8, 16, 16]);
//! # Ok::<(), leangrad::Error>(())
//! ```

use crate::nn::{Init, Linear};
use crate::{DType, Device, Error, Result, Tensor};

/// A classification model whose Linear head can be swapped for one of
/// another class count, as `model.fc = nn.Linear(512, 10)` does in
/// PyTorch: the head keeps its state-dict name, gets fresh parameters
/// (initialised as the model's own constructor initialises that layer) on
/// the head's dtype and device, and trains (requires grad) whatever was
/// frozen before; every other parameter is kept as it is.
pub trait ReplaceHead {
    /// The head's state-dict prefix (`fc`, `classifier.6`, `classifier.1`,
    /// `classifier`).
    fn head_name(&self) -> &str;

    /// Outputs of the head.
    fn num_classes(&self) -> usize;

    /// Replaces the head with a fresh `in_features → num_classes` Linear
    /// drawn from the Philox stream `seed`. `num_classes` 0 is
    /// [`Error::InvalidArgument`].
    fn replace_head(&mut self, num_classes: usize, seed: u64) -> Result<()>;
}

/// A model that can return the outputs of its layers by name, running the
/// network only as far as the last layer asked for. The outputs are those
/// of the forward pass (the same ops, so gradients flow back to the input
/// and to every parameter that requires grad), and each is the layer's own
/// output even where the next layer is an in-place ReLU (which then works
/// out of place; PyTorch's forward hooks would see the overwritten values).
pub trait FeatureMaps {
    /// The model's name in errors (`ResNet`, `Vgg`, `AlexNet`, `MobileNetV2`).
    fn model_name(&self) -> &'static str;

    /// Every layer name, in the order the forward pass runs them (the
    /// names of torchvision's `create_feature_extractor` nodes).
    fn feature_names(&self) -> Vec<String>;

    /// Runs `x` through the model, calling `visit(name, output)` after each
    /// named layer, in the order of [`FeatureMaps::feature_names`], and
    /// stops as soon as `visit` returns `true`; returns the model's output
    /// if it ran to the end.
    fn walk(
        &self,
        x: &Tensor,
        visit: &mut dyn FnMut(&str, &Tensor) -> bool,
    ) -> Result<Option<Tensor>>;

    /// The outputs of the layers `names` (in that order, each with its
    /// name) for input `x`. Layers after the last of them are not run. An
    /// unknown name is [`Error::UnknownLayer`], listing the valid names,
    /// before anything runs.
    fn features(&self, x: &Tensor, names: &[&str]) -> Result<Vec<(String, Tensor)>> {
        let valid = self.feature_names();
        if let Some(bad) = names.iter().find(|n| !valid.iter().any(|v| v == *n)) {
            return Err(Error::UnknownLayer {
                model: self.model_name(),
                name: bad.to_string(),
                valid,
            });
        }
        let mut got: Vec<Option<Tensor>> = vec![None; names.len()];
        let mut left = names.len();
        if left > 0 {
            self.walk(x, &mut |name, t| {
                for (slot, want) in got.iter_mut().zip(names) {
                    if slot.is_none() && *want == name {
                        *slot = Some(t.clone());
                        left -= 1;
                    }
                }
                left == 0
            })?;
        }
        names
            .iter()
            .zip(got)
            .map(|(n, t)| {
                t.map(|t| (n.to_string(), t))
                    .ok_or_else(|| Error::UnknownLayer {
                        model: self.model_name(),
                        name: n.to_string(),
                        valid: self.feature_names(),
                    })
            })
            .collect()
    }
}

/// How a model's constructor initialises its classifier Linear.
#[derive(Clone, Copy, Debug)]
pub(crate) enum HeadInit {
    /// PyTorch's default: weight and bias uniform in ±1/√in (torchvision's
    /// ResNet leaves `fc` so).
    Default,
    /// Weight normal with this standard deviation, bias zero (torchvision's
    /// VGG and MobileNetV2: 0.01; Hugging Face's ViT and BERT:
    /// `initializer_range`, 0.02).
    Normal(f64),
    /// Weight uniform in ±1/√num_classes (the head's outputs), bias zero
    /// (torchvision's EfficientNet).
    UniformByOutputs,
}

/// A fresh head `in_features → num_classes` named `name`, initialised by
/// `init` from `seed`, on `dtype` and `device`.
pub(crate) fn new_head(
    name: &str,
    in_features: usize,
    num_classes: usize,
    init: HeadInit,
    (dtype, device): (DType, Device),
    seed: u64,
) -> Result<Linear> {
    if num_classes == 0 {
        return Err(Error::InvalidArgument {
            op: "replace_head",
            msg: format!("num_classes must be positive (head `{name}`)"),
        });
    }
    let mut head = Linear::builder(in_features, num_classes)
        .name(name)
        .dtype(dtype)
        .seed(seed)
        .build(&device)?;
    let shape = [num_classes, in_features];
    let weight = match init {
        HeadInit::Default => None,
        HeadInit::Normal(std) => Some(Tensor::randn(&shape, dtype, device, seed)?.mul_scalar(std)?),
        HeadInit::UniformByOutputs => {
            let r = 1.0 / (num_classes as f64).sqrt();
            let uniform = Init::Uniform { low: -r, high: r };
            Some(uniform.tensor(&shape, dtype, device, seed)?)
        }
    };
    if let Some(w) = weight {
        head.weight = w.into_parameter()?;
        head.bias = Some(Tensor::zeros(&[num_classes], dtype, device)?.into_parameter()?);
    }
    Ok(head)
}

/// `new_head` shaped and placed like `old` (same input width, dtype and
/// device).
pub(crate) fn head_like(
    old: &Linear,
    num_classes: usize,
    init: HeadInit,
    seed: u64,
) -> Result<Linear> {
    let w = &old.weight;
    let in_features = w.shape()[1];
    let ctx = (w.dtype(), w.device());
    new_head(old.name(), in_features, num_classes, init, ctx, seed)
}
