//! `leangrad finetune` as a library function on a tiny image folder:
//! what trains, resuming bit for bit, fused = usual, memory and errors.

use leangrad::data::{write_png, PngDepth};
use leangrad::io::load_safetensors;
use leangrad::jobs::finetune::{run, FinetuneOptions};
use leangrad::memory_plan::OptimizerKind;
use leangrad::{DType, Device, Error, Tensor};
use std::path::{Path, PathBuf};

fn tempdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("leangrad-ft-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Six 40×40 images per class: `dark/` in [0, 0.4], `light/` in [0.6, 1].
fn folder(root: &Path, name: &str, classes: &[&str]) -> PathBuf {
    let dir = root.join(name);
    for (c, class) in classes.iter().enumerate() {
        std::fs::create_dir_all(dir.join(class)).unwrap();
        for i in 0..6 {
            let lo = if c == 0 { 0.0 } else { 0.6 };
            let t = Tensor::rand_range(
                &[3, 40, 40],
                lo,
                lo + 0.4,
                DType::F32,
                Device::Cpu,
                (10 * c + i) as u64,
            )
            .unwrap();
            write_png(
                &t,
                dir.join(class).join(format!("{i}.png")),
                PngDepth::Eight,
            )
            .unwrap();
        }
    }
    dir
}

fn options(root: &Path) -> FinetuneOptions {
    FinetuneOptions {
        size: 32,
        batch: 4,
        epochs: 2,
        lr: 0.05,
        workers: 1,
        val: Some(folder(root, "val", &["dark", "light"])),
        ..FinetuneOptions::new("resnet18", folder(root, "train", &["dark", "light"]))
    }
}

fn weights(ckpt: &Path) -> Vec<(String, Vec<u8>)> {
    load_safetensors(ckpt.join("model.safetensors"))
        .unwrap()
        .into_iter()
        .map(|(n, t)| {
            (
                n,
                t.to_vec::<f32>()
                    .map(|v| v.iter().flat_map(|x| x.to_le_bytes()).collect())
                    .unwrap_or_default(),
            )
        })
        .collect()
}

#[test]
fn the_head_trains_and_a_resumed_run_ends_bit_for_bit_where_an_unbroken_one_does() {
    let root = tempdir("resume");
    let whole = run(&FinetuneOptions {
        out: Some(root.join("whole")),
        ..options(&root)
    })
    .unwrap();
    assert!(whole.random_init);
    assert_eq!(whole.classes, ["dark", "light"]);
    // linear-bn-eval on ResNet-18: only fc (512·2 + 2) trains.
    assert_eq!(whole.trainable_parameters, 512 * 2 + 2);
    assert_eq!(whole.epochs.len(), 2);
    for e in &whole.epochs {
        assert!(e.train_loss.is_finite());
        let v = e.val_accuracy.unwrap();
        assert!((0.0..=1.0).contains(&v));
    }
    assert!(whole.memory.lean_step_bytes <= whole.memory.pytorch_step_bytes);
    assert!(whole.memory.measured_peak_bytes > 0);

    // The backbone is untouched: every tensor but fc equals a fresh model's.
    let fresh = leangrad::jobs::image_model("resnet18", None, 2, Device::Cpu).unwrap();
    let mut fresh: Vec<(String, Tensor)> = leangrad::io::state_dict(fresh.as_ref(), "");
    fresh.sort_by(|a, b| a.0.cmp(&b.0));
    let trained = weights(&root.join("whole"));
    assert_eq!(fresh.len(), trained.len());
    let mut changed = Vec::new();
    for ((name, t), (n2, bytes)) in fresh.iter().zip(&trained) {
        assert_eq!(name, n2);
        let same = t
            .to_vec::<f32>()
            .map(|v| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>() == *bytes)
            .unwrap_or(true);
        if !same {
            changed.push(name.clone());
        }
    }
    assert_eq!(changed, ["fc.bias", "fc.weight"]);

    // One epoch, then a resumed second one: the same bytes.
    run(&FinetuneOptions {
        epochs: 1,
        out: Some(root.join("first")),
        ..options(&root)
    })
    .unwrap();
    let resumed = run(&FinetuneOptions {
        resume: Some(root.join("first")),
        out: Some(root.join("resumed")),
        ..options(&root)
    })
    .unwrap();
    assert_eq!(resumed.first_epoch, 1);
    assert_eq!(resumed.epochs.len(), 1);
    assert_eq!(weights(&root.join("resumed")), trained);
    assert_eq!(
        resumed.epochs[0].train_loss.to_bits(),
        whole.epochs[1].train_loss.to_bits()
    );
}

#[test]
fn the_fused_update_gives_the_usual_one_bit_for_bit() {
    let root = tempdir("fused");
    for optimizer in [OptimizerKind::Sgd, OptimizerKind::Adamw] {
        let usual = run(&FinetuneOptions {
            optimizer,
            epochs: 1,
            out: Some(root.join("usual")),
            ..options(&root)
        })
        .unwrap();
        let fused = run(&FinetuneOptions {
            optimizer,
            epochs: 1,
            fused: true,
            out: Some(root.join("fused")),
            ..options(&root)
        })
        .unwrap();
        assert_eq!(weights(&root.join("usual")), weights(&root.join("fused")));
        assert_eq!(
            usual.epochs[0].train_loss.to_bits(),
            fused.epochs[0].train_loss.to_bits()
        );
    }
}

#[test]
fn checkpointed_blocks_train_the_same_weights() {
    let root = tempdir("gradient-checkpointing");
    let plain = run(&FinetuneOptions {
        case: "all".into(),
        epochs: 1,
        out: Some(root.join("plain")),
        ..options(&root)
    })
    .unwrap();
    let segments = run(&FinetuneOptions {
        case: "all".into(),
        epochs: 1,
        gradient_checkpointing: true,
        out: Some(root.join("segments")),
        ..options(&root)
    })
    .unwrap();
    assert_eq!(
        weights(&root.join("plain")),
        weights(&root.join("segments"))
    );
    assert_eq!(
        plain.epochs[0].train_loss.to_bits(),
        segments.epochs[0].train_loss.to_bits()
    );
    // At this size the parameters, gradients and momentum make the peak;
    // the segments never add to it.
    assert!(
        segments.memory.lean_step_bytes <= plain.memory.lean_step_bytes,
        "{} vs {}",
        segments.memory.lean_step_bytes,
        plain.memory.lean_step_bytes
    );
}

#[test]
fn mismatched_folders_and_bad_options_are_typed_errors() {
    let root = tempdir("errors");
    let other = folder(&root, "other", &["dark", "medium", "light"]);
    match run(&FinetuneOptions {
        val: Some(other.clone()),
        ..options(&root)
    }) {
        Err(Error::Image { path, .. }) => assert_eq!(path, other),
        r => panic!("{:?}", r.map(|r| r.epochs)),
    }
    assert!(matches!(
        run(&FinetuneOptions {
            lr: -1.0,
            ..options(&root)
        }),
        Err(Error::InvalidArgument { .. })
    ));
    assert!(run(&FinetuneOptions {
        case: "nonsense".into(),
        ..options(&root)
    })
    .is_err());
    let missing = root.join("missing");
    assert!(matches!(
        run(&FinetuneOptions::new("resnet18", &missing)),
        Err(Error::Image { .. })
    ));
}

/// Eight 40×40 images per class, each class one dominant colour channel.
fn colour_folder(root: &Path, name: &str) -> PathBuf {
    let dir = root.join(name);
    for (c, class) in ["blue", "green", "red"].iter().enumerate() {
        std::fs::create_dir_all(dir.join(class)).unwrap();
        for i in 0..8 {
            let noise = Tensor::rand_range(
                &[3, 40, 40],
                0.0,
                0.3,
                DType::F32,
                Device::Cpu,
                (100 * c + i) as u64,
            )
            .unwrap();
            let mut bias = vec![0.0f32; 3];
            bias[2 - c] = 0.6; // blue → channel 2, green → 1, red → 0
            let bias = Tensor::from_vec(bias, &[3, 1, 1], Device::Cpu).unwrap();
            let t = noise.add(&bias).unwrap();
            write_png(
                &t,
                dir.join(class).join(format!("{i}.png")),
                PngDepth::Eight,
            )
            .unwrap();
        }
    }
    dir
}

#[test]
fn three_classes_are_learnt_and_the_trained_model_is_then_attacked() {
    use leangrad::jobs::adversarial::{self, AdversarialOptions, Attack};
    let root = tempdir("three");
    let data = colour_folder(&root, "train");
    let r = run(&FinetuneOptions {
        size: 32,
        batch: 4,
        epochs: 4,
        lr: 0.05,
        workers: 1,
        out: Some(root.join("ckpt")),
        ..FinetuneOptions::new("resnet18", &data)
    })
    .unwrap();
    let last = r.epochs.last().unwrap();
    assert!(last.train_accuracy >= 0.9, "{:?}", r.epochs);
    assert!(last.train_loss < r.epochs[0].train_loss, "{:?}", r.epochs);

    // The fine-tuned weights (a 3-class head) attacked by PGD: labels from
    // the class folders would be names, so the clean predictions stand in.
    let flat = root.join("attack");
    std::fs::create_dir_all(&flat).unwrap();
    for class in ["blue", "green", "red"] {
        for i in 0..2 {
            std::fs::copy(
                data.join(class).join(format!("{i}.png")),
                flat.join(format!("{class}{i}.png")),
            )
            .unwrap();
        }
    }
    let a = adversarial::run(&AdversarialOptions {
        weights: Some(root.join("ckpt").join("model.safetensors")),
        classes: 3,
        size: 32,
        batch: 3,
        eps: 0.1,
        alpha: 0.02,
        steps: 10,
        attack: Attack::Pgd,
        ..AdversarialOptions::new("resnet18", &flat, root.join("adv"))
    })
    .unwrap();
    assert!(!a.random_init);
    let changed = a.images.iter().filter(|i| i.adversarial != i.clean).count();
    assert!(changed * 2 > a.images.len(), "{:?}", a.images);
    assert!(a.linf_max <= 0.1 + 1e-6);
}

/// Every file under `dir` with its bytes, sorted.
fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                found.push((p.clone(), std::fs::read(&p).unwrap()));
            }
        }
    }
    found.sort();
    found
}

#[test]
fn out_pointing_at_a_folder_of_the_users_is_refused_before_training() {
    let root = tempdir("out-data");
    let opts = options(&root);
    let before = snapshot(&opts.data);
    match run(&FinetuneOptions {
        out: Some(opts.data.clone()),
        ..opts.clone()
    }) {
        Err(Error::Checkpoint { entry, reason }) => {
            assert_eq!(entry, opts.data.display().to_string());
            assert!(reason.contains("choose another"), "{reason}");
        }
        r => panic!("{:?}", r.map(|r| r.epochs)),
    }
    assert_eq!(snapshot(&opts.data), before, "the images survive");
    // A file among them survives too, and no sibling folder appears.
    let keep = root.join("keep");
    std::fs::create_dir_all(&keep).unwrap();
    std::fs::write(keep.join("notes.txt"), b"mine").unwrap();
    assert!(run(&FinetuneOptions {
        out: Some(keep.clone()),
        ..opts
    })
    .is_err());
    assert_eq!(std::fs::read(keep.join("notes.txt")).unwrap(), b"mine");
    assert!(!root.join("keep.previous").exists() && !root.join("keep.partial").exists());
}

#[test]
fn a_resumed_checkpoint_past_the_last_epoch_is_refused_and_kept() {
    let root = tempdir("resume-past");
    let ckpt = root.join("ckpt");
    let opts = FinetuneOptions {
        epochs: 1,
        val: None,
        out: Some(ckpt.clone()),
        ..options(&root)
    };
    run(&opts).unwrap();
    let manifest = ckpt.join("checkpoint.json");
    let mut json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&manifest).unwrap()).unwrap();
    json["progress"]["epoch"] = serde_json::json!(1u64 << 53);
    std::fs::write(&manifest, serde_json::to_vec(&json).unwrap()).unwrap();
    let before = snapshot(&ckpt);
    let resumed = FinetuneOptions {
        epochs: 3,
        resume: Some(ckpt.clone()),
        ..opts
    };
    match run(&resumed) {
        Err(Error::InvalidArgument { msg, .. }) => {
            assert!(msg.contains("nothing is left"), "{msg}")
        }
        r => panic!("{:?}", r.map(|r| r.first_epoch)),
    }
    assert_eq!(snapshot(&ckpt), before, "the checkpoint is not overwritten");
}
