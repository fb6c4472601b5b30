//! Whole models with PyTorch-compatible state-dict names (torchvision's
//! for the CNNs: ResNet and ResNeXt, VGG, MobileNetV2, MobileNetV3-Large, EfficientNetV2, AlexNet,
//! ConvNeXt; Hugging
//! Face transformers' for ViT, BERT and GPT-2), so weights exported to
//! safetensors load with [`crate::io::load_state_dict`] in strict mode.
//!
//! Each model implements [`crate::nn::Module`] (full dotted names such as
//! `layer1.0.conv1.weight`; `set_training` reaches every BatchNorm), runs
//! each submodule inside a [`crate::memory::scope`] of the same name so the
//! memory ledger reports saved bytes per layer, and can freeze or unfreeze
//! parameters by name with `set_requires_grad(|name| …)`. The [`Freeze`]
//! trait adds freezing by glob ([`Glob`]) for any model, and [`Case`]
//! names the selective-differentiation cases (`norm`, `surgical-last`,
//! `conv-bn-eval`, …) and applies them ([`cases`]). Pretrained BERTs load
//! from a Hugging Face folder ([`Bert::from_pretrained`]);
//! [`SentenceEncoder`] turns sentences into sentence-transformers'
//! embeddings (all-MiniLM-L6-v2: [`SentenceEncoder::minilm`]).

pub mod alexnet;
pub mod bert;
pub mod cases;
pub mod convnext;
pub mod efficientnet;
pub mod gpt2;
pub mod heads;
mod inverted_residual;
pub mod mistral;
mod mistral_pretrained;
pub mod mobilenet;
pub mod mobilenet_v3;
pub mod pretrained;
pub mod resnet;
pub mod sentence;
pub mod surgery;
pub mod transformer;
pub mod vgg;
pub mod vit;

pub use alexnet::{AlexNet, AlexNetConfig};
pub use bert::{Bert, BertConfig, PositionIds};
pub use cases::{glob_match, layer_of, layers_in_order, Case, Freeze, Glob, Selection};
pub use convnext::{ConvNeXt, ConvNeXtConfig, ConvNeXtStage};
pub use efficientnet::{EfficientNet, EfficientNetConfig, MBConvKind, MBConvSetting};
pub use gpt2::{Gpt2, Gpt2Config};
pub use heads::{Backbone, BertClassifier, Classifier, ViTClassifier};
pub use mistral::{Mistral, MistralConfig};
pub use mistral_pretrained::DECODER_CONFIG_RANGES;
pub use mobilenet::{InvertedResidualSetting, MobileNetV2, MobileNetV2Config};
pub use mobilenet_v3::{make_divisible, BneckSetting, MobileNetV3, MobileNetV3Config};
pub use pretrained::{minilm_dir, MINILM_DIR_ENV, MINILM_INSTALL};
pub use resnet::{BlockKind, ResNet, ResNetConfig};
pub use sentence::{l2_normalize, mean_pool, SentenceEncoder, TextTokenizer, TokenBatch};
pub use surgery::{FeatureMaps, ReplaceHead};
pub use transformer::{Conv1D, Conv1DBuilder, Param, TextInput, INITIALIZER_RANGE};

/// `f(block, inputs)` as a checkpointed segment
/// ([`crate::autograd::checkpoint`]) of a clone of `block` (which shares
/// its parameters): what a model under `gradient_checkpointing(true)` runs
/// for each of its blocks.
pub(crate) fn checkpoint_block<B>(
    block: &B,
    inputs: &[&crate::Tensor],
    f: fn(&B, &[crate::Tensor]) -> crate::Result<crate::Tensor>,
) -> crate::Result<crate::Tensor>
where
    B: Clone + Send + Sync + 'static,
{
    let block = block.clone();
    crate::autograd::checkpoint(move |xs| f(&block, xs), inputs)
}
pub use vgg::{Vgg, VggConfig, VGG16_PLAN};
pub use vit::{classic_vit_name, ViT, ViTConfig};

use crate::nn::{BatchNorm, Conv2d, Conv2dBuilder, FanMode, Init, LayerKind, Module};
use crate::{DType, Device, Result, Tensor};

/// In a [`FeatureMaps::walk`]: returns `Ok(None)` (stop) when the visitor
/// says so.
macro_rules! stop_if {
    ($visit:expr) => {
        if $visit {
            return Ok(None);
        }
    };
}
pub(crate) use stop_if;

/// The [`Module`] methods of a CNN that walks its layers
/// ([`FeatureMaps::walk`]) and lists its tensors by [`Part`]: `forward`
/// (the walk to its end; `$model` names it in the error),
/// `named_parameters`, `parameter_kinds` and `named_buffers`. Used inside
/// `impl Module for …`, beside the model's own `set_training`.
macro_rules! walked_module_methods {
    ($model:literal) => {
        /// Class scores `[n, num_classes]` of images `[n, in_channels, h, w]`.
        fn forward(&self, x: &$crate::Tensor) -> $crate::Result<$crate::Tensor> {
            let out = $crate::models::FeatureMaps::walk(self, x, &mut |_, _| false)?;
            $crate::models::ran_to_the_end(out, $model)
        }

        fn named_parameters(&self) -> Vec<(String, $crate::Tensor)> {
            $crate::models::tensors(self.parts($crate::models::Part::Parameters))
        }

        fn parameter_kinds(&self) -> Vec<(String, $crate::nn::LayerKind)> {
            $crate::models::kinds(self.parts($crate::models::Part::Kinds))
        }

        fn named_buffers(&self) -> Vec<(String, $crate::Tensor)> {
            $crate::models::tensors(self.parts($crate::models::Part::Buffers))
        }
    };
}
pub(crate) use walked_module_methods;

/// The output of a walk that no visitor stopped.
pub(crate) fn ran_to_the_end(out: Option<Tensor>, model: &'static str) -> Result<Tensor> {
    out.ok_or_else(|| crate::Error::InvalidArgument {
        op: model,
        msg: "the forward pass stopped early".into(),
    })
}

/// The dtype and device every layer of a model is built with.
pub(crate) type Ctx = (DType, Device);

/// A bias-free `k`×`k` convolution with "same" padding (`k / 2`), as
/// torchvision's ResNet and MobileNets build and initialise them: weight
/// `kaiming_normal_(mode="fan_out", nonlinearity="relu")`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn square_conv(
    name: &str,
    io: [usize; 2],
    k: usize,
    stride: usize,
    groups: usize,
    c: Ctx,
    seed: u64,
) -> Result<Conv2d> {
    square_conv_builder(name, io, k, stride, groups, c, seed).build(&c.1)
}

/// The builder of [`square_conv`], for a variant (a bias) before building.
pub(crate) fn square_conv_builder(
    name: &str,
    io: [usize; 2],
    k: usize,
    stride: usize,
    groups: usize,
    c: Ctx,
    seed: u64,
) -> Conv2dBuilder {
    Conv2d::builder(io[0], io[1], k)
        .name(name)
        .stride(stride)
        .padding(k / 2)
        .groups(groups)
        .bias(false)
        .weight_init(Init::kaiming_normal_relu(FanMode::FanOut))
        .dtype(c.0)
        .seed(seed)
}

/// A BatchNorm2d with PyTorch's default options (weight 1, bias 0, as
/// torchvision also initialises it).
pub(crate) fn batch_norm2d(name: &str, channels: usize, c: Ctx) -> Result<BatchNorm> {
    BatchNorm::builder(channels)
        .name(name)
        .dtype(c.0)
        .build2d(&c.1)
}

/// `prefix.name` for each of `module`'s parameters.
pub(crate) fn prefixed(prefix: &str, pairs: Vec<(String, Tensor)>) -> Vec<(String, Tensor)> {
    pairs
        .into_iter()
        .map(|(n, t)| (format!("{prefix}.{n}"), t))
        .collect()
}

/// Named parameters of `module` under `prefix`.
pub(crate) fn params_of(prefix: &str, module: &dyn Module) -> Vec<(String, Tensor)> {
    prefixed(prefix, module.named_parameters())
}

/// Named buffers of `module` under `prefix`.
pub(crate) fn buffers_of(prefix: &str, module: &dyn Module) -> Vec<(String, Tensor)> {
    prefixed(prefix, module.named_buffers())
}

/// [`Module::parameter_kinds`] of `module` under `prefix`.
pub(crate) fn kinds_of(prefix: &str, module: &dyn Module) -> Vec<(String, LayerKind)> {
    module
        .parameter_kinds()
        .into_iter()
        .map(|(n, k)| (format!("{prefix}.{n}"), k))
        .collect()
}

/// What a model lists per submodule: its parameters, its buffers or the
/// kinds of its parameters, all with full dotted names.
#[derive(Clone, Copy)]
pub(crate) enum Part {
    /// [`Module::named_parameters`].
    Parameters,
    /// [`Module::named_buffers`].
    Buffers,
    /// [`Module::parameter_kinds`].
    Kinds,
}

/// A named tensor or a named parameter kind, as [`Part`] asks.
pub(crate) enum Named {
    /// A parameter or buffer.
    Tensor(String, Tensor),
    /// The kind of a parameter.
    Kind(String, LayerKind),
}

/// `part` of `module` under `prefix`.
pub(crate) fn part_of(prefix: &str, module: &dyn Module, part: Part) -> Vec<Named> {
    match part {
        Part::Parameters => params_of(prefix, module)
            .into_iter()
            .map(|(n, t)| Named::Tensor(n, t))
            .collect(),
        Part::Buffers => buffers_of(prefix, module)
            .into_iter()
            .map(|(n, t)| Named::Tensor(n, t))
            .collect(),
        Part::Kinds => kinds_of(prefix, module)
            .into_iter()
            .map(|(n, k)| Named::Kind(n, k))
            .collect(),
    }
}

/// The named tensors among `items`.
pub(crate) fn tensors(items: Vec<Named>) -> Vec<(String, Tensor)> {
    items
        .into_iter()
        .filter_map(|i| match i {
            Named::Tensor(n, t) => Some((n, t)),
            Named::Kind(..) => None,
        })
        .collect()
}

/// The named kinds among `items`.
pub(crate) fn kinds(items: Vec<Named>) -> Vec<(String, LayerKind)> {
    items
        .into_iter()
        .filter_map(|i| match i {
            Named::Kind(n, k) => Some((n, k)),
            Named::Tensor(..) => None,
        })
        .collect()
}

/// Makes the parameter in `slot` (named `name`) require grad or not as
/// `want(name)` says, keeping its storage (and so its loaded values).
pub(crate) fn set_slot(
    slot: &mut Tensor,
    name: &str,
    want: &mut dyn FnMut(&str) -> bool,
) -> Result<()> {
    let requires = want(name);
    if slot.requires_grad() != requires {
        *slot = slot.clone().set_requires_grad(requires)?;
    }
    Ok(())
}

/// [`set_slot`] for an optional parameter.
pub(crate) fn set_opt_slot(
    slot: &mut Option<Tensor>,
    name: &str,
    want: &mut dyn FnMut(&str) -> bool,
) -> Result<()> {
    match slot {
        Some(t) => set_slot(t, name, want),
        None => Ok(()),
    }
}

/// Applies `want` to a convolution's weight and bias under `prefix`.
pub(crate) fn set_conv(
    conv: &mut crate::nn::Conv2d,
    prefix: &str,
    want: &mut dyn FnMut(&str) -> bool,
) -> Result<()> {
    set_slot(&mut conv.weight, &format!("{prefix}.weight"), want)?;
    set_opt_slot(&mut conv.bias, &format!("{prefix}.bias"), want)
}

/// Applies `want` to a BatchNorm's affine weight and bias under `prefix`.
pub(crate) fn set_bn(
    bn: &mut crate::nn::BatchNorm,
    prefix: &str,
    want: &mut dyn FnMut(&str) -> bool,
) -> Result<()> {
    set_opt_slot(&mut bn.weight, &format!("{prefix}.weight"), want)?;
    set_opt_slot(&mut bn.bias, &format!("{prefix}.bias"), want)
}

/// Applies `want` to a Linear layer's weight and bias under `prefix`.
pub(crate) fn set_linear(
    fc: &mut crate::nn::Linear,
    prefix: &str,
    want: &mut dyn FnMut(&str) -> bool,
) -> Result<()> {
    set_slot(&mut fc.weight, &format!("{prefix}.weight"), want)?;
    set_opt_slot(&mut fc.bias, &format!("{prefix}.bias"), want)
}
