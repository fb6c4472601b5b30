//! The models `leangrad memory` knows: [`MODELS`], their inputs and the
//! step's forward to the logits of the loss.

use super::Case;
use crate::models::heads::{text_input, Backbone, Classifier};
use crate::models::{
    AlexNet, AlexNetConfig, BertClassifier, BertConfig, ConvNeXt, ConvNeXtConfig, EfficientNet,
    EfficientNetConfig, Freeze, Gpt2, Gpt2Config, Mistral, MistralConfig, MobileNetV2,
    MobileNetV2Config, MobileNetV3, MobileNetV3Config, ResNet, ResNetConfig, Vgg, VggConfig,
    ViTClassifier, ViTConfig,
};
use crate::nn::Module;
use crate::ops::CrossEntropyOptions;
use crate::{DType, Device, Error, Result, Tensor};
use serde::Serialize;

/// A model a training step can be planned for: freezable by name
/// ([`Freeze`]) with the step's forward to the logits of the loss.
pub trait StepModel: Freeze {
    /// Logits `[rows, classes]` of the step's input: images `[N, C, H, W]`,
    /// token ids `[N, L]` (I64) or, for the `input` cases of text models,
    /// input embeddings `[N, L, hidden]` (float). `rows` is the number of
    /// targets ([`StepInput::targets`]).
    fn step_logits(&self, input: &Tensor) -> Result<Tensor>;

    /// The step's mean cross-entropy against `targets`: by default
    /// [`StepModel::step_logits`] then `cross_entropy`; a language model
    /// overrides it with its head fused into the loss, so that the logits
    /// never exist whole.
    fn step_loss(&self, input: &Tensor, targets: &Tensor) -> Result<Tensor> {
        self.step_logits(input)?
            .cross_entropy(targets, CrossEntropyOptions::default())
    }

    /// Turns per-block activation checkpointing on or off (the model's
    /// `gradient_checkpointing`); an error for a model without blocks to
    /// checkpoint.
    fn set_gradient_checkpointing(&mut self, on: bool) -> Result<()> {
        let _ = on;
        Err(Error::InvalidArgument {
            op: "checkpoint",
            msg: "this model has no per-block checkpointing (resnet18, resnet50, \
                  resnet101, resnext101_64x4d, mobilenet_v2, mobilenet_v3_large, efficientnet_v2_s, \
                  efficientnet_v2_m, efficientnet_v2_l, convnext_*, vit_b16, bert_base, \
                  roberta_base, xlm_roberta_base, gpt2 and mistral_7b have)"
                .into(),
        })
    }
}

impl StepModel for Vgg {
    fn step_logits(&self, input: &Tensor) -> Result<Tensor> {
        self.forward(input)
    }
}

impl StepModel for AlexNet {
    fn step_logits(&self, input: &Tensor) -> Result<Tensor> {
        self.forward(input)
    }
}

/// A model whose step is its `forward` and whose blocks checkpoint through
/// its own `gradient_checkpointing`.
macro_rules! step_by_forward_with_blocks {
    ($(impl$(<$g:ident: $bound:path>)? for $model:ty;)*) => {$(
        impl$(<$g: $bound>)? StepModel for $model {
            fn step_logits(&self, input: &Tensor) -> Result<Tensor> {
                self.forward(input)
            }

            fn set_gradient_checkpointing(&mut self, on: bool) -> Result<()> {
                self.gradient_checkpointing(on);
                Ok(())
            }
        }
    )*};
}
step_by_forward_with_blocks! {
    impl for ResNet;
    impl for MobileNetV2;
    impl for MobileNetV3;
    impl for ConvNeXt;
    impl for EfficientNet;
    impl<B: Backbone> for Classifier<B>;
}

/// A language model's step: next-token logits `[N·L, vocab]` of ids `[N,
/// L]` or embeddings `[N, L, hidden]` (`$logits` of the model and the
/// input), the loss through its own `lm_loss` (no `[N·L, vocab]` tensor is
/// ever alive), and per-block checkpointing.
macro_rules! language_model_step {
    ($($model:ty => |$m:ident, $x:ident| $logits:expr;)*) => {$(
        impl StepModel for $model {
            fn step_logits(&self, input: &Tensor) -> Result<Tensor> {
                let ($m, $x) = (self, text_input(input));
                let logits = $logits?;
                let s = logits.shape().to_vec();
                logits.reshape(&[s[0] * s[1], s[2]])
            }

            fn step_loss(&self, input: &Tensor, targets: &Tensor) -> Result<Tensor> {
                self.lm_loss(text_input(input), targets, CrossEntropyOptions::default())
            }

            fn set_gradient_checkpointing(&mut self, on: bool) -> Result<()> {
                self.gradient_checkpointing(on);
                Ok(())
            }
        }
    )*};
}
language_model_step! {
    Gpt2 => |m, x| m.logits(x);
    Mistral => |m, x| m.logits(x, None);
}

/// What a model reads, for [`MODELS`]: the defaults of the step's input.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum InputKind {
    /// Square images; one class per image.
    Image {
        /// Channels.
        channels: usize,
        /// Default height and width.
        default_size: usize,
    },
    /// Token ids; one class per sequence or the next token per position.
    Tokens {
        /// Rows of the word-embedding table.
        vocab: usize,
        /// Width of the input embeddings (the `input` cases).
        hidden: usize,
        /// Longest sequence the model takes.
        max_seq: usize,
        /// Default sequence length.
        default_seq: usize,
        /// Next-token targets over the vocabulary (GPT-2) instead of one
        /// class per sequence.
        next_token: bool,
    },
}

/// The input of one step and its targets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StepInput {
    /// Images `[N, channels, size, size]` (float, the case's input
    /// gradient); targets: one class per image.
    Image {
        /// Channels.
        channels: usize,
        /// Height and width.
        size: usize,
    },
    /// Token ids `[N, seq]` (I64), or input embeddings
    /// `[N, seq, hidden]` for the `input` cases; targets: one class per
    /// sequence, or (`next_token`) one token of `vocab` per position.
    Tokens {
        /// Sequence length.
        seq: usize,
        /// Rows of the word-embedding table (the ids' range).
        vocab: usize,
        /// Width of the input embeddings.
        hidden: usize,
        /// Next-token targets `[N·seq]` over the vocabulary.
        next_token: bool,
    },
}

impl StepInput {
    /// The input tensor for `batch` samples: images or embeddings from a
    /// seeded normal (requiring grad when `input_grad`), or ids.
    pub fn make(
        &self,
        batch: usize,
        input_grad: bool,
        dtype: DType,
        device: Device,
    ) -> Result<Tensor> {
        match *self {
            StepInput::Image { channels, size } => {
                Tensor::randn(&[batch, channels, size, size], dtype, device, 1)?
                    .set_requires_grad(input_grad)
            }
            StepInput::Tokens { seq, hidden, .. } if input_grad => {
                Tensor::randn(&[batch, seq, hidden], dtype, device, 1)?.set_requires_grad(true)
            }
            StepInput::Tokens { seq, vocab, .. } => {
                ids(batch * seq, vocab, 0, device)?.reshape(&[batch, seq])
            }
        }
    }

    /// The class targets (I64): `[batch]` in `0..classes`, or for
    /// next-token inputs `[batch·seq]` in `0..vocab`.
    pub fn targets(&self, batch: usize, classes: usize, device: Device) -> Result<Tensor> {
        match *self {
            StepInput::Tokens {
                seq,
                vocab,
                next_token: true,
                ..
            } => ids(batch * seq, vocab, 1, device),
            _ => ids(batch, classes, 0, device),
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        match *self {
            StepInput::Image { channels, size } => channels == 0 || size == 0,
            StepInput::Tokens {
                seq, vocab, hidden, ..
            } => seq == 0 || vocab == 0 || hidden == 0,
        }
    }
}

/// `n` I64 values `(i + shift) % range` (zeros on meta: never read).
fn ids(n: usize, range: usize, shift: usize, device: Device) -> Result<Tensor> {
    match device {
        Device::Meta => Tensor::zeros(&[n], DType::I64, Device::Meta),
        d => Tensor::from_vec(
            crate::memory::host::try_collect(n, (0..n).map(|i| ((i + shift) % range) as i64))?,
            &[n],
            d,
        ),
    }
}

/// Builds a model with `classes` outputs for `size`×`size` images (CNNs
/// ignore the size; ViT's position table follows it; text models ignore
/// it) in `dtype` on `device`.
pub type BuildFn =
    fn(classes: usize, size: usize, dtype: DType, device: Device) -> Result<Box<dyn StepModel>>;

/// One model the `memory` command knows.
pub struct ModelEntry {
    /// The name on the command line (`resnet18`).
    pub name: &'static str,
    /// The constructor (full size: torchvision's or Hugging Face's
    /// configuration).
    pub build: BuildFn,
    /// What the model reads, with the defaults of the input's size.
    pub input: InputKind,
}

impl ModelEntry {
    /// The step input of this model: `size` (images; default the model's)
    /// or `seq` (tokens; default the model's). Giving the other one or a
    /// sequence longer than the model takes is an error (an image size the
    /// model cannot take, such as one ViT's patch does not divide, is the
    /// model constructor's error).
    pub fn step_input(&self, size: Option<usize>, seq: Option<usize>) -> Result<StepInput> {
        let bad = |msg: String| Error::InvalidArgument { op: "memory", msg };
        match self.input {
            InputKind::Image {
                channels,
                default_size,
            } => {
                if seq.is_some() {
                    return Err(bad(format!(
                        "{} reads images: --seq does not apply (use --size)",
                        self.name
                    )));
                }
                Ok(StepInput::Image {
                    channels,
                    size: size.unwrap_or(default_size),
                })
            }
            InputKind::Tokens {
                vocab,
                hidden,
                max_seq,
                default_seq,
                next_token,
            } => {
                if size.is_some() {
                    return Err(bad(format!(
                        "{} reads token ids: --size does not apply (use --seq)",
                        self.name
                    )));
                }
                let seq = seq.unwrap_or(default_seq);
                if seq == 0 || seq > max_seq {
                    return Err(bad(format!(
                        "{} takes sequences of 1 to {max_seq} tokens, not {seq}",
                        self.name
                    )));
                }
                Ok(StepInput::Tokens {
                    seq,
                    vocab,
                    hidden,
                    next_token,
                })
            }
        }
    }
}

fn resnet18(classes: usize, _: usize, dtype: DType, device: Device) -> Result<Box<dyn StepModel>> {
    Ok(Box::new(ResNet::new(
        ResNetConfig::resnet18(classes),
        dtype,
        device,
        0,
    )?))
}

fn resnet50(classes: usize, _: usize, dtype: DType, device: Device) -> Result<Box<dyn StepModel>> {
    Ok(Box::new(ResNet::new(
        ResNetConfig::resnet50(classes),
        dtype,
        device,
        0,
    )?))
}

fn resnet101(classes: usize, _: usize, dtype: DType, device: Device) -> Result<Box<dyn StepModel>> {
    Ok(Box::new(ResNet::new(
        ResNetConfig::resnet101(classes),
        dtype,
        device,
        0,
    )?))
}

fn resnext101_64x4d(
    classes: usize,
    _: usize,
    dtype: DType,
    device: Device,
) -> Result<Box<dyn StepModel>> {
    Ok(Box::new(ResNet::new(
        ResNetConfig::resnext101_64x4d(classes),
        dtype,
        device,
        0,
    )?))
}

fn alexnet(classes: usize, _: usize, dtype: DType, device: Device) -> Result<Box<dyn StepModel>> {
    Ok(Box::new(AlexNet::new(
        &AlexNetConfig::alexnet(classes),
        dtype,
        device,
        0,
    )?))
}

fn vgg16(classes: usize, _: usize, dtype: DType, device: Device) -> Result<Box<dyn StepModel>> {
    Ok(Box::new(Vgg::new(
        &VggConfig::vgg16(false, classes),
        dtype,
        device,
        0,
    )?))
}

fn vgg16_bn(classes: usize, _: usize, dtype: DType, device: Device) -> Result<Box<dyn StepModel>> {
    Ok(Box::new(Vgg::new(
        &VggConfig::vgg16(true, classes),
        dtype,
        device,
        0,
    )?))
}

fn mobilenet_v2(
    classes: usize,
    _: usize,
    dtype: DType,
    device: Device,
) -> Result<Box<dyn StepModel>> {
    Ok(Box::new(MobileNetV2::new(
        &MobileNetV2Config::v2(classes),
        dtype,
        device,
        0,
    )?))
}

fn mobilenet_v3_large(
    classes: usize,
    _: usize,
    dtype: DType,
    device: Device,
) -> Result<Box<dyn StepModel>> {
    Ok(Box::new(MobileNetV3::new(
        &MobileNetV3Config::mobilenet_v3_large(classes),
        dtype,
        device,
        0,
    )?))
}

/// A torchvision ConvNeXt of `config` (any of the four sizes).
fn convnext(config: ConvNeXtConfig, dtype: DType, device: Device) -> Result<Box<dyn StepModel>> {
    Ok(Box::new(ConvNeXt::new(&config, dtype, device, 0)?))
}

fn convnext_tiny(c: usize, _: usize, d: DType, device: Device) -> Result<Box<dyn StepModel>> {
    convnext(ConvNeXtConfig::convnext_tiny(c), d, device)
}

fn convnext_small(c: usize, _: usize, d: DType, device: Device) -> Result<Box<dyn StepModel>> {
    convnext(ConvNeXtConfig::convnext_small(c), d, device)
}

fn convnext_base(c: usize, _: usize, d: DType, device: Device) -> Result<Box<dyn StepModel>> {
    convnext(ConvNeXtConfig::convnext_base(c), d, device)
}

fn convnext_large(c: usize, _: usize, d: DType, device: Device) -> Result<Box<dyn StepModel>> {
    convnext(ConvNeXtConfig::convnext_large(c), d, device)
}

/// torchvision's EfficientNetV2 of `config` (`efficientnet_v2_s`, `_m`,
/// `_l`).
fn efficientnet(
    config: EfficientNetConfig,
    dtype: DType,
    device: Device,
) -> Result<Box<dyn StepModel>> {
    Ok(Box::new(EfficientNet::new(&config, dtype, device, 0)?))
}

fn efficientnet_v2_s(c: usize, _: usize, d: DType, device: Device) -> Result<Box<dyn StepModel>> {
    efficientnet(EfficientNetConfig::efficientnet_v2_s(c), d, device)
}

fn efficientnet_v2_m(c: usize, _: usize, d: DType, device: Device) -> Result<Box<dyn StepModel>> {
    efficientnet(EfficientNetConfig::efficientnet_v2_m(c), d, device)
}

fn efficientnet_v2_l(c: usize, _: usize, d: DType, device: Device) -> Result<Box<dyn StepModel>> {
    efficientnet(EfficientNetConfig::efficientnet_v2_l(c), d, device)
}

fn vit_b16(
    classes: usize,
    size: usize,
    dtype: DType,
    device: Device,
) -> Result<Box<dyn StepModel>> {
    let config = ViTConfig {
        image_size: size,
        ..ViTConfig::vit_b16()
    };
    Ok(Box::new(ViTClassifier::new(
        config, classes, dtype, device, 0,
    )?))
}

/// A [`BertClassifier`] of `config` with a `classes`-way head: BERT-,
/// RoBERTa- and XLM-RoBERTa-base differ only in their configuration.
fn text_classifier(
    config: BertConfig,
    classes: usize,
    dtype: DType,
    device: Device,
) -> Result<Box<dyn StepModel>> {
    Ok(Box::new(BertClassifier::new(
        config, classes, dtype, device, 0,
    )?))
}

fn bert_base(classes: usize, _: usize, dtype: DType, device: Device) -> Result<Box<dyn StepModel>> {
    text_classifier(BertConfig::bert_base(), classes, dtype, device)
}

fn roberta_base(c: usize, _: usize, dtype: DType, device: Device) -> Result<Box<dyn StepModel>> {
    text_classifier(BertConfig::roberta_base(), c, dtype, device)
}

fn xlm_roberta_base(c: usize, _: usize, d: DType, device: Device) -> Result<Box<dyn StepModel>> {
    text_classifier(BertConfig::xlm_roberta_base(), c, d, device)
}

fn gpt2(_: usize, _: usize, dtype: DType, device: Device) -> Result<Box<dyn StepModel>> {
    Ok(Box::new(Gpt2::new(
        Gpt2Config::gpt2_small(),
        dtype,
        device,
        0,
    )?))
}

fn mistral_7b(_: usize, _: usize, dtype: DType, device: Device) -> Result<Box<dyn StepModel>> {
    Ok(Box::new(Mistral::new(
        MistralConfig::mistral_7b(),
        dtype,
        device,
        0,
    )?))
}

const IMAGE_224: InputKind = InputKind::Image {
    channels: 3,
    default_size: 224,
};

/// The models of `leangrad memory --model`, full size (1000 classes by
/// default; GPT-2 and Mistral-7B predict their vocabularies' next token).
pub const MODELS: &[ModelEntry] = &[
    ModelEntry {
        name: "resnet18",
        build: resnet18,
        input: IMAGE_224,
    },
    ModelEntry {
        name: "resnet50",
        build: resnet50,
        input: IMAGE_224,
    },
    ModelEntry {
        name: "resnet101",
        build: resnet101,
        input: IMAGE_224,
    },
    ModelEntry {
        name: "resnext101_64x4d",
        build: resnext101_64x4d,
        input: IMAGE_224,
    },
    ModelEntry {
        name: "vgg16",
        build: vgg16,
        input: IMAGE_224,
    },
    ModelEntry {
        name: "vgg16_bn",
        build: vgg16_bn,
        input: IMAGE_224,
    },
    ModelEntry {
        name: "mobilenet_v2",
        build: mobilenet_v2,
        input: IMAGE_224,
    },
    ModelEntry {
        name: "mobilenet_v3_large",
        build: mobilenet_v3_large,
        input: IMAGE_224,
    },
    ModelEntry {
        name: "efficientnet_v2_s",
        build: efficientnet_v2_s,
        input: IMAGE_224,
    },
    ModelEntry {
        name: "efficientnet_v2_m",
        build: efficientnet_v2_m,
        input: IMAGE_224,
    },
    ModelEntry {
        name: "efficientnet_v2_l",
        build: efficientnet_v2_l,
        input: IMAGE_224,
    },
    ModelEntry {
        name: "alexnet",
        build: alexnet,
        input: IMAGE_224,
    },
    ModelEntry {
        name: "convnext_tiny",
        build: convnext_tiny,
        input: IMAGE_224,
    },
    ModelEntry {
        name: "convnext_small",
        build: convnext_small,
        input: IMAGE_224,
    },
    ModelEntry {
        name: "convnext_base",
        build: convnext_base,
        input: IMAGE_224,
    },
    ModelEntry {
        name: "convnext_large",
        build: convnext_large,
        input: IMAGE_224,
    },
    ModelEntry {
        name: "vit_b16",
        build: vit_b16,
        input: IMAGE_224,
    },
    ModelEntry {
        name: "bert_base",
        build: bert_base,
        input: InputKind::Tokens {
            vocab: 30522,
            hidden: 768,
            max_seq: 512,
            default_seq: 128,
            next_token: false,
        },
    },
    ModelEntry {
        name: "roberta_base",
        build: roberta_base,
        input: InputKind::Tokens {
            vocab: 50265,
            hidden: 768,
            max_seq: 512,
            default_seq: 128,
            next_token: false,
        },
    },
    ModelEntry {
        name: "xlm_roberta_base",
        build: xlm_roberta_base,
        input: InputKind::Tokens {
            vocab: 250_002,
            hidden: 768,
            max_seq: 512,
            default_seq: 128,
            next_token: false,
        },
    },
    ModelEntry {
        name: "gpt2",
        build: gpt2,
        input: InputKind::Tokens {
            vocab: 50257,
            hidden: 768,
            max_seq: 1024,
            default_seq: 128,
            next_token: true,
        },
    },
    ModelEntry {
        name: "mistral_7b",
        build: mistral_7b,
        input: InputKind::Tokens {
            vocab: 32000,
            hidden: 4096,
            max_seq: 32768,
            default_seq: 128,
            next_token: true,
        },
    },
];

/// The entry of [`MODELS`] called `name`, or an error listing the names.
pub fn find_model(name: &str) -> Result<&'static ModelEntry> {
    MODELS
        .iter()
        .find(|m| m.name == name)
        .ok_or_else(|| Error::InvalidArgument {
            op: "memory",
            msg: format!(
                "unknown model `{name}`; known models: {}",
                MODELS.iter().map(|m| m.name).collect::<Vec<_>>().join(", ")
            ),
        })
}

/// The case called `name` (one of [`Case::all_names`]), or an error listing
/// the names.
pub fn parse_case(name: &str) -> Result<Case> {
    name.parse::<Case>().map_err(|_| Error::InvalidArgument {
        op: "memory",
        msg: format!(
            "unknown case `{name}`; known cases: {}",
            Case::all_names().join(", ")
        ),
    })
}
