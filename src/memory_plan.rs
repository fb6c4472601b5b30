//! `leangrad memory`: the memory of one whole training step of a model,
//! predicted on the meta device (no data, no arithmetic: seconds for a
//! full-size model) or measured on the CPU, under the lean save policy and
//! under save-all side by side.
//!
//! One step is: build the model (parameters counted), apply the
//! [`Case`] (which parameters train, whether the input needs a gradient,
//! training or evaluation mode), a synthetic input and targets, forward,
//! cross-entropy loss, backward and an optimizer step (the usual
//! `backward` + `step`, or the fused `backward_step`). Everything runs in a
//! fresh [`Ledger`], so the report is exactly that step's allocations; on
//! meta it equals the CPU's byte for byte (`tests/meta_ledger.rs`).
//!
//! Models come from [`MODELS`], a table of names, constructors and input
//! kinds: adding a model is one entry. The step's forward and loss:
//!
//! * CNNs: images `[N, C, S, S]` → logits `[N, classes]`, one class per
//!   image.
//! * `vit_b16`: [`ViTClassifier`], Hugging Face's
//!   `ViTForImageClassification` (no pooler; a Linear `classifier` on the
//!   final-LayerNorm `[CLS]` token), one class per image.
//! * `bert_base`: [`BertClassifier`], Hugging Face's
//!   `BertForSequenceClassification` (a Linear `classifier` on the tanh
//!   pooler's output; no dropout), token ids `[N, seq]`, one class per
//!   sequence.
//! * `gpt2`: GPT-2 small with its tied LM head, token ids `[N, seq]`,
//!   next-token cross-entropy over the logits `[N·seq, vocab]` (the
//!   targets are given already shifted, as a data loader's `labels`, so
//!   the logits are not sliced).
//!
//! For the `input` cases the input that needs a gradient is the image, or
//! for the text models the input embeddings `[N, seq, hidden]` fed in place
//! of the word-embedding lookup (`forward_embeds`).

use crate::autograd::{with_save_policy, SavePolicy};
use crate::memory::{human_bytes, Category, DeviceReport, LayerBytes, Ledger, MemoryReport};
use crate::models::{
    set_linear, Bert, BertConfig, Case, Freeze, Gpt2, Gpt2Config, MobileNetV2, MobileNetV2Config,
    ResNet, ResNetConfig, TextInput, Vgg, VggConfig, ViT, ViTConfig,
};
use crate::nn::{LayerKind, Linear, Module};
use crate::ops::CrossEntropyOptions;
use crate::optim::{Adam, Algorithm, Optimizer, Sgd};
use crate::{DType, Device, Error, Result, Tensor};
use serde::Serialize;
use std::fmt::{Display, Write};
use std::time::Instant;

/// A model a training step can be planned for: freezable by name
/// ([`Freeze`]) with the step's forward to the logits of the loss.
pub trait StepModel: Freeze {
    /// Logits `[rows, classes]` of the step's input: images `[N, C, H, W]`,
    /// token ids `[N, L]` (I64) or, for the `input` cases of text models,
    /// input embeddings `[N, L, hidden]` (float). `rows` is the number of
    /// targets ([`StepInput::targets`]).
    fn step_logits(&self, input: &Tensor) -> Result<Tensor>;
}

macro_rules! step_by_forward {
    ($($model:ty),*) => {$(
        impl StepModel for $model {
            fn step_logits(&self, input: &Tensor) -> Result<Tensor> {
                self.forward(input)
            }
        }
    )*};
}
step_by_forward!(ResNet, Vgg, MobileNetV2);

/// Hugging Face's `ViTForImageClassification`: a [`ViT`] without pooler
/// and a Linear `classifier` (`hidden → classes`) on the `[CLS]` token of
/// the final LayerNorm's output. Parameter names: the ViT's, then
/// `classifier.weight`, `classifier.bias`.
pub struct ViTClassifier {
    vit: ViT,
    classifier: Linear,
}

impl ViTClassifier {
    /// A ViT of `config` (its pooler dropped) with a `classes`-way head.
    pub fn new(
        config: ViTConfig,
        classes: usize,
        dtype: DType,
        device: Device,
        seed: u64,
    ) -> Result<ViTClassifier> {
        let config = ViTConfig {
            add_pooling_layer: false,
            ..config
        };
        Ok(ViTClassifier {
            vit: ViT::new(config, dtype, device, seed)?,
            classifier: Linear::new(
                "classifier",
                config.hidden_size,
                classes,
                true,
                dtype,
                device,
                seed.wrapping_add(9),
            )?,
        })
    }
}

impl Module for ViTClassifier {
    /// Logits `[N, classes]` of images `[N, C, H, W]`.
    fn forward(&self, images: &Tensor) -> Result<Tensor> {
        let (h, _) = self.vit.encode(images)?;
        let cls = h.narrow(1, 0, 1)?.squeeze(1)?;
        self.classifier.forward(&cls)
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let mut v = self.vit.named_parameters();
        v.extend(crate::models::params_of("classifier", &self.classifier));
        v
    }

    fn parameter_kinds(&self) -> Vec<(String, LayerKind)> {
        let mut v = self.vit.parameter_kinds();
        v.extend(crate::models::kinds_of("classifier", &self.classifier));
        v
    }

    fn set_training(&mut self, training: bool) {
        self.vit.set_training(training);
    }
}

impl Freeze for ViTClassifier {
    fn set_requires_grad(&mut self, want: &mut dyn FnMut(&str) -> bool) -> Result<()> {
        self.vit.set_requires_grad(&mut *want)?;
        set_linear(&mut self.classifier, "classifier", want)
    }
}

impl StepModel for ViTClassifier {
    fn step_logits(&self, input: &Tensor) -> Result<Tensor> {
        self.forward(input)
    }
}

/// Hugging Face's `BertForSequenceClassification` without dropout: a
/// [`Bert`] (with its tanh pooler) and a Linear `classifier`
/// (`hidden → classes`) on the pooled first token. Parameter names: the
/// BERT's, then `classifier.weight`, `classifier.bias`.
pub struct BertClassifier {
    bert: Bert,
    classifier: Linear,
}

impl BertClassifier {
    /// A BERT of `config` (its pooler kept) with a `classes`-way head.
    pub fn new(
        config: BertConfig,
        classes: usize,
        dtype: DType,
        device: Device,
        seed: u64,
    ) -> Result<BertClassifier> {
        let config = BertConfig {
            add_pooling_layer: true,
            ..config
        };
        Ok(BertClassifier {
            bert: Bert::new(config, dtype, device, seed)?,
            classifier: Linear::new(
                "classifier",
                config.hidden_size,
                classes,
                true,
                dtype,
                device,
                seed.wrapping_add(9),
            )?,
        })
    }

    /// Logits `[N, classes]` of token ids `[N, L]` or input embeddings
    /// `[N, L, hidden]`.
    pub fn classify(&self, input: TextInput) -> Result<Tensor> {
        let (_, pooled) = self.bert.encode(input, None)?;
        let pooled = pooled.ok_or_else(|| Error::InvalidArgument {
            op: "BertClassifier",
            msg: "the BERT has no pooler".into(),
        })?;
        self.classifier.forward(&pooled)
    }
}

/// Token ids (integer dtype) or input embeddings (float dtype).
fn text_input(input: &Tensor) -> TextInput<'_> {
    if input.dtype().is_float() {
        TextInput::Embeds(input)
    } else {
        TextInput::Ids(input)
    }
}

impl Module for BertClassifier {
    /// Logits `[N, classes]` of token ids `[N, L]` (I64).
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        self.classify(TextInput::Ids(ids))
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let mut v = self.bert.named_parameters();
        v.extend(crate::models::params_of("classifier", &self.classifier));
        v
    }

    fn parameter_kinds(&self) -> Vec<(String, LayerKind)> {
        let mut v = self.bert.parameter_kinds();
        v.extend(crate::models::kinds_of("classifier", &self.classifier));
        v
    }

    fn set_training(&mut self, training: bool) {
        self.bert.set_training(training);
    }
}

impl Freeze for BertClassifier {
    fn set_requires_grad(&mut self, want: &mut dyn FnMut(&str) -> bool) -> Result<()> {
        self.bert.set_requires_grad(&mut *want)?;
        set_linear(&mut self.classifier, "classifier", want)
    }
}

impl StepModel for BertClassifier {
    fn step_logits(&self, input: &Tensor) -> Result<Tensor> {
        self.classify(text_input(input))
    }
}

impl StepModel for Gpt2 {
    /// Next-token logits `[N·L, vocab]` of ids `[N, L]` or embeddings
    /// `[N, L, n_embd]`.
    fn step_logits(&self, input: &Tensor) -> Result<Tensor> {
        let logits = self.logits(text_input(input))?;
        let s = logits.shape().to_vec();
        logits.reshape(&[s[0] * s[1], s[2]])
    }
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
    fn make(&self, batch: usize, input_grad: bool, dtype: DType, device: Device) -> Result<Tensor> {
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

    fn is_empty(&self) -> bool {
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
            (0..n)
                .map(|i| ((i + shift) % range) as i64)
                .collect::<Vec<_>>(),
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

fn bert_base(classes: usize, _: usize, dtype: DType, device: Device) -> Result<Box<dyn StepModel>> {
    Ok(Box::new(BertClassifier::new(
        BertConfig::bert_base(),
        classes,
        dtype,
        device,
        0,
    )?))
}

fn gpt2(_: usize, _: usize, dtype: DType, device: Device) -> Result<Box<dyn StepModel>> {
    Ok(Box::new(Gpt2::new(
        Gpt2Config::gpt2_small(),
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
/// default; GPT-2 predicts its 50257-token vocabulary).
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

/// The optimizer of the step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OptimizerKind {
    /// SGD with momentum 0.9 (one state tensor per parameter).
    Sgd,
    /// Adam (two state tensors per parameter).
    Adam,
    /// AdamW (two state tensors per parameter).
    Adamw,
}

impl OptimizerKind {
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            OptimizerKind::Sgd => "sgd",
            OptimizerKind::Adam => "adam",
            OptimizerKind::Adamw => "adamw",
        }
    }

    /// The optimizer called `name` (`sgd`, `adam`, `adamw`).
    pub fn parse(name: &str) -> Result<OptimizerKind> {
        match name {
            "sgd" => Ok(OptimizerKind::Sgd),
            "adam" => Ok(OptimizerKind::Adam),
            "adamw" => Ok(OptimizerKind::Adamw),
            _ => Err(Error::InvalidArgument {
                op: "memory",
                msg: format!("unknown optimizer `{name}`; known: sgd, adam, adamw"),
            }),
        }
    }
}

/// Everything about one step but the model.
#[derive(Clone, Debug, Serialize)]
pub struct StepSpec {
    /// Samples per batch.
    pub batch: usize,
    /// The input (images or tokens) and the kind of targets.
    pub input: StepInput,
    /// Classes of the synthetic targets (the classifier's outputs; unused
    /// by next-token inputs, whose classes are the vocabulary).
    pub classes: usize,
    /// Compute dtype of the model and of float inputs.
    #[serde(serialize_with = "lower_debug")]
    pub dtype: DType,
    /// The optimizer.
    pub optimizer: OptimizerKind,
    /// The fused `backward_step` (update each parameter as its gradient is
    /// final) instead of `backward` + `step`.
    pub fused: bool,
    /// Which parameters train, the input gradient and the mode (by name:
    /// `surgical-last-bn-eval`).
    #[serde(serialize_with = "display")]
    pub case: Case,
    /// Where to run: [`Device::Meta`] predicts, [`Device::Cpu`] measures.
    #[serde(serialize_with = "display")]
    pub device: Device,
}

fn lower_debug<S: serde::Serializer>(d: &DType, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_str(&format!("{d:?}").to_lowercase())
}

fn display<T: Display, S: serde::Serializer>(d: &T, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_str(&d.to_string())
}

/// The ledger of one step under one policy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StepMemory {
    /// Peak bytes by category, peak total, live bytes at the end of the
    /// step (model, gradients, optimizer state, input and loss still
    /// alive), parameter-gradient peak and saved bytes by layer, on the
    /// step's device.
    pub report: DeviceReport,
}

/// Runs one training step of the model made by `build` (inside a fresh
/// ledger, so its parameters are counted) as `spec` says, under `policy`,
/// and returns the ledger of the step's device. A case that trains no
/// parameter of the model and needs no input gradient is an error.
pub fn run_step(
    build: &dyn Fn(DType, Device) -> Result<Box<dyn StepModel>>,
    spec: &StepSpec,
    policy: SavePolicy,
) -> Result<StepMemory> {
    if spec.batch == 0 || spec.classes == 0 || spec.input.is_empty() {
        return Err(Error::InvalidArgument {
            op: "memory",
            msg: "batch, input size and classes must be at least 1".into(),
        });
    }
    if !spec.dtype.is_float() {
        return Err(Error::UnsupportedDType {
            op: "memory",
            dtype: spec.dtype,
        });
    }
    let input_grad = spec.case.input_requires_grad();
    let ledger = Ledger::new();
    let report = {
        let _l = ledger.enter();
        let mut model = build(spec.dtype, spec.device)?;
        spec.case.apply(model.as_mut())?;
        let params: Vec<Tensor> = model
            .parameters()
            .into_iter()
            .filter(|p| p.requires_grad())
            .collect();
        if params.is_empty() && !input_grad {
            return Err(Error::InvalidArgument {
                op: "memory",
                msg: format!(
                    "case `{}` trains nothing in this model (no parameter requires grad)",
                    spec.case
                ),
            });
        }
        let x = spec
            .input
            .make(spec.batch, input_grad, spec.dtype, spec.device)?;
        let targets = spec.input.targets(spec.batch, spec.classes, spec.device)?;
        let _p = with_save_policy(policy);
        let m: &dyn StepModel = model.as_ref();
        match spec.optimizer {
            OptimizerKind::Sgd => step(
                m,
                &x,
                &targets,
                Optimizer::new(params, Sgd::new(0.01).momentum(0.9))?,
                spec.fused,
                &ledger,
            )?,
            OptimizerKind::Adam => step(
                m,
                &x,
                &targets,
                Optimizer::new(params, Adam::new(1e-3))?,
                spec.fused,
                &ledger,
            )?,
            OptimizerKind::Adamw => step(
                m,
                &x,
                &targets,
                Optimizer::new(params, Adam::adamw(1e-3))?,
                spec.fused,
                &ledger,
            )?,
        }
    };
    let report = report
        .devices
        .into_iter()
        .find(|d| d.device == spec.device.to_string())
        .ok_or_else(|| Error::InvalidArgument {
            op: "memory",
            msg: format!("nothing was allocated on {}", spec.device),
        })?;
    Ok(StepMemory { report })
}

/// Forward, loss, backward and update with `opt`; returns the ledger's
/// report at the end of the step, while the model, its gradients, the
/// optimizer state, the input and the loss are still alive.
fn step<A: Algorithm>(
    model: &dyn StepModel,
    x: &Tensor,
    targets: &Tensor,
    mut opt: Optimizer<A>,
    fused: bool,
    ledger: &Ledger,
) -> Result<MemoryReport> {
    let loss = model
        .step_logits(x)?
        .cross_entropy(targets, CrossEntropyOptions::default())?;
    if fused {
        opt.backward_step(&loss)?;
    } else {
        loss.backward()?;
        opt.step()?;
    }
    Ok(ledger.report())
}

/// The lean policy next to save-all for one model and step.
#[derive(Clone, Debug, Serialize)]
pub struct MemoryPlan {
    /// The model's name.
    pub model: String,
    /// The step.
    pub spec: StepSpec,
    /// Under the lean policy (the default).
    pub lean: StepMemory,
    /// Under the save-everything policy (what PyTorch keeps).
    pub save_all: StepMemory,
    /// Wall-clock seconds for both steps.
    pub seconds: f64,
}

/// Plans (meta) or measures (CPU) one step of the model `name` of
/// [`MODELS`] under both policies.
pub fn plan(name: &str, spec: &StepSpec) -> Result<MemoryPlan> {
    let entry = find_model(name)?;
    let matches = matches!(
        (entry.input, spec.input),
        (InputKind::Image { .. }, StepInput::Image { .. })
            | (InputKind::Tokens { .. }, StepInput::Tokens { .. })
    );
    if !matches {
        return Err(Error::InvalidArgument {
            op: "memory",
            msg: format!("{name} reads {:?}, not the step's input", entry.input),
        });
    }
    let classes = spec.classes;
    let size = match spec.input {
        StepInput::Image { size, .. } => size,
        StepInput::Tokens { .. } => 0,
    };
    let build = move |dtype: DType, device: Device| (entry.build)(classes, size, dtype, device);
    let start = Instant::now();
    let lean = run_step(&build, spec, SavePolicy::Lean)?;
    let save_all = run_step(&build, spec, SavePolicy::SaveAll)?;
    Ok(MemoryPlan {
        model: name.to_string(),
        spec: spec.clone(),
        lean,
        save_all,
        seconds: start.elapsed().as_secs_f64(),
    })
}

fn ratio(lean: usize, all: usize) -> String {
    if lean == 0 {
        if all == 0 {
            "—".into()
        } else {
            "∞".into()
        }
    } else {
        format!("{:.2}×", all as f64 / lean as f64)
    }
}

/// Saved bytes of the layer part of a `layer/op` label, summed over ops.
fn by_layer(rows: &[LayerBytes]) -> Vec<(String, usize)> {
    let mut out: Vec<(String, usize)> = Vec::new();
    for r in rows {
        let layer = r.layer.split('/').next().unwrap_or_default();
        let layer = if layer.is_empty() { "(top)" } else { layer };
        match out.iter_mut().find(|(l, _)| l == layer) {
            Some((_, b)) => *b += r.peak,
            None => out.push((layer.to_string(), r.peak)),
        }
    }
    out.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    out
}

impl MemoryPlan {
    /// The plan as pretty-printed JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }

    /// A table: peak bytes by category (lean, save-all, ratio) and the
    /// `top` layers with the most saved bytes under the lean policy.
    pub fn to_table(&self, top: usize) -> String {
        let s = &self.spec;
        let (l, a) = (&self.lean.report, &self.save_all.report);
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{}: batch {}, {}, {}, case {}, {}{}, {} (both policies in {:.1} ms)",
            self.model,
            s.batch,
            match s.input {
                StepInput::Image { size, .. } => format!("{size}×{size}"),
                StepInput::Tokens { seq, .. } => format!("{seq} tokens"),
            },
            format!("{:?}", s.dtype).to_lowercase(),
            s.case,
            s.optimizer.name(),
            if s.fused { " fused" } else { "" },
            if s.device == Device::Meta {
                "predicted on meta".to_string()
            } else {
                format!("measured on {}", s.device)
            },
            self.seconds * 1e3
        );
        let _ = writeln!(
            out,
            "{:<18} {:>24} {:>24} {:>9}",
            "peak", "lean", "save-all", "save/lean"
        );
        let rows = [
            ("parameters", Category::Parameter),
            ("gradients", Category::Gradient),
            ("saved", Category::Saved),
            ("optimizer state", Category::OptimizerState),
            ("workspace", Category::Workspace),
            ("other", Category::Other),
        ];
        for (name, c) in rows {
            let (x, y) = (l.peak.get(c), a.peak.get(c));
            let _ = writeln!(
                out,
                "{name:<18} {:>24} {:>24} {:>9}",
                human_bytes(x),
                human_bytes(y),
                ratio(x, y)
            );
        }
        let _ = writeln!(
            out,
            "{:<18} {:>24} {:>24} {:>9}",
            "total",
            human_bytes(l.peak_total),
            human_bytes(a.peak_total),
            ratio(l.peak_total, a.peak_total)
        );
        let _ = writeln!(
            out,
            "{:<18} {:>24} {:>24} {:>9}",
            "leaf gradients",
            human_bytes(l.parameter_gradient_peak),
            human_bytes(a.parameter_gradient_peak),
            ratio(l.parameter_gradient_peak, a.parameter_gradient_peak)
        );
        if top > 0 {
            let (lean, all) = (by_layer(&l.saved_by_layer), by_layer(&a.saved_by_layer));
            let _ = writeln!(out, "layers with the most saved bytes (peak, lean):");
            for (layer, bytes) in lean.iter().take(top) {
                let other = all.iter().find(|(n, _)| n == layer).map_or(0, |(_, b)| *b);
                let _ = writeln!(
                    out,
                    "  {layer:<24} {:>24} {:>24} {:>9}",
                    human_bytes(*bytes),
                    human_bytes(other),
                    ratio(*bytes, other)
                );
            }
            if lean.is_empty() {
                let _ = writeln!(out, "  (nothing saved)");
            }
        }
        out
    }
}
