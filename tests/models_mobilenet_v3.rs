//! MobileNetV3 against PyTorch: a tiny MobileNetV3 (torchvision's own
//! `MobileNetV3` class with four short bneck rows: a block without
//! expansion, squeeze-and-excitation with ReLU and with Hardswish, kernels
//! 3 and 5, residual and strided blocks; fixtures written by
//! `python-compare/export.py`, reference in f64) through the harness of
//! `tests/common/models.rs` for every case, the lean policy against
//! SaveAll; the full-size MobileNetV3-Large against torchvision's own
//! (`tests/fixtures/models/torchvision_models.json`): state-dict names and
//! shapes in order, the parameter count (5,483,032) and what each case
//! trains; and the model's feature maps, head, width multipliers and errors.

mod common;

use common::models::{
    check_cases_against, check_model, check_policies, fixture, meaningful_cases, ours,
    same_state_dict, torchvision, CPU,
};
use leangrad::models::{
    make_divisible, BneckSetting, FeatureMaps, Freeze, MobileNetV3, MobileNetV3Config, ReplaceHead,
};
use leangrad::nn::Module;
use leangrad::{DType, Device, Error, Tensor};
use std::collections::BTreeSet;

const NAME: &str = "mobilenet_v3_tiny";

/// The rows of the fixture (export.py `--bneck`).
fn config() -> MobileNetV3Config {
    let rows = [
        (8, 3, 8, 8, false, false, 1),
        (8, 3, 16, 8, true, false, 2),
        (8, 5, 16, 8, true, true, 1),
        (8, 3, 24, 16, false, true, 2),
    ];
    MobileNetV3Config {
        in_channels: 3,
        settings: rows
            .iter()
            .map(|&row| BneckSetting::from_row(row))
            .collect(),
        width_mult: 1.0,
        last_channel: 16,
        num_classes: 5,
        dropout: 0.0,
    }
}

fn make(d: DType) -> MobileNetV3 {
    MobileNetV3::new(&config(), d, CPU, 1).unwrap()
}

#[test]
fn fourteen_cases_train_something() {
    assert_eq!(meaningful_cases(&make(DType::F32)).len(), 14);
}

#[test]
fn tiny_mobilenet_v3_matches_pytorch_f32() {
    let worst = check_model(&make, NAME, DType::F32, 1e-4);
    assert!(worst < 1e-4);
}

#[test]
fn tiny_mobilenet_v3_matches_pytorch_f64() {
    let worst = check_model(&make, NAME, DType::F64, 1e-5);
    assert!(worst < 1e-5);
}

#[test]
fn lean_policy_saves_less_with_bit_identical_gradients() {
    check_policies(&make, NAME);
}

/// Every `features.N` block a checkpointed segment: the same fixtures hold
/// in every case.
#[test]
fn checkpointed_tiny_mobilenet_v3_matches_pytorch() {
    let make = |d: DType| {
        let mut m = make(d);
        m.gradient_checkpointing(true);
        assert!(m.is_gradient_checkpointing());
        m
    };
    check_model(&make, NAME, DType::F32, 1e-4);
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
        "features.0.1.running_var",
        "features.1.block.0.0.weight",
        "features.1.block.1.1.bias",
        "features.2.block.2.fc1.weight",
        "features.2.block.2.fc2.bias",
        "features.3.block.3.0.weight",
        "features.5.1.num_batches_tracked",
        "classifier.0.weight",
        "classifier.3.bias",
    ] {
        assert!(ours.contains(n), "{n}");
    }
}

/// Full size: torchvision's state dict (names and shapes in order), its
/// 5,483,032 parameters, and each case training what it trains on
/// torchvision's MobileNetV3-Large.
#[test]
fn full_size_mobilenet_v3_large_is_torchvisions() {
    let config = MobileNetV3Config::mobilenet_v3_large(1000);
    let mut model = MobileNetV3::new(&config, DType::F32, Device::Meta, 0).unwrap();
    let want = torchvision("mobilenet_v3_large");
    same_state_dict(&model, &want, "mobilenet_v3_large");
    let (sd, n) = ours(&model);
    assert_eq!(n, 5_483_032);
    assert_eq!(model.named_parameters().len(), 174);
    let shape = |name: &str| sd.iter().find(|(n, _)| n == name).unwrap().1.clone();
    assert_eq!(shape("classifier.0.weight"), [1280, 960]);
    assert_eq!(shape("features.16.0.weight"), [960, 160, 1, 1]);
    assert_eq!(shape("features.4.block.2.fc1.weight"), [24, 72, 1, 1]);
    assert_eq!(shape("features.13.block.1.0.weight"), [672, 1, 5, 5]);
    check_cases_against(&mut model, &want, "mobilenet_v3_large");
}

/// torchvision's `mobilenet_v3_large(width_mult=w, num_classes=10)`
/// parameter counts (torchvision 0.29).
#[test]
fn width_multipliers_count_as_torchvision() {
    for (w, count, last) in [
        (1.0, 4_214_842, 1280),
        (0.75, 2_426_186, 960),
        (0.5, 1_099_986, 640),
        (0.35, 552_554, 448),
    ] {
        let config = MobileNetV3Config::mobilenet_v3_large_width(10, w);
        assert_eq!(config.last_channel, last, "{w}");
        let model = MobileNetV3::new(&config, DType::F32, Device::Meta, 0).unwrap();
        assert_eq!(ours(&model).1, count, "{w}");
        assert_eq!(leangrad::io::state_dict(&model, "").len(), 312, "{w}");
    }
}

/// torchvision's `_make_divisible(v, 8)`.
#[test]
fn make_divisible_is_torchvisions() {
    let got: Vec<usize> = [
        3.5,
        12.0,
        16.0 * 0.35,
        1280.0 * 0.35,
        960.0 * 0.75,
        4.0,
        0.1,
        27.9,
    ]
    .iter()
    .map(|&v| make_divisible(v, 8))
    .collect();
    assert_eq!(got, [8, 16, 8, 448, 720, 8, 8, 32]);
}

/// torchvision's `create_feature_extractor` names, and the shapes of a
/// 224×224 image's maps (on the meta device).
#[test]
fn feature_maps_by_torchvision_layer_name() {
    let config = MobileNetV3Config::mobilenet_v3_large(10);
    let model = MobileNetV3::new(&config, DType::F32, Device::Meta, 0).unwrap();
    let names = model.feature_names();
    assert_eq!(names.len(), 17 + 2 + 4);
    assert_eq!(names[16], "features.16");
    assert_eq!(names[17..19], ["avgpool", "flatten"]);
    assert_eq!(names[22], "classifier.3");
    let x = Tensor::zeros(&[2, 3, 224, 224], DType::F32, Device::Meta).unwrap();
    let maps = model
        .features(
            &x,
            &[
                "features.0",
                "features.3",
                "features.6",
                "features.12",
                "features.15",
                "features.16",
                "avgpool",
                "flatten",
                "classifier.1",
                "classifier.3",
            ],
        )
        .unwrap();
    let shapes: Vec<&[usize]> = maps.iter().map(|(_, t)| t.shape()).collect();
    assert_eq!(
        shapes,
        [
            &[2, 16, 112, 112][..],
            &[2, 24, 56, 56],
            &[2, 40, 28, 28],
            &[2, 112, 14, 14],
            &[2, 160, 7, 7],
            &[2, 960, 7, 7],
            &[2, 960, 1, 1],
            &[2, 960],
            &[2, 1280],
            &[2, 10],
        ]
    );
    assert!(matches!(
        model.features(&x, &["features.17"]),
        Err(Error::UnknownLayer { .. })
    ));
}

/// A new `classifier.3`; the rest of the model is kept.
#[test]
fn replace_head_keeps_the_backbone() {
    let mut model = make(DType::F32);
    assert_eq!(model.head_name(), "classifier.3");
    assert_eq!(model.num_classes(), 5);
    let before = model.named_parameters();
    model.replace_head(7, 3).unwrap();
    assert_eq!(model.num_classes(), 7);
    let after = model.named_parameters();
    assert_eq!(before.len(), after.len());
    for ((n, a), (m, b)) in before.iter().zip(&after) {
        assert_eq!(n, m);
        if !n.starts_with("classifier.3") {
            assert_eq!(a.to_f64_vec().unwrap(), b.to_f64_vec().unwrap(), "{n}");
        }
    }
    let x = Tensor::randn(&[1, 3, 32, 32], DType::F32, CPU, 0).unwrap();
    assert_eq!(model.forward(&x).unwrap().shape(), [1, 7]);
}

/// Freezing by glob: only the squeeze-and-excitation layers train.
#[test]
fn freeze_by_glob_trains_only_the_squeeze_excitation() {
    let mut model = make(DType::F32);
    model.train_only(&["*.fc1.*", "*.fc2.*"]).unwrap();
    let on: Vec<String> = model
        .named_parameters()
        .into_iter()
        .filter(|(_, t)| t.requires_grad())
        .map(|(n, _)| n)
        .collect();
    assert_eq!(
        on,
        [
            "features.2.block.2.fc1.weight",
            "features.2.block.2.fc1.bias",
            "features.2.block.2.fc2.weight",
            "features.2.block.2.fc2.bias",
            "features.3.block.2.fc1.weight",
            "features.3.block.2.fc1.bias",
            "features.3.block.2.fc2.weight",
            "features.3.block.2.fc2.bias",
        ]
    );
    model.freeze(&["features.2.*"]).unwrap();
    let on = model
        .named_parameters()
        .into_iter()
        .filter(|(_, t)| t.requires_grad())
        .count();
    assert_eq!(on, 4);
}

/// Bad configurations are typed errors, never panics.
#[test]
fn bad_configs_are_invalid_arguments() {
    let bad = |f: &dyn Fn(&mut MobileNetV3Config)| {
        let mut c = config();
        f(&mut c);
        match MobileNetV3::new(&c, DType::F32, CPU, 0) {
            Err(Error::InvalidArgument { op, .. }) => assert_eq!(op, "MobileNetV3"),
            Err(e) => panic!("{c:?}: {e}"),
            Ok(_) => panic!("{c:?}: accepted"),
        }
    };
    bad(&|c| c.settings.clear());
    bad(&|c| c.settings[1].stride = 3);
    bad(&|c| c.settings[1].stride = 0);
    bad(&|c| c.settings[2].kernel = 0);
    bad(&|c| c.settings[2].expanded = 0);
    bad(&|c| c.settings[3].input = 24);
    bad(&|c| c.width_mult = 0.0);
    bad(&|c| c.width_mult = f64::NAN);
    bad(&|c| c.width_mult = -1.0);
    bad(&|c| c.num_classes = 0);
    bad(&|c| c.last_channel = 0);
    bad(&|c| c.in_channels = 0);
    bad(&|c| c.dropout = 1.5);
    let c = MobileNetV3Config::mobilenet_v3_large_width(10, f64::INFINITY);
    assert!(matches!(
        MobileNetV3::new(&c, DType::F32, Device::Meta, 0),
        Err(Error::InvalidArgument { .. })
    ));
}

/// Registered as `mobilenet_v3_large` for the jobs (`leangrad finetune`)
/// and `leangrad memory`, full size, head `classifier.3`.
#[test]
fn registered_as_mobilenet_v3_large() {
    assert!(leangrad::jobs::CLASSIFIERS.contains(&"mobilenet_v3_large"));
    let m = leangrad::jobs::build_classifier("mobilenet_v3_large", 10, Device::Meta).unwrap();
    assert_eq!(m.head_name(), "classifier.3");
    assert_eq!(m.num_classes(), 10);
    let entry = leangrad::memory_plan::find_model("mobilenet_v3_large").unwrap();
    let mut m = (entry.build)(1000, 224, DType::F32, Device::Meta).unwrap();
    let count: usize = m.parameters().iter().map(|t| t.numel()).sum();
    assert_eq!(count, 5_483_032);
    m.set_gradient_checkpointing(true).unwrap();
}
