//! Model surgery against PyTorch (fixtures written by
//! `python-compare/surgery_fixture.py`, references in f64): a replaced
//! classifier head loads the state dict PyTorch saves after
//! `model.fc = nn.Linear(16, 10)` (and VGG's `classifier[6]`,
//! MobileNetV2's `classifier[1]`) and gives PyTorch's logits; layer outputs
//! by name (`FeatureMaps::features`) and the input gradient through them
//! match forward hooks on the same PyTorch models (VGG-19's style-transfer
//! layers included); the network runs only up to the last layer asked for.

mod common;

use common::models::CPU;
use leangrad::io::{load_safetensors, load_state_dict, state_dict, LoadOptions};
use leangrad::memory::Ledger;
use leangrad::models::{
    BlockKind, Case, FeatureMaps, Freeze, InvertedResidualSetting, MobileNetV2, MobileNetV2Config,
    ReplaceHead, ResNet, ResNetConfig, Vgg, VggConfig, ViTClassifier, ViTConfig,
};
use leangrad::nn::Module;
use leangrad::{DType, Device, Error, Tensor};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

fn fixture(name: &str) -> BTreeMap<String, Tensor> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/surgery")
        .join(name);
    load_safetensors(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn resnet18() -> ResNet {
    let config = ResNetConfig {
        block: BlockKind::Basic,
        layers: [2, 2, 2, 2],
        base_width: 2,
        num_classes: 5,
        in_channels: 1,
        zero_init_residual: false,
        groups: 1,
        width_per_group: 64,
    };
    ResNet::new(config, DType::F32, CPU, 1).unwrap()
}

const VGG16_TINY: [usize; 18] = [1, 1, 0, 2, 2, 0, 2, 2, 2, 0, 4, 4, 4, 0, 4, 4, 4, 0];
const VGG19_TINY: [usize; 21] = [
    2, 2, 0, 4, 4, 0, 4, 4, 4, 4, 0, 8, 8, 8, 8, 0, 8, 8, 8, 8, 0,
];

fn vgg(plan: &[usize], batch_norm: bool, in_channels: usize) -> Vgg {
    let config = VggConfig {
        plan: plan.to_vec(),
        batch_norm,
        in_channels,
        pool_size: 1,
        hidden: 8,
        num_classes: 5,
        dropout: 0.0,
    };
    Vgg::new(&config, DType::F32, CPU, 1).unwrap()
}

fn mobilenet() -> MobileNetV2 {
    let rows = [(1, 2, 1, 1), (6, 3, 2, 2), (6, 4, 2, 2)];
    let config = MobileNetV2Config {
        stem: 4,
        settings: rows
            .iter()
            .map(|&(t, c, n, s)| InvertedResidualSetting { t, c, n, s })
            .collect(),
        last_channel: 16,
        num_classes: 5,
        in_channels: 1,
        dropout: 0.0,
    };
    MobileNetV2::new(&config, DType::F32, CPU, 1).unwrap()
}

/// max |got − want| ≤ tol · max |want|.
fn assert_close(what: &str, got: &Tensor, want: &Tensor, tol: f64) {
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    let (g, w) = (got.to_f64_vec().unwrap(), want.to_f64_vec().unwrap());
    let scale = w.iter().fold(1e-12f64, |m, v| m.max(v.abs()));
    let err = g
        .iter()
        .zip(&w)
        .fold(0f64, |m, (a, b)| m.max((a - b).abs()));
    assert!(
        err <= tol * scale,
        "{what}: error {err:e} vs scale {scale:e}"
    );
}

/// The entries of `file` under `prefix`, with the prefix removed.
fn under(file: &BTreeMap<String, Tensor>, prefix: &str) -> BTreeMap<String, Tensor> {
    file.iter()
        .filter_map(|(k, v)| k.strip_prefix(prefix).map(|k| (k.to_string(), v.clone())))
        .collect()
}

fn names_and_shapes(m: &dyn Module) -> BTreeMap<String, Vec<usize>> {
    state_dict(m, "")
        .into_iter()
        .map(|(n, t)| (n, t.shape().to_vec()))
        .collect()
}

/// Replaces the head (5 → 10 classes) and checks the state dict: the same
/// names, the head's new shapes, every other shape unchanged; then loads
/// PyTorch's state dict saved after the same replacement, strictly, and
/// compares eval-mode logits.
fn check_head<M: Module + ReplaceHead>(mut model: M, file: &str, head: &str, width: usize) {
    assert_eq!(model.head_name(), head);
    assert_eq!(model.num_classes(), 5);
    let before = names_and_shapes(&model);
    model.replace_head(10, 42).unwrap();
    assert_eq!(model.num_classes(), 10);
    let after = names_and_shapes(&model);
    assert_eq!(
        before.keys().collect::<Vec<_>>(),
        after.keys().collect::<Vec<_>>()
    );
    for (name, shape) in &after {
        let want = match name.strip_prefix(head) {
            Some(".weight") => vec![10, width],
            Some(".bias") => vec![10],
            _ => before[name].clone(),
        };
        assert_eq!(shape, &want, "{name}");
    }
    let fx = fixture(file);
    let mut sd = fx.clone();
    let (x, want) = (sd.remove("input").unwrap(), sd.remove("output").unwrap());
    let report = load_state_dict(&model, &sd, LoadOptions::default()).unwrap();
    assert!(report.missing.is_empty() && report.unexpected.is_empty());
    model.set_training(false);
    let y = model.forward(&x).unwrap();
    assert_eq!(y.shape(), &[2, 10]);
    assert_close(file, &y, &want, 1e-4);
}

#[test]
fn replaced_heads_load_pytorch_state_dicts_and_match_its_logits() {
    check_head(resnet18(), "resnet18_tiny_head10.safetensors", "fc", 16);
    let vgg16 = vgg(&VGG16_TINY, false, 1);
    check_head(vgg16, "vgg16_tiny_head10.safetensors", "classifier.6", 8);
    let mobile = mobilenet();
    check_head(
        mobile,
        "mobilenet_v2_tiny_head10.safetensors",
        "classifier.1",
        16,
    );
    // The state dict before replacement does not fit PyTorch's new head.
    let sd = fixture("resnet18_tiny_head10.safetensors");
    let sd: BTreeMap<_, _> = sd.into_iter().filter(|(k, _)| k.contains('.')).collect();
    let err = load_state_dict(&resnet18(), &sd, LoadOptions::default()).unwrap_err();
    assert!(
        matches!(err, Error::StateDictMismatch { ref mismatched, .. }
        if mismatched.iter().any(|(n, _, _)| n == "fc.weight"))
    );
}

/// Each head is initialised as the model's constructor initialises it,
/// reproducibly from its seed; a zero class count is an error.
#[test]
fn new_heads_are_initialised_as_torchvision_does() {
    let values = |m: &dyn Module, n: &str| -> Vec<f64> {
        let sd: BTreeMap<String, Tensor> = state_dict(m, "").into_iter().collect();
        sd[n].to_f64_vec().unwrap()
    };
    // ResNet's fc: PyTorch's default, uniform in ±1/√16.
    let mut r = resnet18();
    r.replace_head(300, 1).unwrap();
    let w = values(&r, "fc.weight");
    let b = values(&r, "fc.bias");
    assert!(w.iter().chain(&b).all(|v| v.abs() <= 0.25));
    assert!(w.iter().any(|v| v.abs() > 0.2) && b.iter().any(|v| *v != 0.0));
    // VGG's classifier.6 and MobileNetV2's classifier.1: N(0, 0.01), bias 0.
    let mut v = vgg(&VGG16_TINY, false, 1);
    v.replace_head(1000, 1).unwrap();
    let w = values(&v, "classifier.6.weight");
    let mean = w.iter().sum::<f64>() / w.len() as f64;
    let std = (w.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / w.len() as f64).sqrt();
    assert!(
        mean.abs() < 0.002 && (std - 0.01).abs() < 0.001,
        "{mean} {std}"
    );
    assert!(values(&v, "classifier.6.bias").iter().all(|b| *b == 0.0));
    let mut m = mobilenet();
    m.replace_head(7, 1).unwrap();
    assert!(values(&m, "classifier.1.bias").iter().all(|b| *b == 0.0));
    // The same seed gives the same head; another seed another.
    let mut again = vgg(&VGG16_TINY, false, 1);
    again.replace_head(1000, 1).unwrap();
    assert_eq!(values(&again, "classifier.6.weight"), w);
    again.replace_head(1000, 2).unwrap();
    assert_ne!(values(&again, "classifier.6.weight"), w);
    assert!(matches!(
        r.replace_head(0, 1),
        Err(Error::InvalidArgument { .. })
    ));
    // ViT's classifier: N(0, 0.02).
    let config = ViTConfig::tiny();
    let (hidden, c, size) = (config.hidden_size, config.num_channels, config.image_size);
    let mut vit = ViTClassifier::new(config, 3, DType::F32, CPU, 0).unwrap();
    assert_eq!((vit.head_name(), vit.num_classes()), ("classifier", 3));
    vit.replace_head(500, 4).unwrap();
    let w = values(&vit, "classifier.weight");
    assert_eq!(w.len(), 500 * hidden);
    let std = (w.iter().map(|x| x * x).sum::<f64>() / w.len() as f64).sqrt();
    assert!((std - 0.02).abs() < 0.002, "{std}");
    let x = Tensor::randn(&[2, c, size, size], DType::F32, CPU, 3).unwrap();
    assert_eq!(vit.forward(&x).unwrap().shape(), &[2, 500]);
}

/// A frozen backbone stays frozen and the new head trains; the freezing
/// cases still apply by name and kind.
#[test]
fn new_head_trains_on_a_frozen_backbone() {
    let mut model = resnet18();
    model.set_requires_grad(|_| false).unwrap();
    model.replace_head(10, 3).unwrap();
    for (name, p) in model.named_parameters() {
        assert_eq!(p.requires_grad(), name.starts_with("fc."), "{name}");
    }
    let x = Tensor::randn(&[2, 1, 32, 32], DType::F32, CPU, 0).unwrap();
    model
        .forward(&x)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    for (name, p) in model.named_parameters() {
        assert_eq!(p.grad().is_some(), name.starts_with("fc."), "{name}");
    }
    let linear: Case = "linear".parse().unwrap();
    linear.apply(&mut model).unwrap();
    let trainable: BTreeSet<String> = model
        .named_parameters()
        .into_iter()
        .filter(|(_, p)| p.requires_grad())
        .map(|(n, _)| n)
        .collect();
    assert_eq!(trainable, linear.trainable(&model.parameter_kinds()));
    assert_eq!(trainable.len(), 2);
    let mut vgg16 = vgg(&VGG16_TINY, false, 1);
    vgg16.freeze(&["*"]).unwrap();
    vgg16.replace_head(3, 0).unwrap();
    let training: Vec<String> = vgg16
        .named_parameters()
        .into_iter()
        .filter(|(_, p)| p.requires_grad())
        .map(|(n, _)| n)
        .collect();
    assert_eq!(training, ["classifier.6.weight", "classifier.6.bias"]);
}

/// `features` against PyTorch's forward hooks (eval mode), and the input
/// gradient of `Σ sum(feature · probe)` through them.
fn check_features<M: FeatureMaps + Module>(mut model: M, file: &str) {
    let fx = fixture(file);
    let report = load_state_dict(&model, &under(&fx, "state."), LoadOptions::default()).unwrap();
    assert!(report.missing.is_empty() && report.unexpected.is_empty());
    model.set_training(false);
    let names: Vec<String> = under(&fx, "feature.").into_keys().collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let x = fx["input"].clone().set_requires_grad(true).unwrap();
    let maps = model.features(&x, &names).unwrap();
    assert_eq!(maps.len(), names.len());
    let mut loss: Option<Tensor> = None;
    for ((name, map), want) in maps.iter().zip(&names) {
        assert_eq!(name, want);
        assert_close(
            &format!("{file} {name}"),
            map,
            &fx[&format!("feature.{name}")],
            1e-4,
        );
        let term = map
            .mul(&fx[&format!("probe.{name}")])
            .unwrap()
            .sum_all()
            .unwrap();
        loss = Some(match loss {
            Some(l) => l.add(&term).unwrap(),
            None => term,
        });
    }
    loss.unwrap().backward().unwrap();
    assert_close(
        &format!("{file} grad"),
        &x.grad().unwrap(),
        &fx["grad.input"],
        1e-4,
    );
    // The whole forward pass still gives the model's output.
    let y = model.forward(&fx["input"]).unwrap();
    assert_close(&format!("{file} output"), &y, &fx["output"], 1e-4);
}

#[test]
fn resnet_features_match_pytorch() {
    check_features(resnet18(), "resnet18_tiny_features.safetensors");
}

#[test]
fn vgg16_features_match_pytorch() {
    check_features(
        vgg(&VGG16_TINY, false, 1),
        "vgg16_tiny_features.safetensors",
    );
    check_features(
        vgg(&VGG16_TINY, true, 1),
        "vgg16_bn_tiny_features.safetensors",
    );
}

#[test]
fn vgg19_features_and_logits_match_pytorch() {
    check_features(
        vgg(&VGG19_TINY, false, 3),
        "vgg19_tiny_features.safetensors",
    );
}

#[test]
fn mobilenet_features_match_pytorch() {
    check_features(mobilenet(), "mobilenet_v2_tiny_features.safetensors");
}

/// Saved-for-backward bytes by layer after asking for `names` (the input
/// requiring grad, so every layer that runs saves something).
fn layers_run(model: &dyn Fn(&Tensor) -> leangrad::Result<Vec<Tensor>>) -> BTreeSet<String> {
    let ledger = Ledger::new();
    let _l = ledger.enter();
    let x = Tensor::randn(&[2, 1, 32, 32], DType::F32, CPU, 0)
        .unwrap()
        .set_requires_grad(true)
        .unwrap();
    let _outputs = model(&x).unwrap(); // held: they keep the graph alive
    ledger
        .saved_by_layer(CPU)
        .into_iter()
        .map(|(l, _)| l.split('/').next().unwrap_or_default().to_string())
        .collect()
}

/// Asking for an early layer runs nothing after it: the ledger sees no
/// layer after `layer1` save anything, while the full forward pass reaches
/// `fc`; a VGG whose later pools cannot run on a 2×2 input still gives its
/// first layers.
#[test]
fn features_run_only_up_to_the_last_layer_asked_for() {
    let model = resnet18();
    let early = layers_run(&|x| {
        let maps = model.features(x, &["layer1", "relu"])?;
        Ok(maps.into_iter().map(|(_, t)| t).collect())
    });
    assert!(early.contains("layer1.1.conv2"), "{early:?}");
    assert!(
        early.iter().all(|l| !l.starts_with("layer2") && l != "fc"),
        "{early:?}"
    );
    let full = layers_run(&|x| Ok(vec![model.forward(x)?]));
    assert!(
        full.contains("layer4.1.conv2") && full.contains("fc"),
        "{full:?}"
    );

    let model = vgg(&VGG16_TINY, false, 1);
    let x = Tensor::randn(&[1, 1, 2, 2], DType::F32, CPU, 0).unwrap();
    assert!(model.forward(&x).is_err(), "the second pool needs 2×2");
    assert!(model.features(&x, &["features.9"]).is_err());
    // features.4 pools 2×2 to 1×1; the pool at features.9 cannot run.
    let maps = model.features(&x, &["features.6", "features.3"]).unwrap();
    assert_eq!(maps[0].1.shape(), &[1, 2, 1, 1]);
    assert_eq!(maps[1].1.shape(), &[1, 1, 2, 2]);
    assert!(model.features(&x, &[]).unwrap().is_empty());
}

#[test]
fn unknown_layer_names_are_typed_errors_listing_the_valid_names() {
    let model = resnet18();
    let x = Tensor::randn(&[1, 1, 32, 32], DType::F32, CPU, 0).unwrap();
    let err = model.features(&x, &["layer1", "layer9"]).unwrap_err();
    match &err {
        Error::UnknownLayer { model, name, valid } => {
            assert_eq!((*model, name.as_str()), ("ResNet", "layer9"));
            assert_eq!(valid, &model_names());
        }
        e => panic!("{e}"),
    }
    assert!(err
        .to_string()
        .contains("valid names: conv1, bn1, relu, maxpool, layer1.0"));
    let vgg16 = vgg(&VGG16_TINY, false, 1);
    let names = vgg16.feature_names();
    assert_eq!(names.len(), 31 + 2 + 7);
    assert_eq!(
        &names[29..33],
        ["features.29", "features.30", "avgpool", "flatten"]
    );
    assert!(matches!(
        vgg16.features(&x, &["features.31"]),
        Err(Error::UnknownLayer { .. })
    ));
    // The trait is object safe: one code path for every CNN.
    let models: [&dyn FeatureMaps; 2] = [&model, &vgg16];
    assert_eq!(models.map(|m| m.model_name()), ["ResNet", "Vgg"]);
    let mobile = mobilenet().feature_names();
    assert_eq!(mobile.first().unwrap(), "features.0");
    assert_eq!(mobile.last().unwrap(), "classifier.1");
}

fn model_names() -> Vec<String> {
    let mut n: Vec<String> = ["conv1", "bn1", "relu", "maxpool"].map(String::from).into();
    for s in 1..=4 {
        n.extend([
            format!("layer{s}.0"),
            format!("layer{s}.1"),
            format!("layer{s}"),
        ]);
    }
    n.extend(["avgpool", "flatten", "fc"].map(String::from));
    n
}

/// Full-size VGG-19 has torchvision's layer list and parameter counts
/// (built on the meta device: no 550 MB of weights).
#[test]
fn full_size_vgg19_matches_torchvision() {
    let count = |c: &VggConfig| -> usize {
        let m = Vgg::new(c, DType::F32, Device::Meta, 0).unwrap();
        m.parameters().iter().map(|t| t.numel()).sum()
    };
    assert_eq!(count(&VggConfig::vgg16(false, 1000)), 138_357_544);
    assert_eq!(count(&VggConfig::vgg19(false, 1000)), 143_667_240);
    assert_eq!(count(&VggConfig::vgg19(true, 1000)), 143_678_248);
    let m = Vgg::new(&VggConfig::vgg19(false, 1000), DType::F32, Device::Meta, 0).unwrap();
    let names = m.feature_names();
    // relu1_1, relu2_1, relu3_1, relu4_1, relu4_2, relu5_1, and the last pool.
    for n in [1, 6, 11, 20, 22, 29, 36] {
        assert!(names.contains(&format!("features.{n}")), "features.{n}");
    }
    assert!(!names.contains(&"features.37".to_string()));
    let sd = names_and_shapes(&m);
    assert_eq!(sd["features.34.weight"], [512, 512, 3, 3]);
    assert_eq!(sd["classifier.6.weight"], [1000, 4096]);
}
