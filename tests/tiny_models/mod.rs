//! The tiny models of the model tests (CNNs and transformers) as step
//! models with their step input, shared by `meta_ledger.rs` and
//! `device_models.rs`. Each file that uses it declares `mod tiny_models;`.
#![allow(dead_code)]

use leangrad::memory_plan::{StepInput, StepModel};
use leangrad::models::{
    AlexNet, AlexNetConfig, BertClassifier, BertConfig, BlockKind, BneckSetting, ConvNeXt,
    ConvNeXtConfig, ConvNeXtStage, EfficientNet, EfficientNetConfig, Gpt2, Gpt2Config,
    InvertedResidualSetting, MBConvSetting, Mistral, MistralConfig, MobileNetV2, MobileNetV2Config,
    MobileNetV3, MobileNetV3Config, PositionIds, ResNet, ResNetConfig, Vgg, VggConfig,
    ViTClassifier, ViTConfig,
};
use leangrad::{DType, Device, Result};

/// Builds a model in a dtype on a device.
pub type Build = Box<dyn Fn(DType, Device) -> Result<Box<dyn StepModel>>>;

pub fn resnet(block: BlockKind, layers: [usize; 4]) -> Build {
    Box::new(move |d, dev| {
        let c = ResNetConfig {
            block,
            layers,
            base_width: 2,
            num_classes: 5,
            in_channels: 3,
            zero_init_residual: false,
            groups: 1,
            width_per_group: 64,
        };
        Ok(Box::new(ResNet::new(c, d, dev, 1)?) as Box<dyn StepModel>)
    })
}

/// A tiny Bottleneck ResNet of `layers` whose 3×3 convolutions run in
/// `groups` groups of `width_per_group` (a ResNeXt when `groups` > 1).
pub fn grouped_resnet(layers: [usize; 4], groups: usize, width_per_group: usize) -> Build {
    Box::new(move |d, dev| {
        let c = ResNetConfig {
            block: BlockKind::Bottleneck,
            layers,
            base_width: 2,
            num_classes: 5,
            in_channels: 3,
            zero_init_residual: false,
            groups,
            width_per_group,
        };
        Ok(Box::new(ResNet::new(c, d, dev, 1)?) as Box<dyn StepModel>)
    })
}

/// The tiny AlexNet of `tests/models_alexnet.rs`, with dropout.
pub fn alexnet() -> Build {
    Box::new(|d, dev| {
        let c = AlexNetConfig {
            in_channels: 3,
            widths: [4, 8, 8, 8, 8],
            pool_size: 6,
            hidden: 16,
            num_classes: 5,
            dropout: 0.5,
        };
        Ok(Box::new(AlexNet::new(&c, d, dev, 1)?) as Box<dyn StepModel>)
    })
}

pub fn vgg(batch_norm: bool) -> Build {
    Box::new(move |d, dev| {
        let c = VggConfig {
            plan: vec![1, 1, 0, 2, 2, 0, 2, 2, 2, 0, 4, 4, 4, 0, 4, 4, 4, 0],
            batch_norm,
            in_channels: 3,
            pool_size: 1,
            hidden: 8,
            num_classes: 5,
            dropout: 0.5,
        };
        Ok(Box::new(Vgg::new(&c, d, dev, 1)?) as Box<dyn StepModel>)
    })
}

pub fn mobilenet() -> Build {
    Box::new(|d, dev| {
        let rows = [(1, 2, 1, 1), (6, 3, 2, 2), (6, 4, 2, 2)];
        let c = MobileNetV2Config {
            stem: 4,
            settings: rows
                .iter()
                .map(|&(t, c, n, s)| InvertedResidualSetting { t, c, n, s })
                .collect(),
            last_channel: 16,
            num_classes: 5,
            in_channels: 3,
            dropout: 0.2,
        };
        Ok(Box::new(MobileNetV2::new(&c, d, dev, 1)?) as Box<dyn StepModel>)
    })
}

/// The tiny ViT of the transformer tests with a 5-way classifier.
pub fn vit() -> Build {
    Box::new(|d, dev| {
        Ok(Box::new(ViTClassifier::new(ViTConfig::tiny(), 5, d, dev, 1)?) as Box<dyn StepModel>)
    })
}

/// The tiny BERT of the transformer tests with a 5-way classifier.
pub fn bert() -> Build {
    Box::new(|d, dev| {
        Ok(Box::new(BertClassifier::new(BertConfig::tiny(), 5, d, dev, 1)?) as Box<dyn StepModel>)
    })
}

/// The tiny RoBERTa of the transformer tests (BERT's tiny configuration
/// with positions after the padding token 1) with a 5-way classifier.
pub fn roberta() -> Build {
    Box::new(|d, dev| {
        let config = BertConfig {
            type_vocab_size: 1,
            layer_norm_eps: 1e-5,
            pad_token_id: Some(1),
            position_ids: PositionIds::AfterPadding,
            ..BertConfig::tiny()
        };
        Ok(Box::new(BertClassifier::new(config, 5, d, dev, 1)?) as Box<dyn StepModel>)
    })
}

/// The tiny MobileNetV3 of `tests/models_mobilenet_v3.rs` (squeeze-and-
/// excitation, Hardswish), with dropout.
pub fn mobilenet_v3() -> Build {
    Box::new(|d, dev| {
        let rows = [
            (8, 3, 8, 8, false, false, 1),
            (8, 3, 16, 8, true, false, 2),
            (8, 5, 16, 8, true, true, 1),
            (8, 3, 24, 16, false, true, 2),
        ];
        let c = MobileNetV3Config {
            in_channels: 3,
            settings: rows.iter().map(|&r| BneckSetting::from_row(r)).collect(),
            width_mult: 1.0,
            last_channel: 16,
            num_classes: 5,
            dropout: 0.2,
        };
        Ok(Box::new(MobileNetV3::new(&c, d, dev, 1)?) as Box<dyn StepModel>)
    })
}

/// The tiny ConvNeXt of `tests/models_convnext.rs`, with stochastic depth
/// (0.5 at the last block) and layer scales of 0.5.
pub fn convnext() -> Build {
    Box::new(|d, dev| {
        let c = ConvNeXtConfig {
            in_channels: 3,
            stages: vec![
                ConvNeXtStage::new(8, Some(16), 1),
                ConvNeXtStage::new(16, Some(24), 2),
                ConvNeXtStage::new(24, None, 1),
            ],
            stochastic_depth_prob: 0.5,
            layer_scale: 0.5,
            num_classes: 5,
        };
        Ok(Box::new(ConvNeXt::new(&c, d, dev, 1)?) as Box<dyn StepModel>)
    })
}

/// The tiny EfficientNet of `tests/models_efficientnet.rs` (FusedMBConv,
/// MBConv with squeeze-and-excitation, SiLU), with dropout and stochastic
/// depth.
pub fn efficientnet() -> Build {
    Box::new(|d, dev| {
        let c = EfficientNetConfig {
            in_channels: 3,
            settings: vec![
                MBConvSetting::fused(1.0, 3, 1, 8, 8, 2),
                MBConvSetting::fused(2.0, 3, 2, 8, 16, 1),
                MBConvSetting::mbconv(2.0, 3, 2, 16, 16, 2),
                MBConvSetting::mbconv(1.0, 5, 1, 16, 16, 1),
            ],
            last_channel: None,
            num_classes: 5,
            dropout: 0.2,
            stochastic_depth_prob: 0.5,
        };
        Ok(Box::new(EfficientNet::new(&c, d, dev, 1)?) as Box<dyn StepModel>)
    })
}

/// The tiny GPT-2 of the transformer tests (next-token loss).
pub fn gpt2() -> Build {
    Box::new(|d, dev| Ok(Box::new(Gpt2::new(Gpt2Config::tiny(), d, dev, 1)?) as Box<dyn StepModel>))
}

/// The tiny Mistral-style decoder of `tests/models_mistral.rs`
/// (grouped-query attention, a sliding window of 5 over its 8 tokens).
pub fn mistral() -> Build {
    Box::new(|d, dev| {
        Ok(Box::new(Mistral::new(MistralConfig::tiny(), d, dev, 1)?) as Box<dyn StepModel>)
    })
}

pub const IMAGES: StepInput = StepInput::Image {
    channels: 3,
    size: 32,
};

/// The tiny models with their step input.
pub fn models() -> Vec<(&'static str, Build, StepInput)> {
    let tokens = |next_token| StepInput::Tokens {
        seq: 8,
        vocab: 50,
        hidden: 16,
        next_token,
    };
    vec![
        (
            "resnet18_tiny",
            resnet(BlockKind::Basic, [2, 2, 2, 2]),
            IMAGES,
        ),
        (
            "resnet50_tiny",
            resnet(BlockKind::Bottleneck, [3, 4, 6, 3]),
            IMAGES,
        ),
        ("vgg16_tiny", vgg(false), IMAGES),
        ("vgg16_bn_tiny", vgg(true), IMAGES),
        ("mobilenet_v2_tiny", mobilenet(), IMAGES),
        (
            "vit_tiny",
            vit(),
            StepInput::Image {
                channels: 3,
                size: 16,
            },
        ),
        ("bert_tiny", bert(), tokens(false)),
        ("gpt2_tiny", gpt2(), tokens(true)),
    ]
}

/// The tiny twins of the models added for the memory-saving paper's list
/// (ResNet-101, ResNeXt-101, AlexNet, MobileNetV3, ConvNeXt, RoBERTa, a
/// Mistral-style decoder, EfficientNetV2; AlexNet needs
/// 63×63 images), kept
/// apart from [`models`] so that the suites iterating over it (and the
/// committed fingerprints) stay as they are.
pub fn paper_models() -> Vec<(&'static str, Build, StepInput)> {
    vec![
        (
            "resnet101_tiny",
            grouped_resnet([3, 4, 23, 3], 1, 64),
            IMAGES,
        ),
        (
            "resnext101_tiny",
            grouped_resnet([3, 4, 23, 3], 4, 32),
            IMAGES,
        ),
        (
            "alexnet_tiny",
            alexnet(),
            StepInput::Image {
                channels: 3,
                size: 64,
            },
        ),
        ("mobilenet_v3_tiny", mobilenet_v3(), IMAGES),
        ("convnext_tiny", convnext(), IMAGES),
        (
            "roberta_tiny",
            roberta(),
            StepInput::Tokens {
                seq: 8,
                vocab: 50,
                hidden: 16,
                next_token: false,
            },
        ),
        (
            "mistral_tiny",
            mistral(),
            StepInput::Tokens {
                seq: 8,
                vocab: 64,
                hidden: 32,
                next_token: true,
            },
        ),
        ("efficientnet_v2_tiny", efficientnet(), IMAGES),
    ]
}
