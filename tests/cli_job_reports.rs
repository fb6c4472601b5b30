//! What the jobs' commands tell people: each attacked image's clean and
//! adversarial prediction with the model's confidence (and class names
//! from `--labels`), user-facing names of attacks and optimizers (never
//! Rust's `Debug` names), `finetune --json`'s wall time, and a style
//! transfer that diverges stopping with an error that says what to try.

use leangrad::data::{write_png, PngDepth};
use leangrad::{DType, Device, Tensor};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn leangrad(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_leangrad"))
        .args(args)
        .output()
        .expect("the leangrad binary runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn tempdir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("leangrad-reports-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Images `3/a.png`, `3/b.png` and `7/c.png` in `root/images`.
fn images(root: &Path) -> PathBuf {
    let dir = root.join("images");
    for (i, (class, name)) in [("3", "a"), ("3", "b"), ("7", "c")].iter().enumerate() {
        std::fs::create_dir_all(dir.join(class)).unwrap();
        let t =
            Tensor::rand_range(&[3, 36, 36], 0.2, 0.8, DType::F32, Device::Cpu, i as u64).unwrap();
        write_png(
            &t,
            dir.join(class).join(format!("{name}.png")),
            PngDepth::Eight,
        )
        .unwrap();
    }
    dir
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn adversarial_reports_each_image_with_confidences_and_class_names() {
    let root = tempdir("adv");
    let images = images(&root);
    let labels = root.join("classes.txt");
    let names: Vec<String> = (0..10).map(|i| format!("thing number {i}")).collect();
    std::fs::write(&labels, names.join("\n") + "\n").unwrap();
    let out = root.join("adv");
    let base = [
        "adversarial",
        "--images",
        s(&images),
        "--size",
        "32",
        "--classes",
        "10",
        "--attack",
        "pgd-l2",
        "--eps",
        "0.5",
        "--alpha",
        "0.2",
        "--steps",
        "2",
        "--device",
        "cpu",
        "--out",
        s(&out),
    ];
    let with = |extra: &[&str]| -> Output {
        let mut args = base.to_vec();
        args.extend_from_slice(extra);
        leangrad(&args)
    };

    let o = with(&["--labels", s(&labels), "--json"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let v: Value = serde_json::from_slice(&o.stdout).expect("only JSON");
    assert_eq!(v["attack"], "PGD-L2");
    let imgs = v["images"].as_array().unwrap();
    assert_eq!(imgs.len(), 3);
    for img in imgs {
        for (class, name, p) in [
            ("clean", "clean_name", "clean_confidence"),
            ("adversarial", "adversarial_name", "adversarial_confidence"),
        ] {
            let c = img[class].as_u64().unwrap() as usize;
            assert_eq!(img[name], names[c].as_str(), "{img}");
            // A probability, and the largest of 10: at least 1/10.
            let p = img[p].as_f64().unwrap();
            assert!((0.1..=1.0).contains(&p), "{img}");
        }
    }

    let o = with(&["--labels", s(&labels)]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let stdout = text(&o.stdout);
    assert!(stdout.contains(": PGD-L2 eps 0.5000"), "{stdout}");
    assert!(!stdout.contains("PgdL2"), "{stdout}");
    // One line per image, in the order of the JSON run (the same attack:
    // same seed, same images), with the names and confidences.
    for (file, img) in ["3/a.png", "3/b.png", "7/c.png"].iter().zip(imgs) {
        let label = &file[..1];
        let line = format!(
            "  {file} (label {label}): {} {} ({:.1}%) → {} {} ({:.1}%)",
            img["clean"],
            img["clean_name"].as_str().unwrap(),
            100.0 * img["clean_confidence"].as_f64().unwrap(),
            img["adversarial"],
            img["adversarial_name"].as_str().unwrap(),
            100.0 * img["adversarial_confidence"].as_f64().unwrap(),
        );
        assert!(stdout.contains(&line), "`{line}` missing in:\n{stdout}");
    }

    // Without names: class indices.
    let o = with(&[]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let stdout = text(&o.stdout);
    let clean = imgs[0]["clean"].as_u64().unwrap();
    assert!(
        stdout.contains(&format!("  3/a.png (label 3): class {clean} (")),
        "{stdout}"
    );

    // A labels file of another length: an error naming it and both
    // counts, before anything is written.
    let short = root.join("short.txt");
    std::fs::write(&short, "cat\ndog\n").unwrap();
    let fresh = root.join("never");
    let mut args = base.to_vec();
    let last = args.len() - 1;
    args[last] = s(&fresh);
    args.extend(["--labels", s(&short)]);
    let o = leangrad(&args);
    let stderr = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(s(&short)), "{stderr}");
    assert!(stderr.contains("2 class names"), "{stderr}");
    assert!(stderr.contains("10 classes"), "{stderr}");
    assert!(!fresh.exists());
}

#[test]
fn style_names_its_optimizer_and_finetune_json_has_its_wall_time() {
    let root = tempdir("names");
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/style");
    let out = root.join("styled.png");
    let style = |extra: &[&str]| {
        let mut args = vec![
            "style",
            "--content",
            s(&fixtures.join("content.png")),
            "--style",
            s(&fixtures.join("style.png")),
            "--model",
            "vgg16",
            "--size",
            "16",
            "--steps",
            "2",
            "--device",
            "cpu",
            "--out",
            s(&out),
        ]
        .into_iter()
        .map(String::from)
        .collect::<Vec<_>>();
        args.extend(extra.iter().map(|a| a.to_string()));
        Command::new(env!("CARGO_BIN_EXE_leangrad"))
            .args(&args)
            .output()
            .unwrap()
    };
    let o = style(&[]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let stdout = text(&o.stdout);
    assert!(stdout.contains(", 2 L-BFGS steps (lr 1)"), "{stdout}");
    assert!(!stdout.contains("Lbfgs"), "{stdout}");
    let o = style(&["--optimizer", "adam", "--json"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["optimizer"], "Adam");
    assert_eq!(v["input_convention"], "torchvision");
    assert_eq!(v["diverged"], Value::Null);

    // finetune --json: `seconds`, the run's wall time, as the other jobs.
    let data = root.join("train");
    for class in ["dark", "light"] {
        std::fs::create_dir_all(data.join(class)).unwrap();
        for i in 0..2 {
            let t = Tensor::rand(&[3, 36, 36], DType::F32, Device::Cpu, i).unwrap();
            write_png(
                &t,
                data.join(class).join(format!("{i}.png")),
                PngDepth::Eight,
            )
            .unwrap();
        }
    }
    let started = std::time::Instant::now();
    let o = leangrad(&[
        "finetune",
        "--data",
        s(&data),
        "--size",
        "32",
        "--batch",
        "2",
        "--workers",
        "1",
        "--device",
        "cpu",
        "--json",
    ]);
    let elapsed = started.elapsed().as_secs_f64();
    assert!(o.status.success(), "{}", text(&o.stderr));
    let v: Value = serde_json::from_slice(&o.stdout).expect("only JSON");
    let seconds = v["seconds"].as_f64().expect("seconds");
    assert!(
        seconds > 0.0 && seconds <= elapsed,
        "{seconds} of {elapsed}"
    );
}

#[test]
fn a_diverging_style_transfer_stops_and_says_what_to_try() {
    let root = tempdir("diverge");
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/style");
    // A style weight past f32's range: the very first loss is infinite
    // (or not a number), as a run blowing up ends.
    let out = root.join("styled.png");
    let (content, style) = (fixtures.join("content.png"), fixtures.join("style.png"));
    let run = |extra: &[&str]| {
        let mut args = vec![
            "style",
            "--content",
            s(&content),
            "--style",
            s(&style),
            "--size",
            "16",
            "--steps",
            "3",
            "--device",
            "cpu",
            "--model",
            "vgg16",
            "--style-weight",
            "1e300",
            "--out",
            s(&out),
        ];
        args.extend_from_slice(extra);
        leangrad(&args)
    };
    let o = run(&[]);
    let stderr = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("style diverged: the loss became"),
        "{stderr}"
    );
    assert!(stderr.contains("at step 1"), "{stderr}");
    for hint in [
        "--lr",
        "--optimizer adam",
        "--input-convention caffe",
        "--keep-going",
    ] {
        assert!(stderr.contains(hint), "`{hint}` missing in: {stderr}");
    }
    assert!(!out.exists(), "no result written");
    let o = run(&["--keep-going", "--json"]);
    let stderr = text(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    assert!(stderr.contains("warning: style diverged"), "{stderr}");
    let v: Value = serde_json::from_slice(&o.stdout).expect("only JSON");
    assert!(v["diverged"].as_str().is_some(), "{v}");
    assert!(out.exists());
}
