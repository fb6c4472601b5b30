//! Whole models on every device: one training step of every tiny model of
//! the model tests (CNNs and transformers) on CUDA moves the ledger exactly
//! as on the CPU — peak and live bytes by category, the parameter-gradient
//! peak and saved bytes by layer, byte for byte — for the main cases, both
//! save policies, usual and fused SGD-momentum and AdamW. Without a GPU
//! only the CPU runs and the CUDA half prints `skipped`.

mod cuda_common;

use leangrad::autograd::SavePolicy;
use leangrad::memory_plan::{run_step, OptimizerKind, StepInput, StepModel, StepSpec};
use leangrad::models::{
    BertClassifier, BertConfig, BlockKind, Case, Gpt2, Gpt2Config, InvertedResidualSetting,
    MobileNetV2, MobileNetV2Config, ResNet, ResNetConfig, Vgg, VggConfig, ViTClassifier, ViTConfig,
};
use leangrad::{DType, Device, Result};

type Build = Box<dyn Fn(DType, Device) -> Result<Box<dyn StepModel>>>;

fn resnet(block: BlockKind, layers: [usize; 4]) -> Build {
    Box::new(move |d, dev| {
        let c = ResNetConfig {
            block,
            layers,
            base_width: 2,
            num_classes: 5,
            in_channels: 3,
        };
        Ok(Box::new(ResNet::new(c, d, dev, 1)?) as Box<dyn StepModel>)
    })
}

fn vgg(batch_norm: bool) -> Build {
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

fn mobilenet() -> Build {
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
fn vit() -> Build {
    Box::new(|d, dev| {
        Ok(Box::new(ViTClassifier::new(ViTConfig::tiny(), 5, d, dev, 1)?) as Box<dyn StepModel>)
    })
}

/// The tiny BERT of the transformer tests with a 5-way classifier.
fn bert() -> Build {
    Box::new(|d, dev| {
        Ok(Box::new(BertClassifier::new(BertConfig::tiny(), 5, d, dev, 1)?) as Box<dyn StepModel>)
    })
}

/// The tiny GPT-2 of the transformer tests (next-token loss).
fn gpt2() -> Build {
    Box::new(|d, dev| Ok(Box::new(Gpt2::new(Gpt2Config::tiny(), d, dev, 1)?) as Box<dyn StepModel>))
}

const IMAGES: StepInput = StepInput::Image {
    channels: 3,
    size: 32,
};

/// The tiny models with their step input.
fn models() -> Vec<(&'static str, Build, StepInput)> {
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

fn check_model(index: usize) {
    let (name, build, input) = models().swap_remove(index);
    let devices = cuda_common::devices(name);
    let cases = ["all", "input", "input-bn-eval", "surgical-last"];
    for case in cases.iter().map(|c| c.parse::<Case>().unwrap()) {
        for policy in [SavePolicy::Lean, SavePolicy::SaveAll] {
            for (optimizer, fused) in [(OptimizerKind::Sgd, true), (OptimizerKind::Adamw, false)] {
                for dtype in [DType::F32, DType::BF16] {
                    let spec = |device| StepSpec {
                        batch: 2,
                        input,
                        classes: 5,
                        dtype,
                        optimizer,
                        fused,
                        case,
                        device,
                    };
                    let what =
                        format!("{name} {case} {policy:?} {optimizer:?} fused={fused} {dtype:?}");
                    let cpu = run_step(build.as_ref(), &spec(Device::Cpu), policy)
                        .unwrap_or_else(|e| panic!("{what} cpu: {e}"));
                    for &dev in devices.iter().filter(|d| **d != Device::Cpu) {
                        let got = run_step(build.as_ref(), &spec(dev), policy)
                            .unwrap_or_else(|e| panic!("{what} {dev}: {e}"));
                        let (mut c, g) = (cpu.report.clone(), got.report);
                        assert_eq!(g.device, dev.to_string());
                        c.device = g.device.clone();
                        assert_eq!(c.peak, g.peak, "{what}: peak by category on {dev}");
                        assert_eq!(
                            c.saved_by_layer, g.saved_by_layer,
                            "{what}: saved by layer on {dev}"
                        );
                        assert_eq!(c, g, "{what}: whole report on {dev}");
                    }
                    assert!(cpu.report.peak_total > 0, "{what}");
                }
            }
        }
    }
}

#[test]
fn resnet18_tiny_ledger_matches_on_every_device() {
    check_model(0);
}

#[test]
fn resnet50_tiny_ledger_matches_on_every_device() {
    check_model(1);
}

#[test]
fn vgg16_bn_tiny_ledger_matches_on_every_device() {
    check_model(3);
}

#[test]
fn mobilenet_v2_tiny_ledger_matches_on_every_device() {
    check_model(4);
}

#[test]
fn transformers_tiny_ledger_match_on_every_device() {
    check_model(7);
    check_model(6);
    check_model(5);
}
