//! Tiny VGG-16-style models (with and without BatchNorm) against PyTorch
//! (fixtures written by `python-compare/export.py`, reference in f64): the
//! harness of `tests/common/models.rs` for every case (no `norm` case
//! without BatchNorm), the lean policy against SaveAll, and torchvision's
//! `features.N` / `classifier.N` names.

mod common;

use common::models::{check_model, check_policies, fixture, TestModel, CPU};
use leangrad::models::{Vgg, VggConfig};
use leangrad::DType;
use std::collections::BTreeSet;

const CASES: [&str; 5] = ["all", "input", "input-bn-eval", "norm", "surgical-last"];
const NO_BN_CASES: [&str; 4] = ["all", "input", "input-bn-eval", "surgical-last"];

impl TestModel for Vgg {
    fn freeze(&mut self, want: &dyn Fn(&str) -> bool) {
        self.set_requires_grad(want).unwrap();
    }
}

fn config(batch_norm: bool) -> VggConfig {
    VggConfig {
        plan: vec![1, 1, 0, 2, 2, 0, 2, 2, 2, 0, 4, 4, 4, 0, 4, 4, 4, 0],
        batch_norm,
        in_channels: 1,
        pool_size: 1,
        hidden: 8,
        num_classes: 5,
        dropout: 0.0,
    }
}

/// BatchNorm layers: those with running means in the BN fixture.
fn is_bn(layer: &str) -> bool {
    fixture("vgg16_bn_tiny.safetensors").contains_key(&format!("{layer}.running_mean"))
}

fn check(bn: bool, dtype: DType, tol: f64) {
    let make = |d: DType| Vgg::new(&config(bn), d, CPU, 1).unwrap();
    let (name, cases): (&str, &[&str]) = if bn {
        ("vgg16_bn_tiny", &CASES)
    } else {
        ("vgg16_tiny", &NO_BN_CASES)
    };
    check_model(&make, is_bn, name, cases, dtype, tol);
}

#[test]
fn tiny_vgg16_matches_pytorch_f32() {
    check(false, DType::F32, 1e-4);
}

#[test]
fn tiny_vgg16_matches_pytorch_f64() {
    check(false, DType::F64, 1e-5);
}

#[test]
fn tiny_vgg16_bn_matches_pytorch_f32() {
    check(true, DType::F32, 1e-4);
}

#[test]
fn tiny_vgg16_bn_matches_pytorch_f64() {
    check(true, DType::F64, 1e-5);
}

#[test]
fn lean_policy_saves_less_with_bit_identical_gradients() {
    let make = |d: DType| Vgg::new(&config(false), d, CPU, 1).unwrap();
    check_policies(&make, is_bn, "vgg16_tiny", &NO_BN_CASES);
    let make = |d: DType| Vgg::new(&config(true), d, CPU, 1).unwrap();
    check_policies(&make, is_bn, "vgg16_bn_tiny", &CASES);
}

#[test]
fn names_are_torchvision_state_dict_names() {
    for (bn, file) in [(false, "vgg16_tiny"), (true, "vgg16_bn_tiny")] {
        let model = Vgg::new(&config(bn), DType::F32, CPU, 0).unwrap();
        let ours: BTreeSet<String> = leangrad::io::state_dict(&model, "")
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        let theirs: BTreeSet<String> = fixture(&format!("{file}.safetensors"))
            .into_keys()
            .collect();
        assert_eq!(ours, theirs);
        assert!(ours.contains("classifier.6.bias") && ours.contains("features.0.weight"));
    }
    assert!(VggConfig::vgg16(true, 1000).plan.len() == 18);
}
