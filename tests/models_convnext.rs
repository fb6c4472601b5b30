//! ConvNeXt against PyTorch: a tiny ConvNeXt (torchvision's own `ConvNeXt`
//! class with three short stages: the stem, a one-block stage, a
//! downsampling, a two-block stage, another downsampling, a last stage;
//! random LayerNorm affine parameters and layer scales; fixtures written by
//! `python-compare/export.py --arch convnext`, reference in f64) through
//! the harness of `tests/common/models.rs` for the seven training-mode
//! cases (without BatchNorm the `-bn-eval` ones repeat them), the lean
//! policy against SaveAll, checkpointed; the full-size ConvNeXt-Tiny and
//! -Base against torchvision's own (`torchvision_models.json`): state-dict
//! names and shapes in order, parameter counts and what each case trains;
//! stochastic depth; feature maps, head, freezing, errors, registration.

mod common;

use common::models::{
    check_cases_against, check_feature_shapes, check_fixture_names, check_model_cases,
    check_policies_cases, check_replace_head, ours, same_state_dict, torchvision, CPU,
};
use leangrad::autograd::backward_with;
use leangrad::models::{Case, ConvNeXt, ConvNeXtConfig, ConvNeXtStage, FeatureMaps, Freeze};
use leangrad::nn::Module;
use leangrad::{DType, Device, Error, Tensor};

const NAME: &str = "convnext_tiny";

/// The rows of the fixture (export.py `--stages 8 16 1 16 24 2 24 0 1`).
fn config() -> ConvNeXtConfig {
    ConvNeXtConfig {
        in_channels: 3,
        stages: vec![
            ConvNeXtStage::new(8, Some(16), 1),
            ConvNeXtStage::new(16, Some(24), 2),
            ConvNeXtStage::new(24, None, 1),
        ],
        stochastic_depth_prob: 0.0,
        layer_scale: 1e-6,
        num_classes: 5,
    }
}

fn make(d: DType) -> ConvNeXt {
    ConvNeXt::new(&config(), d, CPU, 1).unwrap()
}

/// The seven training-mode cases: all, input, norm, conv, linear,
/// surgical-first, surgical-last.
fn cases() -> Vec<Case> {
    Case::all().into_iter().filter(|c| !c.bn_eval).collect()
}

#[test]
fn tiny_convnext_matches_pytorch_f32() {
    let worst = check_model_cases(&make, NAME, DType::F32, 1e-4, &cases());
    assert!(worst < 1e-4);
}

#[test]
fn tiny_convnext_matches_pytorch_f64() {
    let worst = check_model_cases(&make, NAME, DType::F64, 1e-5, &cases());
    assert!(worst < 1e-5);
}

#[test]
fn lean_policy_saves_less_with_bit_identical_gradients() {
    check_policies_cases(&make, NAME, &cases());
}

/// Every block a checkpointed segment: the same fixtures hold.
#[test]
fn checkpointed_tiny_convnext_matches_pytorch() {
    let make = |d: DType| {
        let mut m = make(d);
        m.gradient_checkpointing(true);
        assert!(m.is_gradient_checkpointing());
        m
    };
    check_model_cases(&make, NAME, DType::F32, 1e-4, &cases());
}

#[test]
fn names_are_torchvision_state_dict_names() {
    let samples = [
        "features.0.0.weight",
        "features.0.1.bias",
        "features.1.0.layer_scale",
        "features.1.0.block.0.weight",
        "features.1.0.block.2.weight",
        "features.1.0.block.3.weight",
        "features.1.0.block.5.bias",
        "features.2.0.weight",
        "features.2.1.weight",
        "features.3.1.layer_scale",
        "classifier.0.weight",
        "classifier.2.bias",
    ];
    check_fixture_names(&make(DType::F32), NAME, &samples);
}

/// Full size: torchvision's state dicts (names and shapes in order), their
/// parameter counts (28,589,128 and 88,591,464) and each case training
/// what it trains on torchvision's ConvNeXt-Tiny and -Base.
#[test]
fn full_size_convnexts_are_torchvisions() {
    for (name, config, count, tensors) in [
        (
            "convnext_tiny",
            ConvNeXtConfig::convnext_tiny(1000),
            28_589_128,
            182,
        ),
        (
            "convnext_base",
            ConvNeXtConfig::convnext_base(1000),
            88_591_464,
            344,
        ),
    ] {
        let mut model = ConvNeXt::new(&config, DType::F32, Device::Meta, 0).unwrap();
        let want = torchvision(name);
        same_state_dict(&model, &want, name);
        let (sd, n) = ours(&model);
        assert_eq!((n, sd.len()), (count, tensors), "{name}");
        check_cases_against(&mut model, &want, name);
    }
    let base = ConvNeXt::new(
        &ConvNeXtConfig::convnext_base(1000),
        DType::F32,
        Device::Meta,
        0,
    )
    .unwrap();
    let (sd, _) = ours(&base);
    let shape = |name: &str| sd.iter().find(|(n, _)| n == name).unwrap().1.clone();
    assert_eq!(shape("features.0.0.weight"), [128, 3, 4, 4]);
    assert_eq!(shape("features.5.26.block.0.weight"), [512, 1, 7, 7]);
    assert_eq!(shape("features.5.26.layer_scale"), [512, 1, 1]);
    assert_eq!(shape("features.6.1.weight"), [1024, 512, 2, 2]);
    assert_eq!(shape("classifier.2.weight"), [1000, 1024]);
    // Small and large count as torchvision's (torchvision 0.29).
    for (config, count) in [
        (ConvNeXtConfig::convnext_small(1000), 50_223_688),
        (ConvNeXtConfig::convnext_large(1000), 197_767_336),
    ] {
        let model = ConvNeXt::new(&config, DType::F32, Device::Meta, 0).unwrap();
        assert_eq!(ours(&model).1, count);
    }
}

/// Stochastic depth: in training mode with `p > 0` a block's branch is
/// dropped or kept per sample (the output of a batch of one image repeated
/// differs between samples), evaluation mode ignores it, and gradients
/// flow through the kept samples only.
#[test]
fn stochastic_depth_drops_branches_per_sample_in_training_only() {
    let mut cfg = config();
    cfg.stochastic_depth_prob = 0.9;
    cfg.layer_scale = 1.0;
    let mut model = ConvNeXt::new(&cfg, DType::F64, CPU, 3).unwrap();
    let one = Tensor::randn(&[1, 3, 32, 32], DType::F64, CPU, 5).unwrap();
    let x = one
        .broadcast_to(&[16, 3, 32, 32])
        .unwrap()
        .contiguous()
        .unwrap();
    let rows = |t: &Tensor| -> Vec<Vec<f64>> {
        let v = t.to_f64_vec().unwrap();
        v.chunks(5).map(<[f64]>::to_vec).collect()
    };
    // Rows equal up to the rounding of where a sample sits in the batch.
    let same = |a: &[f64], b: &[f64]| a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-9);
    let train = rows(&model.forward(&x).unwrap());
    assert!(
        train.iter().any(|r| !same(r, &train[0])),
        "every sample took the same branches"
    );
    model.set_training(false);
    let eval = rows(&model.forward(&x).unwrap());
    assert!(
        eval.iter().all(|r| same(r, &eval[0])),
        "eval mode is random"
    );
    let plain = ConvNeXt::new(
        &ConvNeXtConfig {
            stochastic_depth_prob: 0.0,
            ..cfg.clone()
        },
        DType::F64,
        CPU,
        3,
    )
    .unwrap();
    assert_eq!(rows(&plain.forward(&x).unwrap()), eval);
    // Training mode, gradients: a repeated forward with the same draws is
    // what the checkpointed model replays; here the gradient just exists
    // and is finite for every parameter.
    model.set_training(true);
    let y = model.forward(&x).unwrap();
    let probe = Tensor::ones(y.shape(), DType::F64, CPU).unwrap();
    backward_with(&y, Some(probe), &mut leangrad::autograd::CollectGrads).unwrap();
    for (n, p) in model.named_parameters() {
        let g = p.grad().unwrap_or_else(|| panic!("{n}: no gradient"));
        assert!(g.to_f64_vec().unwrap().iter().all(|v| v.is_finite()), "{n}");
    }
}

/// torchvision's `create_feature_extractor` names and the shapes of a
/// 224×224 image's maps (meta device).
#[test]
fn feature_maps_by_torchvision_layer_name() {
    let config = ConvNeXtConfig::convnext_base(10);
    let model = ConvNeXt::new(&config, DType::F32, Device::Meta, 0).unwrap();
    let names = model.feature_names();
    assert_eq!(names.len(), 8 + 4);
    assert_eq!(names[7], "features.7");
    assert_eq!(
        names[8..],
        ["avgpool", "classifier.0", "classifier.1", "classifier.2"]
    );
    let x = Tensor::zeros(&[2, 3, 224, 224], DType::F32, Device::Meta).unwrap();
    let maps: [(&str, &[usize]); 9] = [
        ("features.0", &[2, 128, 56, 56]),
        ("features.1", &[2, 128, 56, 56]),
        ("features.2", &[2, 256, 28, 28]),
        ("features.5", &[2, 512, 14, 14]),
        ("features.7", &[2, 1024, 7, 7]),
        ("avgpool", &[2, 1024, 1, 1]),
        ("classifier.0", &[2, 1024, 1, 1]),
        ("classifier.1", &[2, 1024]),
        ("classifier.2", &[2, 10]),
    ];
    check_feature_shapes(&model, &x, &maps, "features.8");
}

/// A new `classifier.2`; the rest of the model is kept.
#[test]
fn replace_head_keeps_the_backbone() {
    let x = Tensor::randn(&[1, 3, 32, 32], DType::F32, CPU, 0).unwrap();
    check_replace_head(&mut make(DType::F32), "classifier.2", 5, &x);
}

/// Freezing by glob: only the layer scales and the last stage train.
#[test]
fn freeze_by_glob_trains_the_layer_scales() {
    let mut model = make(DType::F32);
    model.train_only(&["*.layer_scale"]).unwrap();
    let on: Vec<String> = model
        .named_parameters()
        .into_iter()
        .filter(|(_, t)| t.requires_grad())
        .map(|(n, _)| n)
        .collect();
    assert_eq!(
        on,
        [
            "features.1.0.layer_scale",
            "features.3.0.layer_scale",
            "features.3.1.layer_scale",
            "features.5.0.layer_scale",
        ]
    );
    model.freeze(&["features.3.*"]).unwrap();
    let on = model
        .named_parameters()
        .into_iter()
        .filter(|(_, t)| t.requires_grad())
        .count();
    assert_eq!(on, 2);
}

/// Bad configurations are typed errors, never panics.
#[test]
fn bad_configs_are_invalid_arguments() {
    let bad = |f: &dyn Fn(&mut ConvNeXtConfig)| {
        let mut c = config();
        f(&mut c);
        match ConvNeXt::new(&c, DType::F32, CPU, 0) {
            Err(Error::InvalidArgument { op, .. }) => assert_eq!(op, "ConvNeXt"),
            Err(e) => panic!("{c:?}: {e}"),
            Ok(_) => panic!("{c:?}: accepted"),
        }
    };
    bad(&|c| c.stages.clear());
    bad(&|c| c.stages[0].channels = 0);
    bad(&|c| c.stages[0].out_channels = Some(0));
    bad(&|c| c.stages[1].channels = 12);
    bad(&|c| c.stages[0].out_channels = None);
    bad(&|c| c.stochastic_depth_prob = 1.5);
    bad(&|c| c.stochastic_depth_prob = f64::NAN);
    bad(&|c| c.layer_scale = f64::INFINITY);
    bad(&|c| c.num_classes = 0);
    bad(&|c| c.in_channels = 0);
    bad(&|c| c.stages.iter_mut().for_each(|s| s.layers = 0));
}

/// Registered for `leangrad memory` as `convnext_tiny` … `convnext_large`,
/// full size, with per-block checkpointing.
#[test]
fn registered_for_memory_planning() {
    for (name, count) in [("convnext_tiny", 28_589_128), ("convnext_base", 88_591_464)] {
        let entry = leangrad::memory_plan::find_model(name).unwrap();
        let mut m = (entry.build)(1000, 224, DType::F32, Device::Meta).unwrap();
        let n: usize = m.parameters().iter().map(|t| t.numel()).sum();
        assert_eq!(n, count, "{name}");
        m.set_gradient_checkpointing(true).unwrap();
    }
}
