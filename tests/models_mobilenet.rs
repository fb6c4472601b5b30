//! A tiny MobileNetV2-style model (depthwise convolutions, residual and
//! non-residual inverted blocks, a t = 1 block) against PyTorch (fixtures
//! written by `python-compare/export.py`, reference in f64): the harness of
//! `tests/common/models.rs` for every case, the lean policy against
//! SaveAll, and torchvision's `features.N.conv.M` names.

mod common;

use common::models::{check_model, check_policies, fixture, CPU};
use leangrad::models::{InvertedResidualSetting, MobileNetV2, MobileNetV2Config};
use leangrad::DType;
use std::collections::BTreeSet;

const NAME: &str = "mobilenet_v2_tiny";

fn config() -> MobileNetV2Config {
    let rows = [(1, 2, 1, 1), (6, 3, 2, 2), (6, 4, 2, 2)];
    MobileNetV2Config {
        stem: 4,
        settings: rows
            .iter()
            .map(|&(t, c, n, s)| InvertedResidualSetting { t, c, n, s })
            .collect(),
        last_channel: 16,
        num_classes: 5,
        in_channels: 3,
        dropout: 0.0,
    }
}

fn make(d: DType) -> MobileNetV2 {
    MobileNetV2::new(&config(), d, CPU, 1).unwrap()
}

#[test]
fn tiny_mobilenet_v2_matches_pytorch_f32() {
    check_model(&make, NAME, DType::F32, 1e-4);
}

#[test]
fn tiny_mobilenet_v2_matches_pytorch_f64() {
    check_model(&make, NAME, DType::F64, 1e-5);
}

#[test]
fn lean_policy_saves_less_with_bit_identical_gradients() {
    check_policies(&make, NAME);
}

#[test]
fn names_are_torchvision_state_dict_names() {
    let model = make(DType::F32);
    let ours: BTreeSet<String> = leangrad::io::state_dict(&model, "")
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    let theirs: BTreeSet<String> = fixture(&format!("{NAME}.safetensors"))
        .into_keys()
        .collect();
    assert_eq!(ours, theirs);
    for n in [
        "features.0.0.weight",
        "features.1.conv.0.0.weight",
        "features.2.conv.1.0.weight",
        "features.2.conv.3.running_var",
        "classifier.1.bias",
    ] {
        assert!(ours.contains(n), "{n}");
    }
    assert_eq!(MobileNetV2Config::v2(1000).settings.len(), 7);
}

/// Every `features.N` block a checkpointed segment: the same fixtures hold
/// in every case.
#[test]
fn checkpointed_tiny_mobilenet_v2_matches_pytorch() {
    let make = |d: DType| {
        let mut m = make(d);
        m.gradient_checkpointing(true);
        assert!(m.is_gradient_checkpointing());
        m
    };
    check_model(&make, NAME, DType::F32, 1e-4);
}
