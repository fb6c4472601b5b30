//! How the jobs read a `--weights` file: every name and shape checked on
//! the meta device before the model is built, a head of any class count,
//! backbone-only files, non-strict loading, prefixes, and mismatch errors a
//! person can read (counts, the first few names, hints).

use leangrad::io::{save_safetensors, state_dict};
use leangrad::jobs::{build_classifier, image_model, image_model_with, WeightsLoading};
use leangrad::{DType, Device, Error, Tensor};
use std::path::PathBuf;
use std::time::Instant;

const CPU: Device = Device::Cpu;

fn file(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("leangrad-weights-{}-{name}", std::process::id()))
}

/// The state dict of `model` (classes `classes`, seed 0) with `keep`
/// deciding which entries go into the file, renamed by `rename`.
fn saved(
    model: &str,
    classes: usize,
    name: &str,
    keep: impl Fn(&str) -> bool,
    rename: impl Fn(&str) -> String,
) -> PathBuf {
    let m = build_classifier(model, classes, CPU).unwrap();
    let entries: Vec<(String, Tensor)> = state_dict(m.as_ref(), "")
        .into_iter()
        .filter(|(n, _)| keep(n))
        .map(|(n, t)| (rename(&n), t))
        .collect();
    let path = file(name);
    save_safetensors(&path, &entries).unwrap();
    path
}

fn values(model: &dyn leangrad::jobs::ImageClassifier, name: &str) -> Vec<f32> {
    state_dict(model, "")
        .into_iter()
        .find(|(n, _)| n == name)
        .unwrap()
        .1
        .to_vec::<f32>()
        .unwrap()
}

fn mismatch_text(e: Error) -> String {
    assert!(matches!(e, Error::StateDictMismatch { .. }), "{e}");
    e.to_string()
}

#[test]
fn a_scalar_or_malformed_head_is_a_typed_error_before_anything_is_built() {
    for (shape, label) in [
        (vec![], "scalar"),
        (vec![1_000_000, 0], "empty-million"),
        (vec![10], "vector"),
        (vec![0, 512], "no-classes"),
    ] {
        let path = file(label);
        let t = Tensor::zeros(&shape, DType::F32, CPU).unwrap();
        save_safetensors(&path, &[("fc.weight".to_string(), t)]).unwrap();
        let start = Instant::now();
        match image_model("resnet18", Some(&path), 10, CPU) {
            Err(Error::MalformedWeights { tensor, reason, .. }) => {
                assert_eq!(tensor.as_deref(), Some("fc.weight"), "{label}");
                assert!(reason.contains("[classes, 512]"), "{label}: {reason}");
            }
            Err(e) => panic!("{label}: {e}"),
            Ok(_) => panic!("{label}: loaded"),
        }
        // Refused from the file's header alone: no million-class model.
        assert!(start.elapsed().as_secs_f64() < 5.0, "{label}");
        std::fs::remove_file(&path).unwrap();
    }
}

#[test]
fn a_backbone_only_file_loads_and_the_classifier_starts_fresh() {
    let path = saved(
        "resnet18",
        1000,
        "backbone",
        |n| !n.starts_with("fc."),
        |n: &str| n.to_string(),
    );
    let loaded =
        image_model_with("resnet18", Some(&path), &WeightsLoading::default(), 3, CPU).unwrap();
    let note = loaded.weights.unwrap();
    assert_eq!(note.fresh, ["fc.bias", "fc.weight"]);
    assert!(note.ignored.is_empty());
    assert_eq!(note.loaded, state_dict(loaded.model.as_ref(), "").len() - 2);
    assert_eq!(loaded.model.num_classes(), 3);
    let source = build_classifier("resnet18", 1000, CPU).unwrap();
    assert_eq!(
        values(loaded.model.as_ref(), "layer4.1.conv2.weight"),
        values(source.as_ref(), "layer4.1.conv2.weight")
    );
    std::fs::remove_file(&path).unwrap();

    // MobileNetV2's classifier (Dropout, Linear) absent.
    let path = saved(
        "mobilenet_v2",
        1000,
        "mobilenet-features",
        |n| n.starts_with("features."),
        |n: &str| n.to_string(),
    );
    let loaded = image_model_with(
        "mobilenet_v2",
        Some(&path),
        &WeightsLoading::default(),
        5,
        CPU,
    )
    .unwrap();
    assert_eq!(
        loaded.weights.unwrap().fresh,
        ["classifier.1.bias", "classifier.1.weight"]
    );
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn a_file_missing_part_of_the_backbone_is_refused_unless_not_strict() {
    let path = saved(
        "resnet18",
        1000,
        "partial",
        |n| !n.starts_with("layer4.1.bn2."),
        |n: &str| n.to_string(),
    );
    let text = mismatch_text(image_model("resnet18", Some(&path), 10, CPU).err().unwrap());
    assert!(text.contains("5 missing"), "{text}");
    assert!(text.contains("layer4.1.bn2.bias"), "{text}");
    let lax = WeightsLoading {
        strict: false,
        ..WeightsLoading::default()
    };
    let loaded = image_model_with("resnet18", Some(&path), &lax, 10, CPU).unwrap();
    assert_eq!(loaded.weights.unwrap().fresh.len(), 5);
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn prefixes_are_hinted_and_can_be_stripped_or_added() {
    let ddp = saved("resnet18", 10, "ddp", |_| true, |n| format!("module.{n}"));
    let text = mismatch_text(image_model("resnet18", Some(&ddp), 10, CPU).err().unwrap());
    assert!(
        text.contains("hint: the file's names start with `module.`"),
        "{text}"
    );
    // One line per kind of problem, not one line of every name.
    assert!(text.lines().all(|l| l.len() < 400), "{text}");
    assert!(text.contains("… and "), "{text}");
    let strip = WeightsLoading {
        strip_prefix: "module.".into(),
        ..WeightsLoading::default()
    };
    let loaded = image_model_with("resnet18", Some(&ddp), &strip, 10, CPU).unwrap();
    let note = loaded.weights.unwrap();
    assert!(note.fresh.is_empty() && note.ignored.is_empty());
    std::fs::remove_file(&ddp).unwrap();

    // A file saved from `model.layer1` style sub-module names needs a prefix
    // added: here everything but `layer1.` stripped of it.
    let bare = saved(
        "resnet18",
        10,
        "bare",
        |n| n.starts_with("layer1."),
        |n| n.trim_start_matches("layer1.").to_string(),
    );
    let lax = WeightsLoading {
        strict: false,
        ..WeightsLoading::default()
    };
    let text = mismatch_text(image_model("resnet18", Some(&bare), 10, CPU).err().unwrap());
    assert!(text.contains("add that prefix"), "{text}");
    let added = WeightsLoading {
        add_prefix: "layer1.".into(),
        ..lax
    };
    let loaded = image_model_with("resnet18", Some(&bare), &added, 10, CPU).unwrap();
    assert!(loaded.weights.unwrap().ignored.is_empty());
    std::fs::remove_file(&bare).unwrap();
}

#[test]
fn a_file_of_another_model_says_which_model_it_looks_like() {
    let path = saved(
        "mobilenet_v2",
        1000,
        "mobilenet",
        |_| true,
        |n: &str| n.to_string(),
    );
    let text = mismatch_text(
        image_model("resnet18", Some(&path), 1000, CPU)
            .err()
            .unwrap(),
    );
    println!("{text}");
    assert!(
        text.contains("this file looks like mobilenet_v2, not resnet18"),
        "{text}"
    );
    let first = text.lines().next().unwrap();
    assert!(
        first.contains("missing") && first.contains("unexpected"),
        "{first}"
    );
    std::fs::remove_file(&path).unwrap();
}
