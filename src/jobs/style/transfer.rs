//! The optimisation problem of style transfer: a frozen VGG, the content
//! and style targets computed once, and the image that is optimised.

use super::StyleNet;
use crate::autograd::no_grad;
use crate::data::{normalize, IMAGENET_MEAN, IMAGENET_STD};
use crate::io::{load_into, load_weights, state_dict, LoadOptions};
use crate::models::{FeatureMaps, Vgg};
use crate::nn::Module;
use crate::ops::Reduction;
use crate::primitives::copy_into;
use crate::{Error, Result, Tensor};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;

/// The per-channel means Caffe's VGG weights subtract, in their channel
/// order (B, G, R), on the 0–255 scale.
pub const CAFFE_MEAN_BGR: [f64; 3] = [103.939, 116.779, 123.68];

/// What the network expects as its input, made from the image (RGB in
/// [0, 1]) inside the differentiated function.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum InputConvention {
    /// torchvision's weights: RGB in [0, 1], ImageNet mean subtracted and
    /// divided by its standard deviation (`(x − mean) / std`).
    #[default]
    Torchvision,
    /// Caffe's weights (the original VGG release and its conversions): BGR
    /// channel order, 0–255 scale, [`CAFFE_MEAN_BGR`] subtracted, no
    /// division.
    Caffe,
}

impl InputConvention {
    /// `torchvision` or `caffe`.
    pub fn parse(name: &str) -> Result<InputConvention> {
        match name {
            "torchvision" => Ok(InputConvention::Torchvision),
            "caffe" => Ok(InputConvention::Caffe),
            _ => Err(Error::InvalidArgument {
                op: "style",
                msg: format!("unknown input convention `{name}`; use torchvision or caffe"),
            }),
        }
    }

    /// Its name (`torchvision`, `caffe`).
    pub fn name(self) -> &'static str {
        match self {
            InputConvention::Torchvision => "torchvision",
            InputConvention::Caffe => "caffe",
        }
    }

    /// The network's input for images `x` `[N, 3, H, W]` (RGB in [0, 1]),
    /// differentiable in `x`.
    pub fn apply(self, x: &Tensor) -> Result<Tensor> {
        match self {
            InputConvention::Torchvision => normalize(x, &IMAGENET_MEAN, &IMAGENET_STD),
            InputConvention::Caffe => {
                let (r, g, b) = (x.narrow(1, 0, 1)?, x.narrow(1, 1, 1)?, x.narrow(1, 2, 1)?);
                let scaled = Tensor::cat(&[&b, &g, &r], 1)?.mul_scalar(255.0)?;
                normalize(&scaled, &CAFFE_MEAN_BGR, &[1.0; 3])
            }
        }
    }
}

/// The weighted losses of one image.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct StyleLosses {
    /// `content_weight · Σ mse(F_l(x), F_l(content))` over the content
    /// layers.
    pub content: f64,
    /// `style_weight · Σ mse(G_l(x), G_l(style))` over the style layers.
    pub style: f64,
    /// Their sum, the loss that is minimised.
    pub total: f64,
}

/// The Gram matrix of feature maps `[1, C, H, W]`, normalised as PyTorch's
/// style-transfer tutorial does: `F·Fᵀ / (C·H·W)` with `F` the `[C, H·W]`
/// matrix of the maps.
pub fn gram(features: &Tensor) -> Result<Tensor> {
    let s = features.shape();
    if s.len() != 4 {
        return Err(Error::InvalidArgument {
            op: "gram",
            msg: format!("expected feature maps [N, C, H, W], got {s:?}"),
        });
    }
    let rows = s[0] * s[1];
    let f = features.reshape(&[rows, s[2] * s[3]])?;
    f.matmul(&f.t()?)?.div_scalar((rows * s[2] * s[3]) as f64)
}

/// Loads VGG weights from a safetensors file of torchvision's
/// `state_dict()` into `vgg`'s `features.*` layers: the file's
/// `classifier.*` tensors, if any, are skipped (style transfer uses only
/// the features), every other name must match one of `vgg`'s features and
/// every feature must be in the file, with its shape
/// ([`Error::StateDictMismatch`] otherwise).
pub fn load_vgg_features(vgg: &Vgg, path: &Path) -> Result<()> {
    if !path.is_file() {
        return Err(Error::InvalidArgument {
            op: "style",
            msg: format!("weights file `{}` not found", path.display()),
        });
    }
    let features: BTreeMap<String, Tensor> = load_weights(path)?
        .into_iter()
        .filter(|(name, _)| !name.starts_with("classifier."))
        .collect();
    let destinations: Vec<(String, Tensor)> = state_dict(vgg, "")
        .into_iter()
        .filter(|(name, _)| name.starts_with("features."))
        .collect();
    load_into(&destinations, &features, LoadOptions::default())?;
    Ok(())
}

/// Style transfer's optimisation problem: a VGG with every parameter
/// frozen (no parameter ever gets a gradient), the content features and
/// style Gram matrices of the targets (computed once, without a graph),
/// and the image `[1, 3, H, W]` in [0, 1], the only leaf that requires
/// grad.
pub struct Transfer {
    vgg: Vgg,
    style_layers: Vec<String>,
    content_layers: Vec<String>,
    content_targets: Vec<Tensor>,
    style_targets: Vec<Tensor>,
    content_weight: f64,
    style_weight: f64,
    input: InputConvention,
    image: Tensor,
}

impl Transfer {
    /// Freezes `vgg` (evaluation mode, no parameter requires grad),
    /// computes the targets from `content` and `style` (`[1, 3, H, W]` in
    /// [0, 1], each of its own size) and starts from `init` (the image's
    /// size; copied into a new leaf). The network's input is made with
    /// torchvision's convention ([`InputConvention::Torchvision`]).
    pub fn new(
        vgg: Vgg,
        net: &StyleNet,
        images: (&Tensor, &Tensor),
        init: &Tensor,
        weights: (f64, f64),
    ) -> Result<Transfer> {
        Self::with_input(
            vgg,
            net,
            images,
            init,
            weights,
            InputConvention::Torchvision,
        )
    }

    /// [`Transfer::new`] for a network that expects its input made with
    /// `input` (Caffe's weights: [`InputConvention::Caffe`]).
    pub fn with_input(
        mut vgg: Vgg,
        net: &StyleNet,
        (content, style): (&Tensor, &Tensor),
        init: &Tensor,
        (content_weight, style_weight): (f64, f64),
        input: InputConvention,
    ) -> Result<Transfer> {
        vgg.set_requires_grad(|_| false)?;
        vgg.set_training(false);
        let (content_targets, style_targets) = {
            let _g = no_grad();
            let c = layer_maps(&vgg, &input.apply(content)?, &net.content_layers)?;
            let s = layer_maps(&vgg, &input.apply(style)?, &net.style_layers)?;
            let grams = s.iter().map(gram).collect::<Result<Vec<_>>>()?;
            (c, grams)
        };
        let image = Tensor::zeros(init.shape(), init.dtype(), init.device())?;
        copy_into(&image, &init.detach())?;
        Ok(Transfer {
            vgg,
            style_layers: net.style_layers.clone(),
            content_layers: net.content_layers.clone(),
            content_targets,
            style_targets,
            content_weight,
            style_weight,
            input,
            image: image.set_requires_grad(true)?,
        })
    }

    /// The image being optimised (a leaf requiring grad).
    pub fn image(&self) -> &Tensor {
        &self.image
    }

    /// The network's input for the current image (its convention applied),
    /// attached to the graph when grad mode is on: what the losses read.
    pub fn network_input(&self) -> Result<Tensor> {
        self.input.apply(&self.image)
    }

    /// The frozen network.
    pub fn vgg(&self) -> &Vgg {
        &self.vgg
    }

    /// The weighted content and style losses of the current image, as
    /// scalar tensors attached to the graph (when grad mode is on).
    pub fn loss_tensors(&self) -> Result<(Tensor, Tensor)> {
        let mut names: Vec<&str> = self.style_layers.iter().map(String::as_str).collect();
        names.extend(self.content_layers.iter().map(String::as_str));
        let maps = self.vgg.features(&self.network_input()?, &names)?;
        let (style_maps, content_maps) = maps.split_at(self.style_layers.len());
        let sum = |terms: Vec<Tensor>| -> Result<Tensor> {
            let mut it = terms.into_iter();
            let first = it.next().ok_or_else(|| Error::InvalidArgument {
                op: "style",
                msg: "no content or no style layer".into(),
            })?;
            it.try_fold(first, |acc, t| acc.add(&t))
        };
        let content = sum(content_maps
            .iter()
            .zip(&self.content_targets)
            .map(|((_, f), target)| f.mse_loss(target, Reduction::Mean))
            .collect::<Result<_>>()?)?;
        let style = sum(style_maps
            .iter()
            .zip(&self.style_targets)
            .map(|((_, f), target)| gram(f)?.mse_loss(target, Reduction::Mean))
            .collect::<Result<_>>()?)?;
        Ok((
            content.mul_scalar(self.content_weight)?,
            style.mul_scalar(self.style_weight)?,
        ))
    }

    /// Forward and backward at the current image: frees the image's old
    /// gradient, leaves the new one in its `.grad`, and returns the
    /// (detached) content and style losses.
    pub fn backward(&self) -> Result<(Tensor, Tensor)> {
        self.image.zero_grad();
        let (content, style) = self.loss_tensors()?;
        content.add(&style)?.backward()?;
        Ok((content.detach(), style.detach()))
    }

    /// [`Transfer::backward`], with the losses read.
    pub fn evaluate(&self) -> Result<StyleLosses> {
        let (content, style) = self.backward()?;
        Ok(losses(content.to_scalar()?, style.to_scalar()?))
    }

    /// The losses of the current image, without a graph.
    pub fn losses(&self) -> Result<StyleLosses> {
        let _g = no_grad();
        let (content, style) = self.loss_tensors()?;
        Ok(losses(content.to_scalar()?, style.to_scalar()?))
    }

    /// Clamps the image to [0, 1] in place (as the tutorial does between
    /// steps).
    pub fn clamp_image(&self) -> Result<()> {
        let _g = no_grad();
        let clamped = self.image.clamp(0.0, 1.0)?;
        copy_into(&self.image.detach(), &clamped)
    }
}

fn losses(content: f64, style: f64) -> StyleLosses {
    StyleLosses {
        content,
        style,
        total: content + style,
    }
}

/// The maps of `layers` for the network's input `x`.
fn layer_maps(vgg: &Vgg, x: &Tensor, layers: &[String]) -> Result<Vec<Tensor>> {
    let names: Vec<&str> = layers.iter().map(String::as_str).collect();
    Ok(vgg
        .features(x, &names)?
        .into_iter()
        .map(|(_, t)| t)
        .collect())
}
