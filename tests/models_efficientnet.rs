//! EfficientNetV2 against PyTorch: a tiny EfficientNet (torchvision's own
//! `EfficientNet` class with four short rows: a FusedMBConv without
//! expansion, one with expansion, MBConv with squeeze-and-excitation and
//! an MBConv without expansion; residual and strided blocks; stochastic
//! depth 0; fixtures written by `python-compare/export.py`, reference in
//! f64) through the harness of `tests/common/models.rs` for every case, the
//! lean policy against SaveAll; the full-size EfficientNetV2-S, -M and -L
//! against torchvision's own (`tests/fixtures/models/torchvision_models.json`):
//! state-dict names and shapes in order, the parameter counts and what each
//! case trains; stochastic depth (torchvision's probabilities, training
//! against evaluation mode, checkpointing); and the model's feature maps,
//! head, initialisation and errors.

mod common;

use common::models::{
    check_cases_against, check_fixture_names, check_model, check_policies, check_replace_head,
    fixture, meaningful_cases, ours, same_state_dict, torchvision, CPU,
};
use leangrad::models::{EfficientNet, EfficientNetConfig, FeatureMaps, Freeze, MBConvSetting};
use leangrad::nn::Module;
use leangrad::{DType, Device, Error, Tensor};

const NAME: &str = "efficientnet_v2_tiny";

/// The rows of the fixture (export.py `--mbconv`).
fn config() -> EfficientNetConfig {
    EfficientNetConfig {
        in_channels: 3,
        settings: vec![
            MBConvSetting::fused(1.0, 3, 1, 8, 8, 2),
            MBConvSetting::fused(2.0, 3, 2, 8, 16, 1),
            MBConvSetting::mbconv(2.0, 3, 2, 16, 16, 2),
            MBConvSetting::mbconv(1.0, 5, 1, 16, 16, 1),
        ],
        last_channel: None,
        num_classes: 5,
        dropout: 0.0,
        stochastic_depth_prob: 0.0,
    }
}

fn make(d: DType) -> EfficientNet {
    EfficientNet::new(&config(), d, CPU, 1).unwrap()
}

#[test]
fn fourteen_cases_train_something() {
    assert_eq!(meaningful_cases(&make(DType::F32)).len(), 14);
}

#[test]
fn tiny_efficientnet_matches_pytorch_f32() {
    let worst = check_model(&make, NAME, DType::F32, 1e-4);
    assert!(worst < 1e-4);
}

#[test]
fn tiny_efficientnet_matches_pytorch_f64() {
    let worst = check_model(&make, NAME, DType::F64, 1e-5);
    assert!(worst < 1e-5);
}

#[test]
fn lean_policy_saves_less_with_bit_identical_gradients() {
    check_policies(&make, NAME);
}

/// Every block a checkpointed segment: the same fixtures hold in every
/// case.
#[test]
fn checkpointed_tiny_efficientnet_matches_pytorch() {
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
    let samples = [
        "features.0.0.weight",
        "features.0.1.running_var",
        "features.1.0.block.0.0.weight",
        "features.1.1.block.0.1.bias",
        "features.2.0.block.1.0.weight",
        "features.3.0.block.2.fc1.weight",
        "features.3.1.block.2.fc2.bias",
        "features.4.0.block.0.0.weight",
        "features.4.0.block.1.fc1.weight",
        "features.4.0.block.2.1.num_batches_tracked",
        "features.5.0.weight",
        "features.5.1.num_batches_tracked",
        "classifier.1.weight",
        "classifier.1.bias",
    ];
    check_fixture_names(&make(DType::F32), NAME, &samples);
}

/// Full size: torchvision's state dicts (names and shapes in order), their
/// parameter counts, and each case training what it trains on
/// torchvision's EfficientNetV2-S, -M and -L.
#[test]
fn full_size_efficientnet_v2_is_torchvisions() {
    let sizes = [
        (
            "efficientnet_v2_s",
            EfficientNetConfig::efficientnet_v2_s(1000),
            21_458_488,
            452,
        ),
        (
            "efficientnet_v2_m",
            EfficientNetConfig::efficientnet_v2_m(1000),
            54_139_356,
            649,
        ),
        (
            "efficientnet_v2_l",
            EfficientNetConfig::efficientnet_v2_l(1000),
            118_515_272,
            897,
        ),
    ];
    for (name, config, count, tensors) in sizes {
        let mut model = EfficientNet::new(&config, DType::F32, Device::Meta, 0).unwrap();
        let want = torchvision(name);
        same_state_dict(&model, &want, name);
        assert_eq!(ours(&model).1, count, "{name}");
        assert_eq!(model.named_parameters().len(), tensors, "{name}");
        check_cases_against(&mut model, &want, name);
    }
    let config = EfficientNetConfig::efficientnet_v2_l(1000);
    assert_eq!(config.dropout, 0.4);
    let model = EfficientNet::new(&config, DType::F32, Device::Meta, 0).unwrap();
    let (sd, _) = ours(&model);
    let shape = |name: &str| sd.iter().find(|(n, _)| n == name).unwrap().1.clone();
    assert_eq!(shape("features.0.0.weight"), [32, 3, 3, 3]);
    assert_eq!(shape("features.1.3.block.0.0.weight"), [32, 32, 3, 3]);
    assert_eq!(shape("features.2.0.block.0.0.weight"), [128, 32, 3, 3]);
    assert_eq!(shape("features.2.0.block.1.0.weight"), [64, 128, 1, 1]);
    assert_eq!(shape("features.4.0.block.1.0.weight"), [384, 1, 3, 3]);
    assert_eq!(shape("features.4.0.block.2.fc1.weight"), [24, 384, 1, 1]);
    assert_eq!(shape("features.5.3.block.2.fc1.weight"), [56, 1344, 1, 1]);
    assert_eq!(shape("features.8.0.weight"), [1280, 640, 1, 1]);
    assert_eq!(shape("classifier.1.weight"), [1000, 1280]);
}

/// torchvision's `stochastic_depth_prob * block_id / total_blocks`, per
/// block in order (EfficientNetV2-S: 40 blocks, 0.2).
#[test]
fn stochastic_depth_grows_linearly_as_torchvisions() {
    let config = EfficientNetConfig::efficientnet_v2_s(10);
    let model = EfficientNet::new(&config, DType::F32, Device::Meta, 0).unwrap();
    let probs = model.stochastic_depth_probs();
    assert_eq!(probs.len(), 40);
    assert_eq!(probs[0], ("features.1.0".to_string(), 0.0));
    assert_eq!(probs[2].0, "features.2.0");
    assert_eq!(probs[39].0, "features.6.14");
    for (i, (_, p)) in probs.iter().enumerate() {
        assert_eq!(*p, 0.2 * i as f64 / 40.0, "{i}");
    }
}

/// The tiny model with `p` as its stochastic depth, on the fixture's
/// weights and input.
fn with_stochastic_depth(p: f64, checkpointing: bool) -> (EfficientNet, Tensor) {
    let config = EfficientNetConfig {
        stochastic_depth_prob: p,
        ..config()
    };
    let mut model = EfficientNet::new(&config, DType::F32, CPU, 1).unwrap();
    let sd = fixture(&format!("{NAME}.safetensors"));
    leangrad::io::load_state_dict(&model, &sd, Default::default()).unwrap();
    model.gradient_checkpointing(checkpointing);
    let x = fixture(&format!("{NAME}_io.safetensors"))["input"].clone();
    (model, x)
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_vec::<f32>()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

/// In training mode stochastic depth drops residual branches per sample,
/// so p > 0 changes the output; in evaluation mode it is the identity, so
/// p has no effect at all. (Fresh models each time: a training-mode pass
/// moves the running statistics.)
#[test]
fn stochastic_depth_acts_in_training_mode_only() {
    let output = |p: f64, training: bool| {
        let (mut model, x) = with_stochastic_depth(p, false);
        model.set_training(training);
        bits(&model.forward(&x).unwrap())
    };
    assert_ne!(output(0.0, true), output(1.0, true));
    assert_eq!(output(0.0, false), output(1.0, false));
    assert_eq!(output(0.0, false), output(0.5, false));
}

/// With p > 0 in training mode, checkpointed blocks replay the forward's
/// stochastic-depth draws: outputs and gradients bit-identical to the
/// model without checkpointing.
#[test]
fn checkpointing_replays_stochastic_depth() {
    let run = |checkpointing: bool| {
        let (model, x) = with_stochastic_depth(0.9, checkpointing);
        let x = x.set_requires_grad(true).unwrap();
        let y = model.forward(&x).unwrap();
        y.mul(&y).unwrap().sum_all().unwrap().backward().unwrap();
        let mut out = vec![bits(&y), bits(&x.grad().unwrap())];
        for (_, p) in model.named_parameters() {
            out.push(bits(&p.grad().unwrap()));
        }
        out
    };
    assert_eq!(run(false), run(true));
}

/// torchvision's `create_feature_extractor` names, and the shapes of a
/// 224×224 image's maps through EfficientNetV2-S (on the meta device).
#[test]
fn feature_maps_by_torchvision_layer_name() {
    let config = EfficientNetConfig::efficientnet_v2_s(10);
    let model = EfficientNet::new(&config, DType::F32, Device::Meta, 0).unwrap();
    let names = model.feature_names();
    assert_eq!(names.len(), 1 + 40 + 6 + 1 + 2 + 2);
    assert_eq!(
        names[..4],
        ["features.0", "features.1.0", "features.1.1", "features.1"]
    );
    assert_eq!(
        names[names.len() - 5..],
        [
            "features.7",
            "avgpool",
            "flatten",
            "classifier.0",
            "classifier.1"
        ]
    );
    let x = Tensor::zeros(&[2, 3, 224, 224], DType::F32, Device::Meta).unwrap();
    let want = [
        "features.0",
        "features.1",
        "features.2.3",
        "features.2",
        "features.3",
        "features.4",
        "features.5",
        "features.6",
        "features.7",
        "avgpool",
        "flatten",
        "classifier.1",
    ];
    let maps = model.features(&x, &want).unwrap();
    let shapes: Vec<&[usize]> = maps.iter().map(|(_, t)| t.shape()).collect();
    assert_eq!(
        shapes,
        [
            &[2, 24, 112, 112][..],
            &[2, 24, 112, 112],
            &[2, 48, 56, 56],
            &[2, 48, 56, 56],
            &[2, 64, 28, 28],
            &[2, 128, 14, 14],
            &[2, 160, 14, 14],
            &[2, 256, 7, 7],
            &[2, 1280, 7, 7],
            &[2, 1280, 1, 1],
            &[2, 1280],
            &[2, 10],
        ]
    );
    assert!(matches!(
        model.features(&x, &["features.8"]),
        Err(Error::UnknownLayer { .. })
    ));
}

/// A new `classifier.1`, uniform in ±1/√classes with bias zero as
/// torchvision initialises it; the rest of the model is kept.
#[test]
fn replace_head_keeps_the_backbone() {
    let mut model = make(DType::F32);
    let x = Tensor::randn(&[1, 3, 32, 32], DType::F32, CPU, 0).unwrap();
    check_replace_head(&mut model, "classifier.1", 5, &x);
    let after = model.named_parameters();
    let head = |name: &str| after.iter().find(|(n, _)| n == name).unwrap().1.clone();
    let w = head("classifier.1.weight").to_f64_vec().unwrap();
    let r = 1.0 / 7f64.sqrt();
    assert!(w.iter().all(|v| v.abs() <= r) && w.iter().any(|v| v.abs() > r / 2.0));
    assert!(head("classifier.1.bias")
        .to_f64_vec()
        .unwrap()
        .iter()
        .all(|&v| v == 0.0));
}

/// torchvision's initialisation: convolutions N(0, 2/fan_out) (the
/// squeeze-and-excitation's with bias 0), BatchNorm 1 and 0, the
/// classifier uniform in ±1/√classes with bias 0.
#[test]
fn initialised_as_torchvision() {
    let config = EfficientNetConfig::efficientnet_v2_s(100);
    let model = EfficientNet::new(&config, DType::F32, CPU, 0).unwrap();
    let params = model.named_parameters();
    let get = |name: &str| {
        let t = &params.iter().find(|(n, _)| n == name).unwrap().1;
        t.to_f64_vec().unwrap()
    };
    let std = |v: &[f64]| (v.iter().map(|x| x * x).sum::<f64>() / v.len() as f64).sqrt();
    // features.6.0.block.0.0: 1×1, 160 → 960: fan_out 960.
    let w = get("features.6.0.block.0.0.weight");
    let want = (2.0f64 / 960.0).sqrt();
    assert!((std(&w) / want - 1.0).abs() < 0.02, "{} vs {want}", std(&w));
    assert!(get("features.6.0.block.2.fc1.bias")
        .iter()
        .all(|&v| v == 0.0));
    assert!(get("features.6.0.block.0.1.weight")
        .iter()
        .all(|&v| v == 1.0));
    assert!(get("features.6.0.block.0.1.bias").iter().all(|&v| v == 0.0));
    let w = get("classifier.1.weight");
    assert!(w.iter().all(|v| v.abs() <= 0.1));
    assert!((std(&w) / (0.1 / 3f64.sqrt()) - 1.0).abs() < 0.02);
    assert!(get("classifier.1.bias").iter().all(|&v| v == 0.0));
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
    assert_eq!(on.len(), 12);
    assert_eq!(on[0], "features.3.0.block.2.fc1.weight");
    assert_eq!(on[11], "features.4.0.block.1.fc2.bias");
    model.freeze(&["features.3.*"]).unwrap();
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
    let bad = |f: &dyn Fn(&mut EfficientNetConfig)| {
        let mut c = config();
        f(&mut c);
        match EfficientNet::new(&c, DType::F32, Device::Meta, 0) {
            Err(Error::InvalidArgument { op, .. }) => assert_eq!(op, "EfficientNet"),
            Err(e) => panic!("{c:?}: {e}"),
            Ok(_) => panic!("{c:?}: accepted"),
        }
    };
    bad(&|c| c.settings.clear());
    bad(&|c| c.settings[1].stride = 3);
    bad(&|c| c.settings[1].stride = 0);
    bad(&|c| c.settings[2].kernel = 0);
    bad(&|c| c.settings[2].layers = 0);
    bad(&|c| c.settings[0].input = 0);
    bad(&|c| c.settings[3].out = 0);
    bad(&|c| c.settings[2].input = 24);
    bad(&|c| c.settings[1].expand_ratio = 0.0);
    bad(&|c| c.settings[1].expand_ratio = -1.0);
    bad(&|c| c.settings[1].expand_ratio = f64::NAN);
    bad(&|c| c.settings[1].expand_ratio = f64::INFINITY);
    bad(&|c| c.settings[1].expand_ratio = 1e300);
    bad(&|c| c.settings[3].layers = usize::MAX);
    bad(&|c| c.settings[3].layers = 2_000_000);
    bad(&|c| c.num_classes = 0);
    bad(&|c| c.last_channel = Some(0));
    bad(&|c| c.in_channels = 0);
    bad(&|c| c.dropout = 1.5);
    bad(&|c| c.dropout = f64::NAN);
    bad(&|c| c.stochastic_depth_prob = -0.1);
    bad(&|c| c.stochastic_depth_prob = f64::NAN);
}

/// Registered as `efficientnet_v2_s`, `_m` and `_l` for the jobs
/// (`leangrad finetune`) and `leangrad memory`, full size, head
/// `classifier.1`.
#[test]
fn registered_as_efficientnet_v2() {
    for (name, count) in [
        ("efficientnet_v2_s", 21_458_488),
        ("efficientnet_v2_m", 54_139_356),
        ("efficientnet_v2_l", 118_515_272),
    ] {
        assert!(leangrad::jobs::CLASSIFIERS.contains(&name));
        let m = leangrad::jobs::build_classifier(name, 10, Device::Meta).unwrap();
        assert_eq!(m.head_name(), "classifier.1");
        assert_eq!(m.num_classes(), 10);
        let entry = leangrad::memory_plan::find_model(name).unwrap();
        let mut m = (entry.build)(1000, 224, DType::F32, Device::Meta).unwrap();
        let n: usize = m.parameters().iter().map(|t| t.numel()).sum();
        assert_eq!(n, count, "{name}");
        m.set_gradient_checkpointing(true).unwrap();
    }
}
