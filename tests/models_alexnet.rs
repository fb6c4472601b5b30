//! AlexNet against PyTorch: a tiny AlexNet (torchvision's layers with
//! narrow widths, fixtures written by `python-compare/export.py`,
//! reference in f64) through the harness of `tests/common/models.rs` for
//! every case (no `norm` case: AlexNet has no normalisation layer), the
//! lean policy against SaveAll; the full-size model against torchvision's
//! own (`tests/fixtures/models/torchvision_models.json`): state-dict names
//! and shapes in order, the parameter count and what each case trains;
//! and the model's surgery, dropout and errors.

mod common;

use common::models::{
    check_cases_against, check_model, check_policies, fixture, meaningful_cases, ours,
    same_state_dict, torchvision, CPU,
};
use leangrad::models::{AlexNet, AlexNetConfig, FeatureMaps, Freeze, ReplaceHead};
use leangrad::nn::Module;
use leangrad::{DType, Device, Error, Tensor};
use std::collections::BTreeSet;

fn config() -> AlexNetConfig {
    AlexNetConfig {
        in_channels: 3,
        widths: [4, 8, 8, 8, 8],
        pool_size: 6,
        hidden: 16,
        num_classes: 5,
        dropout: 0.0,
    }
}

fn make(d: DType) -> AlexNet {
    AlexNet::new(&config(), d, CPU, 1).unwrap()
}

/// Without normalisation layers the two `norm` cases train nothing.
#[test]
fn twelve_cases_train_something() {
    assert_eq!(meaningful_cases(&make(DType::F32)).len(), 12);
}

#[test]
fn tiny_alexnet_matches_pytorch_f32() {
    check_model(&make, "alexnet_tiny", DType::F32, 1e-4);
}

#[test]
fn tiny_alexnet_matches_pytorch_f64() {
    check_model(&make, "alexnet_tiny", DType::F64, 1e-5);
}

#[test]
fn lean_policy_saves_less_with_bit_identical_gradients() {
    check_policies(&make, "alexnet_tiny");
}

#[test]
fn names_are_torchvision_state_dict_names() {
    let model = make(DType::F32);
    let ours: BTreeSet<String> = leangrad::io::state_dict(&model, "")
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    let theirs: BTreeSet<String> = fixture("alexnet_tiny.safetensors").into_keys().collect();
    assert_eq!(ours, theirs);
    for n in [
        "features.0.weight",
        "features.3.bias",
        "features.10.weight",
        "classifier.1.weight",
        "classifier.4.bias",
        "classifier.6.weight",
    ] {
        assert!(ours.contains(n), "{n}");
    }
    assert!(model.named_buffers().is_empty());
}

/// Full size: torchvision's state dict (names and shapes in order), its
/// 61,100,840 parameters, and each case training what it trains on
/// torchvision's AlexNet.
#[test]
fn full_size_alexnet_is_torchvisions() {
    let mut model =
        AlexNet::new(&AlexNetConfig::alexnet(1000), DType::F32, Device::Meta, 0).unwrap();
    let want = torchvision("alexnet");
    same_state_dict(&model, &want, "alexnet");
    let (sd, n) = ours(&model);
    assert_eq!(n, 61_100_840);
    assert_eq!(
        sd.iter()
            .find(|(n, _)| n == "classifier.1.weight")
            .unwrap()
            .1,
        [4096, 9216]
    );
    check_cases_against(&mut model, &want, "alexnet");
}

/// The layers by name, torchvision's `create_feature_extractor` names, and
/// the shapes of a 224×224 image's maps through the full-size features
/// (on the meta device).
#[test]
fn feature_maps_by_torchvision_layer_name() {
    let model = AlexNet::new(&AlexNetConfig::alexnet(10), DType::F32, Device::Meta, 0).unwrap();
    let names = model.feature_names();
    assert_eq!(names.len(), 13 + 2 + 7);
    assert_eq!(names[0], "features.0");
    assert_eq!(names[12], "features.12");
    assert_eq!(names[13..15], ["avgpool", "flatten"]);
    assert_eq!(names[21], "classifier.6");
    let x = Tensor::zeros(&[2, 3, 224, 224], DType::F32, Device::Meta).unwrap();
    let maps = model
        .features(
            &x,
            &[
                "features.0",
                "features.2",
                "features.5",
                "features.12",
                "avgpool",
                "flatten",
                "classifier.6",
            ],
        )
        .unwrap();
    let shapes: Vec<&[usize]> = maps.iter().map(|(_, t)| t.shape()).collect();
    assert_eq!(
        shapes,
        [
            &[2, 64, 55, 55][..],
            &[2, 64, 27, 27],
            &[2, 192, 13, 13],
            &[2, 256, 6, 6],
            &[2, 256, 6, 6],
            &[2, 9216],
            &[2, 10],
        ]
    );
    assert!(matches!(
        model.features(&x, &["features.13"]),
        Err(Error::UnknownLayer { .. })
    ));
}

/// A 63×63 image is the smallest AlexNet takes; a 62×62 one is a typed
/// error (its last max pool has no window), never a panic.
#[test]
fn smallest_image_and_too_small_ones() {
    let model = make(DType::F32);
    let ok = Tensor::randn(&[1, 3, 63, 63], DType::F32, CPU, 3).unwrap();
    assert_eq!(model.forward(&ok).unwrap().shape(), &[1, 5]);
    let small = Tensor::randn(&[1, 3, 62, 62], DType::F32, CPU, 3).unwrap();
    assert!(model.forward(&small).is_err());
}

/// `classifier.6` is the head: a new one of another class count trains,
/// the rest keeps its state.
#[test]
fn replace_head_and_freeze_by_glob() {
    let mut model = make(DType::F32);
    assert_eq!(
        (model.head_name(), model.num_classes()),
        ("classifier.6", 5)
    );
    model.train_only(&["features.*"]).unwrap();
    model.replace_head(3, 7).unwrap();
    assert_eq!(model.num_classes(), 3);
    let grads: Vec<(String, bool)> = model
        .named_parameters()
        .into_iter()
        .map(|(n, t)| (n, t.requires_grad()))
        .collect();
    for (n, on) in &grads {
        let want = n.starts_with("features.") || n.starts_with("classifier.6.");
        assert_eq!(*on, want, "{n}");
    }
    let x = Tensor::randn(&[2, 3, 64, 64], DType::F32, CPU, 3).unwrap();
    assert_eq!(model.forward(&x).unwrap().shape(), &[2, 3]);
    assert!(model.freeze(&["classifier.9.*"]).is_err());
}

/// Dropout (`classifier.0` and `.3`) acts in training mode only: in
/// evaluation mode the output is that of the same weights without
/// dropout; in training mode it is not, and its gradients still reach
/// every parameter.
#[test]
fn dropout_follows_the_training_mode() {
    let with = AlexNetConfig {
        dropout: 0.5,
        ..config()
    };
    let mut dropped = AlexNet::new(&with, DType::F64, CPU, 1).unwrap();
    let plain = AlexNet::new(&config(), DType::F64, CPU, 1).unwrap();
    let x = Tensor::randn(&[2, 3, 64, 64], DType::F64, CPU, 3).unwrap();
    let values = |t: Tensor| t.to_f64_vec().unwrap();
    let reference = values(plain.forward(&x).unwrap());
    let train = dropped.forward(&x).unwrap();
    assert_ne!(values(train.clone()), reference);
    train.sum_all().unwrap().backward().unwrap();
    for (n, p) in dropped.named_parameters() {
        assert!(p.grad().is_some(), "{n}");
    }
    dropped.set_training(false);
    assert_eq!(values(dropped.forward(&x).unwrap()), reference);
    assert_eq!(dropped.sync_batch_norm(None), 0);
}

/// Configurations that describe no network are typed errors.
#[test]
fn bad_configurations_are_errors() {
    let c = config();
    let bad = [
        AlexNetConfig {
            in_channels: 0,
            ..c.clone()
        },
        AlexNetConfig {
            widths: [4, 8, 0, 8, 8],
            ..c.clone()
        },
        AlexNetConfig {
            pool_size: 0,
            ..c.clone()
        },
        AlexNetConfig {
            hidden: 0,
            ..c.clone()
        },
        AlexNetConfig {
            num_classes: 0,
            ..c.clone()
        },
        AlexNetConfig {
            dropout: 1.5,
            ..c.clone()
        },
        AlexNetConfig {
            pool_size: usize::MAX,
            ..c.clone()
        },
    ];
    for cfg in bad {
        let got = AlexNet::new(&cfg, DType::F32, Device::Meta, 0);
        assert!(
            matches!(got, Err(Error::InvalidArgument { .. })),
            "{cfg:?}: {:?}",
            got.err()
        );
    }
}
