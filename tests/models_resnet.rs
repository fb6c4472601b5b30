//! Tiny ResNet-18- and ResNet-50-style models against PyTorch (fixtures
//! written by `python-compare/export.py`, reference computed in f64):
//! strict state-dict load, output and every gradient of
//! `sum(output * probe)` for every selective-differentiation case
//! (`leangrad::models::Case`), names one-to-one; and the lean save policy
//! against SaveAll.
//!
//! Tolerances are relative to each tensor's largest magnitude: 1e-5 in f64
//! and 1e-4 in f32 (see python-compare/README.md for how the tiny
//! configurations and seeds keep the f32 problem well conditioned).

mod common;

use common::models::{check_model, check_policies, fixture, run, CPU};
use leangrad::autograd::SavePolicy;
use leangrad::models::{BlockKind, Case, ResNet, ResNetConfig};
use leangrad::DType;
use std::collections::BTreeSet;

fn config(model: &str) -> ResNetConfig {
    let (block, layers) = match model {
        "resnet18_tiny" => (BlockKind::Basic, [2, 2, 2, 2]),
        _ => (BlockKind::Bottleneck, [3, 4, 6, 3]),
    };
    ResNetConfig {
        block,
        layers,
        base_width: 2,
        num_classes: 5,
        in_channels: 1,
        zero_init_residual: false,
    }
}

fn check(model: &str, dtype: DType, tol: f64) {
    let make = |d: DType| ResNet::new(config(model), d, CPU, 1).unwrap();
    check_model(&make, model, dtype, tol);
}

#[test]
fn tiny_resnet18_matches_pytorch_in_every_case_f32() {
    check("resnet18_tiny", DType::F32, 1e-4);
}

#[test]
fn tiny_resnet18_matches_pytorch_in_every_case_f64() {
    check("resnet18_tiny", DType::F64, 1e-5);
}

#[test]
fn tiny_resnet50_matches_pytorch_in_every_case_f32() {
    check("resnet50_tiny", DType::F32, 1e-4);
}

#[test]
fn tiny_resnet50_matches_pytorch_in_every_case_f64() {
    check("resnet50_tiny", DType::F64, 1e-5);
}

#[test]
fn lean_policy_saves_less_with_bit_identical_gradients() {
    for model in ["resnet18_tiny", "resnet50_tiny"] {
        let make = |d: DType| ResNet::new(config(model), d, CPU, 1).unwrap();
        check_policies(&make, model);
    }
}

#[test]
fn ledger_reports_saved_bytes_by_torchvision_layer_name() {
    let make = |d: DType| ResNet::new(config("resnet50_tiny"), d, CPU, 1).unwrap();
    let all: Case = "all".parse().unwrap();
    let r = run(&make, "resnet50_tiny", all, SavePolicy::Lean, DType::F32);
    for l in [
        "conv1",
        "bn1",
        "relu",
        "maxpool",
        "layer1.0.conv1",
        "layer1.0.bn3",
        "layer1.0.downsample.1",
        "layer4.2.conv3",
        "fc",
    ] {
        assert!(r.layers.contains(l), "{l} not in {:?}", r.layers);
    }
}

#[test]
fn names_are_torchvision_state_dict_names() {
    let model = ResNet::new(config("resnet50_tiny"), DType::F32, CPU, 0).unwrap();
    let ours: BTreeSet<String> = leangrad::io::state_dict(&model, "")
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    let theirs: BTreeSet<String> = fixture("resnet50_tiny.safetensors").into_keys().collect();
    assert_eq!(ours, theirs);
    for n in [
        "conv1.weight",
        "bn1.num_batches_tracked",
        "layer2.0.downsample.0.weight",
        "layer4.2.bn3.running_var",
        "fc.bias",
    ] {
        assert!(ours.contains(n), "{n}");
    }
    let bad = ResNetConfig {
        base_width: 0,
        ..config("resnet18_tiny")
    };
    assert!(ResNet::new(bad, DType::F32, CPU, 0).is_err());
}

/// Full-size configurations have torchvision's parameter counts.
#[test]
fn full_size_parameter_counts_match_torchvision() {
    let count =
        |m: &dyn leangrad::nn::Module| -> usize { m.parameters().iter().map(|t| t.numel()).sum() };
    let r18 = ResNet::new(ResNetConfig::resnet18(1000), DType::F32, CPU, 0).unwrap();
    assert_eq!(count(&r18), 11_689_512);
    drop(r18);
    let r50 = ResNet::new(ResNetConfig::resnet50(1000), DType::F32, CPU, 0).unwrap();
    assert_eq!(count(&r50), 25_557_032);
    let mb = leangrad::models::MobileNetV2::new(
        &leangrad::models::MobileNetV2Config::v2(1000),
        DType::F32,
        CPU,
        0,
    )
    .unwrap();
    assert_eq!(count(&mb), 3_504_872);
}

/// Every residual block a checkpointed segment: torchvision's fixtures hold
/// in every case.
#[test]
fn checkpointed_tiny_resnets_match_pytorch_in_every_case() {
    for model in ["resnet18_tiny", "resnet50_tiny"] {
        let make = |d: DType| {
            let mut m = ResNet::new(config(model), d, CPU, 1).unwrap();
            m.gradient_checkpointing(true);
            m
        };
        check_model(&make, model, DType::F32, 1e-4);
    }
}
