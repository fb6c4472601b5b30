//! Classification heads on the transformer backbones, as Hugging Face's
//! `…ForImageClassification` / `…ForSequenceClassification` build them:
//! one Linear `classifier` on the backbone's features, named `classifier.*`
//! after the backbone's own parameters. The head saves what a Linear
//! saves (its input only when its weight trains).

use super::surgery::{head_like, HeadInit};
use super::{
    kinds_of, params_of, set_linear, Bert, BertConfig, Freeze, ReplaceHead, TextInput, ViT,
    ViTConfig, INITIALIZER_RANGE,
};
use crate::nn::{BatchStatsSync, Init, LayerKind, Linear, Module};
use crate::{DType, Device, Error, Result, Tensor};
use std::sync::Arc;

/// A backbone a [`Classifier`] reads features from.
pub trait Backbone: Freeze {
    /// Width of the features.
    fn feature_width(&self) -> usize;
    /// Standard deviation of the normal weights Hugging Face initialises
    /// a classifier head with (`initializer_range`; 0.02 in ViT's and
    /// BERT's configurations).
    fn initializer_range(&self) -> f64 {
        INITIALIZER_RANGE
    }
    /// Features `[N, width]` of the input.
    fn features(&self, input: &Tensor) -> Result<Tensor>;
    /// Runs each encoder layer as a checkpointed segment when `on` (the
    /// backbone's `gradient_checkpointing`).
    fn set_gradient_checkpointing(&mut self, on: bool);
}

/// A backbone and a Linear `classifier` (`width → classes`) on its
/// features. Parameter names: the backbone's, then `classifier.weight`,
/// `classifier.bias`.
pub struct Classifier<B> {
    backbone: B,
    classifier: Linear,
}

/// Hugging Face's `ViTForImageClassification`: no pooler; the classifier
/// reads the `[CLS]` token of the final LayerNorm's output.
pub type ViTClassifier = Classifier<ViT>;

/// Hugging Face's `BertForSequenceClassification` without dropout: the
/// classifier reads the tanh pooler's output.
pub type BertClassifier = Classifier<Bert>;

impl<B: Backbone> Classifier<B> {
    /// `backbone` with a fresh `classes`-way head, initialised as Hugging
    /// Face's `_init_weights` (weight N(0, initializer_range²), bias 0).
    pub fn with_head(
        backbone: B,
        classes: usize,
        dtype: DType,
        device: Device,
        seed: u64,
    ) -> Result<Classifier<B>> {
        let width = backbone.feature_width();
        let classifier = Linear::builder(width, classes)
            .name("classifier")
            .weight_init(Init::normal(backbone.initializer_range()))
            .bias_init(Init::zeros())
            .dtype(dtype)
            .seed(seed)
            .build(&device)?;
        Ok(Classifier {
            backbone,
            classifier,
        })
    }

    /// The backbone.
    pub fn backbone(&self) -> &B {
        &self.backbone
    }

    /// Runs each of the backbone's encoder layers as a checkpointed
    /// segment when `on` (see [`Backbone::set_gradient_checkpointing`]).
    pub fn gradient_checkpointing(&mut self, on: bool) {
        self.backbone.set_gradient_checkpointing(on);
    }
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
        let vit = ViT::new(config, dtype, device, seed)?;
        Classifier::with_head(vit, classes, dtype, device, seed.wrapping_add(9))
    }
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
        let bert = Bert::new(config, dtype, device, seed)?;
        Classifier::with_head(bert, classes, dtype, device, seed.wrapping_add(9))
    }
}

/// Token ids (integer dtype) or input embeddings (float dtype).
pub fn text_input(input: &Tensor) -> TextInput<'_> {
    if input.dtype().is_float() {
        TextInput::Embeds(input)
    } else {
        TextInput::Ids(input)
    }
}

impl Backbone for ViT {
    fn feature_width(&self) -> usize {
        self.config().hidden_size
    }

    /// The `[CLS]` token of the final LayerNorm's output, of images.
    fn features(&self, images: &Tensor) -> Result<Tensor> {
        let (h, _) = self.encode(images)?;
        h.narrow(1, 0, 1)?.squeeze(1)
    }

    fn set_gradient_checkpointing(&mut self, on: bool) {
        self.gradient_checkpointing(on);
    }
}

impl Backbone for Bert {
    fn feature_width(&self) -> usize {
        self.config().hidden_size
    }

    /// The pooler's output, of token ids (I64) or input embeddings (float).
    fn features(&self, input: &Tensor) -> Result<Tensor> {
        let (_, pooled) = self.encode(text_input(input), None)?;
        pooled.ok_or_else(|| Error::InvalidArgument {
            op: "BertClassifier",
            msg: "the BERT has no pooler".into(),
        })
    }

    fn set_gradient_checkpointing(&mut self, on: bool) {
        self.gradient_checkpointing(on);
    }
}

impl<B: Backbone> ReplaceHead for Classifier<B> {
    fn head_name(&self) -> &str {
        "classifier"
    }

    fn num_classes(&self) -> usize {
        self.classifier.weight.shape()[0]
    }

    /// A fresh `classifier`, initialised as Hugging Face initialises it
    /// (weight normal with std `initializer_range`, bias zero).
    fn replace_head(&mut self, num_classes: usize, seed: u64) -> Result<()> {
        let init = HeadInit::Normal(self.backbone.initializer_range());
        self.classifier = head_like(&self.classifier, num_classes, init, seed)?;
        Ok(())
    }
}

impl<B: Backbone> Module for Classifier<B> {
    /// Logits `[N, classes]` of the backbone's input.
    fn forward(&self, input: &Tensor) -> Result<Tensor> {
        self.classifier.forward(&self.backbone.features(input)?)
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let mut v = self.backbone.named_parameters();
        v.extend(params_of("classifier", &self.classifier));
        v
    }

    fn named_buffers(&self) -> Vec<(String, Tensor)> {
        self.backbone.named_buffers()
    }

    fn parameter_kinds(&self) -> Vec<(String, LayerKind)> {
        let mut v = self.backbone.parameter_kinds();
        v.extend(kinds_of("classifier", &self.classifier));
        v
    }

    fn set_training(&mut self, training: bool) {
        self.backbone.set_training(training);
    }

    fn sync_batch_norm(&mut self, sync: Option<&Arc<dyn BatchStatsSync>>) -> usize {
        self.backbone.sync_batch_norm(sync)
    }
}

impl<B: Backbone> Freeze for Classifier<B> {
    fn set_requires_grad(&mut self, want: &mut dyn FnMut(&str) -> bool) -> Result<()> {
        self.backbone.set_requires_grad(&mut *want)?;
        set_linear(&mut self.classifier, "classifier", want)
    }
}
