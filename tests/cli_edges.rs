//! The command line's edges: runs the machine cannot hold are refused
//! before they start (never an abort), `--json` writes only JSON to
//! stdout, a closed pipe ends the program quietly, and bad inputs (sizes
//! of 0, missing files, PyTorch pickles as weights) are clear errors.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn leangrad(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_leangrad"))
        .args(args)
        .output()
        .expect("the leangrad binary runs")
}

/// Asserts a failure with exit code 1 (not a signal, not a panic) whose
/// stderr contains every one of `expect`; returns stderr.
fn fails_with(args: &[&str], expect: &[&str]) -> String {
    let out = leangrad(args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
    assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    for e in expect {
        assert!(stderr.contains(e), "{args:?}: `{e}` missing in: {stderr}");
    }
    stderr
}

fn tempdir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("leangrad-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A folder with one small PNG image.
fn image_folder(root: &Path) -> PathBuf {
    let dir = root.join("images");
    std::fs::create_dir_all(&dir).unwrap();
    let img = leangrad::Tensor::rand(&[3, 40, 40], leangrad::DType::F32, leangrad::Device::Cpu, 1)
        .unwrap();
    leangrad::data::write_png(&img, dir.join("a.png"), leangrad::data::PngDepth::Eight).unwrap();
    dir
}

#[test]
fn runs_the_machine_cannot_hold_are_refused_with_the_shortfall() {
    // 10^7 hidden units: 4·10^14 bytes for one weight, far past any machine.
    fails_with(
        &["demo", "--hidden", "10000000", "--device", "cpu"],
        &["the demo needs", "TiB", "on cpu", "MemAvailable", "short"],
    );
    // Two million 224×224 images through ResNet-18: tens of TiB.
    fails_with(
        &[
            "memory", "--model", "resnet18", "--batch", "2000000", "--device", "cpu",
        ],
        &[
            "one resnet18 training step at batch 2000000 needs",
            "TiB",
            "short",
        ],
    );
    // The prediction alone runs on the meta device: no data, no refusal.
    let out = leangrad(&[
        "memory", "--model", "resnet18", "--batch", "2000000", "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(plan["lean"]["report"]["peak_total"].as_u64().unwrap() > 1 << 40);
}

#[test]
fn jobs_the_machine_cannot_hold_are_refused_before_they_start() {
    let root = tempdir("jobfit");
    let data = root.join("train");
    for class in ["cat", "dog"] {
        let dir = data.join(class);
        std::fs::create_dir_all(&dir).unwrap();
        let img =
            leangrad::Tensor::rand(&[3, 40, 40], leangrad::DType::F32, leangrad::Device::Cpu, 2)
                .unwrap();
        leangrad::data::write_png(&img, dir.join("a.png"), leangrad::data::PngDepth::Eight)
            .unwrap();
    }
    let data = data.to_str().unwrap();
    let out = root.join("ckpt");
    // A step of two million 224×224 images: predicted on meta, refused on
    // the CPU with the shortfall before any image is decoded.
    fails_with(
        &[
            "finetune",
            "--data",
            data,
            "--batch",
            "2000000",
            "--device",
            "cpu",
            "--out",
            out.to_str().unwrap(),
        ],
        &["one training step needs", "TiB", "on cpu", "short"],
    );
    assert!(!out.join("epoch-1").exists());
    let adv = root.join("adv");
    fails_with(
        &[
            "adversarial",
            "--images",
            data,
            "--batch",
            "2000000",
            "--device",
            "cpu",
            "--out",
            adv.to_str().unwrap(),
        ],
        &["one attack step needs", "TiB", "short"],
    );
}

#[test]
fn zero_sizes_are_errors_naming_the_option() {
    fails_with(&["demo", "--hidden", "0"], &["--hidden must be at least 1"]);
    fails_with(&["demo", "--points", "0"], &["--points must be at least 1"]);
    fails_with(&["demo", "--steps", "0"], &["--steps must be at least 1"]);
    fails_with(&["demo", "--lr=-1"], &["--lr must be a positive number"]);
    fails_with(
        &["demo", "--lr", "NaN"],
        &["--lr must be a positive number"],
    );
    let root = tempdir("zero");
    let images = image_folder(&root);
    let (images, out) = (images.to_str().unwrap(), root.join("out"));
    let out = out.to_str().unwrap();
    for (flag, expect) in [
        ("--batch", "batch, size and classes must be at least 1"),
        ("--size", "batch, size and classes must be at least 1"),
        ("--classes", "batch, size and classes must be at least 1"),
        ("--steps", "steps must be at least 1"),
    ] {
        let args = ["adversarial", "--images", images, "--out", out, flag, "0"];
        fails_with(&args, &[expect]);
    }
    for flag in ["--batch", "--size", "--epochs"] {
        let args = ["finetune", "--data", images, flag, "0"];
        fails_with(&args, &["batch, size and epochs must be at least 1"]);
    }
    for flag in ["--size", "--steps"] {
        let png = format!("{images}/a.png");
        let args = [
            "style",
            "--content",
            &png,
            "--style",
            &png,
            "--out",
            out,
            flag,
            "0",
        ];
        fails_with(&args, &["size and steps must be at least 1"]);
    }
    let memory = ["memory", "--model", "resnet18", "--batch", "0"];
    let stderr = String::from_utf8_lossy(&leangrad(&memory).stderr).into_owned();
    assert!(
        stderr.contains("--batch") && stderr.contains("0"),
        "{stderr}"
    );
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn missing_weights_name_the_file_and_pickles_say_how_to_convert() {
    let root = tempdir("weights");
    let images = image_folder(&root);
    let (images, out) = (images.to_str().unwrap(), root.join("out"));
    let out = out.to_str().unwrap();
    let attack = |weights: &Path| -> String {
        let w = weights.to_str().unwrap();
        let args = [
            "adversarial",
            "--images",
            images,
            "--out",
            out,
            "--size",
            "32",
            "--weights",
            w,
        ];
        let stderr = fails_with(&args, &[]);
        assert!(stderr.contains(w), "the message names the file: {stderr}");
        stderr
    };
    let missing = root.join("no-such.safetensors");
    let stderr = attack(&missing);
    assert!(stderr.contains("cannot read"), "{stderr}");
    // The system's reason once, not repeated by the error's cause.
    assert_eq!(stderr.matches("No such file").count(), 1, "{stderr}");
    let convert = "safetensors.torch.save_file(torch.load(";
    // torch.save's zip format (PyTorch ≥ 1.6), under a .pt name, cut
    // short: read as a PyTorch file and refused as damaged, naming it.
    let zip = root.join("resnet18.pt");
    std::fs::write(&zip, b"PK\x03\x04\x00\x00\x08\x08archive/data.pkl").unwrap();
    let stderr = attack(&zip);
    assert!(stderr.contains("malformed weights"), "{stderr}");
    // The legacy bare pickle (protocol 2), recognised by its bytes whatever
    // the file is called.
    let legacy = root.join("weights.safetensors");
    std::fs::write(&legacy, b"\x80\x02\x8a\x0alZ\xfc\x9cF\xf9 j\xa8P\x19.").unwrap();
    let stderr = attack(&legacy);
    assert!(
        stderr.contains("PyTorch pickle") && stderr.contains(convert),
        "{stderr}"
    );
    // A damaged safetensors file is still called damaged, not a pickle.
    let junk = root.join("junk.safetensors");
    std::fs::write(&junk, b"definitely not weights").unwrap();
    let stderr = attack(&junk);
    assert!(
        stderr.contains("malformed weights") && !stderr.contains("pickle"),
        "{stderr}"
    );
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn json_goes_alone_to_stdout() {
    let demo = leangrad(&[
        "demo", "--steps", "3", "--points", "10", "--json", "--device", "cpu",
    ]);
    assert!(demo.status.success());
    let v: serde_json::Value = serde_json::from_slice(&demo.stdout).expect("only JSON");
    assert!(v["devices"].is_array(), "{v}");
    let progress = String::from_utf8_lossy(&demo.stderr);
    assert!(
        progress.contains("step     2") && progress.contains("accuracy"),
        "{progress}"
    );

    let memory = leangrad(&[
        "memory", "--model", "resnet18", "--batch", "2", "--size", "32", "--json",
    ]);
    assert!(memory.status.success());
    serde_json::from_slice::<serde_json::Value>(&memory.stdout).expect("only JSON");

    let root = tempdir("json");
    let images = image_folder(&root);
    let out = root.join("out");
    let args = [
        "adversarial",
        "--images",
        images.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--size",
        "32",
        "--attack",
        "fgsm",
        "--batch",
        "1",
        "--device",
        "cpu",
        "--json",
    ];
    let adv = leangrad(&args);
    assert!(
        adv.status.success(),
        "{}",
        String::from_utf8_lossy(&adv.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&adv.stdout).expect("only JSON");
    assert_eq!(
        report["images"].as_array().map(Vec::len),
        Some(1),
        "{report}"
    );
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn a_closed_pipe_ends_the_program_quietly() {
    // `leangrad demo | head -1`: the reader leaves after the first line
    // while the demo still has lines to print.
    let mut child = Command::new(env!("CARGO_BIN_EXE_leangrad"))
        .args([
            "demo", "--steps", "20000", "--points", "10", "--device", "cpu",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(first.starts_with("training a 2-64-64-3 MLP"), "{first}");
    // The reader is dropped: stdout is closed.
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}: {stderr}", out.status);
    assert!(stderr.is_empty(), "{stderr}");
}
