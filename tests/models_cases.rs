//! Freezing by glob and the selective-differentiation cases
//! (`leangrad::models::{Glob, Freeze, Case}`): glob matching (including
//! malformed patterns), `freeze` / `unfreeze` / `train_only` through
//! `&mut dyn Freeze`, and exactly which parameters each case trains on a
//! full-size ResNet-18 (counts computed with python-compare/export.py's
//! `trainable` on the same architecture in PyTorch).

use leangrad::models::{
    glob_match, layers_in_order, Case, Freeze, Glob, ResNet, ResNetConfig, Selection, Vgg,
    VggConfig,
};
use leangrad::nn::{LayerKind, Module};
use leangrad::{DType, Device, Error};
use std::collections::BTreeSet;

fn m(pattern: &str, name: &str) -> bool {
    glob_match(pattern, name).unwrap()
}

#[test]
fn glob_star_question_and_classes() {
    assert!(m("*", "") && m("*", "layer1.0.conv1.weight"));
    assert!(m("layer4.*", "layer4.1.bn2.bias"));
    assert!(!m("layer4.*", "layer40") && !m("layer4.*", "xlayer4.0"));
    assert!(m("*.bn?.weight", "layer1.0.bn2.weight"));
    assert!(!m("*.bn?.weight", "layer1.0.bn12.weight"));
    assert!(m("layer[12].*", "layer2.0.conv1.weight"));
    assert!(!m("layer[12].*", "layer3.0.conv1.weight"));
    assert!(m("layer[2-4].?.conv*", "layer3.1.conv2.weight"));
    assert!(!m("layer[2-4].?.conv*", "layer1.1.conv2.weight"));
    assert!(m("layer[!1].*", "layer4.0.bn1.bias") && !m("layer[!1].*", "layer1.0.bn1.bias"));
    assert!(m("[a-]x", "-x") && m("[-a]x", "ax"));
    assert!(m("fc.bias", "fc.bias") && !m("fc.bias", "fc.biasx") && !m("fc.bias", "fc.bia"));
    assert!(m("*conv*weight", "layer1.0.conv1.weight"));
    assert!(!m("*conv*weight", "layer1.0.conv1.bias"));
    assert!(m("a*a*a", "aaa") && !m("a*a*a", "aa"));
    assert!(m("?", "é") && !m("?", "") && !m("??", "a"));
    let g: Glob = "features.*.weight".parse().unwrap();
    assert_eq!(g.to_string(), "features.*.weight");
    assert!(g.matches("features.10.weight"));
}

#[test]
fn malformed_globs_are_typed_errors() {
    for bad in ["layer[12", "[", "x[]", "[!]", "[z-a]", "a]", "[a[b]]"] {
        match Glob::new(bad) {
            Err(Error::InvalidArgument { op: "Glob", msg }) => {
                assert!(msg.contains("malformed"), "{bad}: {msg}")
            }
            other => panic!("{bad}: {other:?}"),
        }
        assert!(glob_match(bad, "anything").is_err());
    }
}

fn resnet18() -> ResNet {
    ResNet::new(ResNetConfig::resnet18(1000), DType::F32, Device::Cpu, 0).unwrap()
}

/// (number of tensors, number of values) that require grad.
fn trainable(model: &dyn Module) -> (usize, usize) {
    let p = model.named_parameters();
    let on: Vec<_> = p.iter().filter(|(_, t)| t.requires_grad()).collect();
    (on.len(), on.iter().map(|(_, t)| t.numel()).sum())
}

#[test]
fn freeze_unfreeze_and_train_only_through_dyn_freeze() {
    let mut model = resnet18();
    let m: &mut dyn Freeze = &mut model;
    assert_eq!(trainable(m), (62, 11_689_512));
    m.freeze(&["layer[1-3].*", "conv1.*", "bn1.*"]).unwrap();
    // layer4 (15 tensors) and fc (2) stay: what surgical-last trains.
    assert_eq!(trainable(m), (17, 8_906_728));
    // The blocks' BatchNorms (`bn1` of the stem has no leading dot): 24
    // more in layer1-3.
    m.unfreeze(&["*.bn?.*"]).unwrap();
    assert_eq!(trainable(m).0, 41);
    m.train_only(&["fc.*"]).unwrap();
    assert_eq!(trainable(m), (2, 513_000));
    // Unknown or malformed patterns change nothing and say why.
    assert!(matches!(
        m.freeze(&["fc.*", "layer9.*"]),
        Err(Error::InvalidArgument { .. })
    ));
    assert!(m.unfreeze(&["[fc"]).is_err());
    assert_eq!(trainable(m), (2, 513_000));
    // The trait method, by predicate.
    Freeze::set_requires_grad(m, &mut |n| n.ends_with(".bias")).unwrap();
    assert_eq!(trainable(m).0, 21);
}

#[test]
fn parameter_kinds_follow_named_parameters() {
    let model = resnet18();
    let kinds = model.parameter_kinds();
    let names: Vec<String> = model
        .named_parameters()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(
        kinds.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>(),
        names
    );
    let kind = |n: &str| kinds.iter().find(|(k, _)| k == n).map(|(_, k)| *k);
    assert_eq!(kind("conv1.weight"), Some(LayerKind::Conv));
    assert_eq!(kind("layer2.0.downsample.0.weight"), Some(LayerKind::Conv));
    assert_eq!(kind("layer2.0.downsample.1.bias"), Some(LayerKind::Norm));
    assert_eq!(kind("layer4.1.bn2.weight"), Some(LayerKind::Norm));
    assert_eq!(kind("fc.weight"), Some(LayerKind::Linear));
    assert!(kinds.iter().all(|(_, k)| *k != LayerKind::Other));
    assert_eq!(layers_in_order(&names).len(), 41);
    let vgg = Vgg::new(&VggConfig::vgg16(true, 10), DType::F32, Device::Cpu, 0).unwrap();
    let vk = vgg.parameter_kinds();
    assert_eq!(vk.len(), vgg.named_parameters().len());
    let count = |k| vk.iter().filter(|(_, x)| *x == k).count();
    assert_eq!(
        (
            count(LayerKind::Conv),
            count(LayerKind::Norm),
            count(LayerKind::Linear)
        ),
        (26, 26, 6)
    );
}

/// Tensors and values each case trains on torchvision's ResNet-18 (62
/// parameter tensors in 41 layers; a quarter is 11 layers).
#[test]
fn each_case_selects_the_expected_parameters_of_resnet18() {
    let expected: [(&str, usize, usize); 7] = [
        ("all", 62, 11_689_512),
        ("input", 0, 0),
        ("norm", 40, 9_600),
        ("conv", 20, 11_166_912),
        ("linear", 2, 513_000),
        ("surgical-first", 16, 231_232),
        ("surgical-last", 17, 8_906_728),
    ];
    let mut model = resnet18();
    for (base, tensors, values) in expected {
        for suffix in ["", "-bn-eval"] {
            let case: Case = format!("{base}{suffix}").parse().unwrap();
            case.apply(&mut model).unwrap();
            assert_eq!(trainable(&model), (tensors, values), "{case}");
            assert_eq!(case.input_requires_grad(), base == "input", "{case}");
            assert_eq!(case.training(), suffix.is_empty());
        }
    }
    let first: BTreeSet<String> = Case {
        selection: Selection::SurgicalFirst,
        bn_eval: false,
    }
    .trainable(&model.parameter_kinds());
    assert!(first.contains("conv1.weight") && first.contains("layer2.0.conv1.weight"));
    assert!(!first.contains("layer2.0.bn1.weight"));
    let last = Case {
        selection: Selection::SurgicalLast,
        bn_eval: true,
    }
    .trainable(&model.parameter_kinds());
    assert!(last.contains("fc.bias") && last.contains("layer4.0.conv1.weight"));
    assert!(!last.contains("layer3.1.bn2.bias"));
}

#[test]
fn cases_that_select_nothing_freeze_everything() {
    let cfg = VggConfig {
        plan: vec![2, 0, 4, 0],
        batch_norm: false,
        in_channels: 1,
        pool_size: 1,
        hidden: 4,
        num_classes: 3,
        dropout: 0.0,
    };
    let mut vgg = Vgg::new(&cfg, DType::F32, Device::Cpu, 0).unwrap();
    let norm: Case = "norm".parse().unwrap();
    assert!(norm.trainable(&vgg.parameter_kinds()).is_empty());
    norm.apply(&mut vgg).unwrap();
    assert_eq!(trainable(&vgg), (0, 0));
    assert!("surgical".parse::<Case>().is_err());
    assert_eq!(Case::all_names().len(), 14);
    assert_eq!(
        Case::all()
            .iter()
            .map(|c| c.to_string())
            .collect::<Vec<_>>(),
        Case::all_names()
    );
}
