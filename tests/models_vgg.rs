//! Tiny VGG-16-style models (with and without BatchNorm) against PyTorch
//! (fixtures written by `python-compare/export.py`, reference in f64): the
//! harness of `tests/common/models.rs` for every case (no `norm` case
//! without BatchNorm), the lean policy against SaveAll, and torchvision's
//! `features.N` / `classifier.N` names.

mod common;

use common::models::{check_model, check_policies, fixture, meaningful_cases, CPU};
use leangrad::models::{Vgg, VggConfig};
use leangrad::DType;
use std::collections::BTreeSet;

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

fn check(bn: bool, dtype: DType, tol: f64) {
    let make = |d: DType| Vgg::new(&config(bn), d, CPU, 1).unwrap();
    let name = if bn { "vgg16_bn_tiny" } else { "vgg16_tiny" };
    check_model(&make, name, dtype, tol);
}

/// Without BatchNorm the two `norm` cases train nothing and are skipped.
#[test]
fn norm_cases_only_with_batch_norm() {
    let count = |bn| meaningful_cases(&Vgg::new(&config(bn), DType::F32, CPU, 0).unwrap()).len();
    assert_eq!((count(false), count(true)), (12, 14));
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
    check_policies(&make, "vgg16_tiny");
    let make = |d: DType| Vgg::new(&config(true), d, CPU, 1).unwrap();
    check_policies(&make, "vgg16_bn_tiny");
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
