//! Damaged and hostile inputs: image files whose header claims more than
//! the host can hold (refused from the header, before decoding), truncated
//! and corrupt JPEGs and PNGs (errors naming the file, as PIL's "image
//! file is truncated"), sizes from arguments that would overflow or
//! exhaust memory (typed errors, never an abort), BERT `config.json`
//! files out of range, and data loaders asked for too many threads.

use std::path::{Path, PathBuf};
use std::time::Instant;

use leangrad::data::{
    make_grid, pad, read_image, read_image_header, read_image_with, resize, ColorMode, DataLoader,
    ImageFolder, PaddingMode, Resize, SampleRng, MAX_IMAGE_PIXELS, MAX_WORKERS,
};
use leangrad::models::{Bert, BertConfig};
use leangrad::{DType, Device, Error, Tensor};

fn tempdir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("leangrad-inputs-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/data")
        .join(name)
}

/// A gray PNG of `w × h` zero pixels written by the `png` route of the
/// `image` crate (a 1×100000 one is a few hundred bytes).
fn gray_png(path: &Path, w: u32, h: u32) {
    let img = image::GrayImage::new(w, h);
    img.save_with_format(path, image::ImageFormat::Png).unwrap();
}

/// The message of an [`Error::Image`], which must name `path`.
fn image_error_for(err: Error, path: &Path) -> String {
    match &err {
        Error::Image { path: p, reason } if p == path => reason.clone(),
        other => panic!(
            "expected Error::Image naming {}, got {other:?}",
            path.display()
        ),
    }
}

#[test]
fn a_thin_image_whose_resize_cannot_fit_is_refused_from_its_header() {
    let dir = tempdir("thin");
    let path = dir.join("thin.png");
    gray_png(&path, 1, 100_000);
    let header = read_image_header(&path).unwrap();
    assert_eq!(
        (header.width, header.height, header.channels),
        (1, 100_000, 1)
    );
    // Its shorter side to 224 is 224 × 22400000: 56 GiB of f32 RGB.
    let start = Instant::now();
    let err = read_image_with(
        &path,
        ColorMode::Rgb,
        &Resize::shorter(224),
        &mut SampleRng::new(0),
    )
    .unwrap_err();
    let reason = image_error_for(err, &path);
    assert!(
        reason.contains("100000×1") && reason.contains("[3, 22400000, 224]"),
        "{reason}"
    );
    assert!(reason.contains("available"), "{reason}");
    assert!(start.elapsed().as_secs_f64() < 5.0, "{:?}", start.elapsed());
    // Read without the resize it is small, and reads.
    assert_eq!(read_image(&path).unwrap().shape(), &[3, 100_000, 1]);
}

#[test]
fn a_header_of_more_pixels_than_pil_decodes_is_refused() {
    let dir = tempdir("bomb");
    let path = dir.join("bomb.png");
    // 20000 × 10000 = 2e8 pixels > 178956970, in a small file.
    gray_png(&path, 20_000, 10_000);
    let reason = image_error_for(read_image(&path).unwrap_err(), &path);
    assert!(
        reason.contains(&MAX_IMAGE_PIXELS.to_string()) && reason.contains("20000×10000"),
        "{reason}"
    );
}

/// Every cut of a valid JPEG, from just after its header to just before
/// its last byte, is an error naming the file (zune-jpeg alone fills the
/// missing rows with grey).
#[test]
fn truncated_jpegs_are_errors_naming_the_file() {
    let bytes = std::fs::read(fixture("rgb_16x24.jpg")).unwrap();
    let whole = read_image(fixture("rgb_16x24.jpg")).unwrap();
    assert_eq!(whole.shape(), &[3, 16, 24]);
    let dir = tempdir("jpeg-cut");
    let path = dir.join("cut.jpg");
    let mut cuts = 0;
    for keep in (bytes.len() / 2..bytes.len())
        .step_by(7)
        .chain([bytes.len() - 1])
    {
        std::fs::write(&path, &bytes[..keep]).unwrap();
        let err = read_image(&path).expect_err(&format!("{keep} bytes decoded"));
        let reason = image_error_for(err, &path);
        assert!(!reason.is_empty());
        cuts += 1;
    }
    assert!(cuts > 10);
    // The last cut (only the final byte of the end marker missing) says why.
    std::fs::write(&path, &bytes[..bytes.len() - 1]).unwrap();
    let reason = image_error_for(read_image(&path).unwrap_err(), &path);
    assert!(reason.contains("truncated"), "{reason}");
}

/// Corrupt scan data (bytes of the entropy-coded segment replaced by a
/// marker that cannot be there) is an error in strict mode.
#[test]
fn corrupt_jpeg_scan_data_is_an_error() {
    let bytes = std::fs::read(fixture("rgb_16x24.jpg")).unwrap();
    // The scan starts after the SOS segment (FF DA, length).
    let sos = bytes.windows(2).position(|w| w == [0xFF, 0xDA]).unwrap();
    let len = u16::from_be_bytes([bytes[sos + 2], bytes[sos + 3]]) as usize;
    let scan = sos + 2 + len;
    let dir = tempdir("jpeg-corrupt");
    let path = dir.join("corrupt.jpg");
    let mut bad = bytes.clone();
    // A frame header inside the scan data.
    bad[scan + 4] = 0xFF;
    bad[scan + 5] = 0xC0;
    std::fs::write(&path, &bad).unwrap();
    image_error_for(read_image(&path).unwrap_err(), &path);
    // A run of scan bytes set to 0xFF 0x00 … decodes to invalid Huffman codes.
    let mut bad = bytes.clone();
    for b in &mut bad[scan + 2..scan + 40] {
        *b = 0x00;
    }
    bad[scan + 2..scan + 40]
        .chunks_mut(2)
        .for_each(|c| c[0] = 0xFF);
    std::fs::write(&path, &bad).unwrap();
    image_error_for(read_image(&path).unwrap_err(), &path);
    // A frame header that claims 4096 rows over the scan of 16: zune-jpeg
    // fills the missing rows with grey; the scan is too short for them.
    let sof = bytes.windows(2).position(|w| w == [0xFF, 0xC0]).unwrap();
    let mut tall = bytes.clone();
    tall[sof + 5..sof + 7].copy_from_slice(&4096u16.to_be_bytes());
    std::fs::write(&path, &tall).unwrap();
    let reason = image_error_for(read_image(&path).unwrap_err(), &path);
    assert!(
        reason.contains("cannot hold") && reason.contains("24×4096"),
        "{reason}"
    );
}

#[test]
fn truncated_pngs_and_bmps_are_errors_naming_the_file() {
    let dir = tempdir("png-cut");
    for (name, ext) in [("rgb_23x31.png", "png"), ("rgb_9x11.bmp", "bmp")] {
        let bytes = std::fs::read(fixture(name)).unwrap();
        read_image(fixture(name)).unwrap();
        let path = dir.join(format!("cut.{ext}"));
        // From inside the header to the last pixel byte (a PNG needs its
        // image data whole; its trailing IEND chunk, as for PIL, not).
        let last = if ext == "png" {
            bytes.len() - 12
        } else {
            bytes.len()
        };
        for keep in (10..last).step_by(5) {
            std::fs::write(&path, &bytes[..keep]).unwrap();
            let err = read_image(&path).expect_err(&format!("{name}: {keep} bytes decoded"));
            image_error_for(err, &path);
        }
    }
}

#[test]
fn files_that_are_not_regular_files_are_refused_without_blocking() {
    let dir = tempdir("special");
    let err = read_image(&dir).unwrap_err();
    assert!(image_error_for(err, &dir).contains("not a regular file"));
    let null = Path::new("/dev/zero");
    if null.exists() {
        let err = read_image(null).unwrap_err();
        assert!(image_error_for(err, null).contains("not a regular file"));
    }
}

#[test]
fn sizes_from_arguments_that_cannot_be_held_are_typed_errors() {
    let img = Tensor::zeros(&[3, 4, 5], DType::F32, Device::Cpu).unwrap();
    // Sizes whose buffers overflow the address space, or exceed any host.
    for (h, w) in [(usize::MAX / 2, 3), (1 << 40, 1 << 20), (1 << 20, 1 << 20)] {
        match resize(&img, h, w) {
            Err(Error::OutOfMemory { .. }) => {}
            other => panic!("resize to {h}×{w}: {other:?}"),
        }
    }
    match pad(&img, [usize::MAX, 0, 1, 0], PaddingMode::Constant(0.0)) {
        Err(Error::InvalidArgument { op: "pad", .. }) => {}
        other => panic!("{other:?}"),
    }
    match pad(&img, [1 << 40, 0, 0, 0], PaddingMode::Constant(0.0)) {
        Err(Error::OutOfMemory { .. }) => {}
        other => panic!("{other:?}"),
    }
    let batch = Tensor::zeros(&[2, 3, 4, 5], DType::F32, Device::Cpu).unwrap();
    match make_grid(&batch, 1, usize::MAX / 2, 0.0) {
        Err(Error::InvalidArgument {
            op: "make_grid", ..
        }) => {}
        other => panic!("{other:?}"),
    }
    match make_grid(&batch, 1, 1 << 30, 0.0) {
        Err(Error::OutOfMemory { .. }) => {}
        other => panic!("{other:?}"),
    }
}

/// A tiny image folder of two classes with one image each.
fn folder(dir: &Path) -> PathBuf {
    let root = dir.join("data");
    for class in ["a", "b"] {
        std::fs::create_dir_all(root.join(class)).unwrap();
        std::fs::copy(fixture("rgb_5x7.png"), root.join(class).join("x.png")).unwrap();
    }
    root
}

#[test]
fn too_many_workers_is_an_error_not_a_million_threads() {
    let dir = tempdir("workers");
    let data = ImageFolder::new(folder(&dir)).unwrap();
    let loader = DataLoader::new(data, 1).unwrap().workers(1_000_000_000_000);
    let mut epoch = loader.epoch(0);
    assert_eq!(epoch.remaining(), 1);
    match epoch.next() {
        Some(Err(Error::InvalidArgument { msg, .. })) => {
            assert!(
                msg.contains("1000000000000") && msg.contains(&MAX_WORKERS.to_string()),
                "{msg}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(epoch.next().is_none());
    // The most allowed still load every batch.
    let data = ImageFolder::new(folder(&dir)).unwrap();
    let loader = DataLoader::new(data, 1).unwrap().workers(MAX_WORKERS);
    let labels: Vec<i64> = loader
        .epoch(0)
        .map(|b| b.unwrap().labels.to_vec::<i64>().unwrap()[0])
        .collect();
    assert_eq!(labels, [0, 1]);
}

/// A BERT `config.json` of the given fields over a valid tiny one.
fn bert_config(dir: &Path, fields: &str) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join("config.json");
    let mut json: serde_json::Value = serde_json::from_str(
        r#"{"vocab_size": 100, "hidden_size": 8, "num_hidden_layers": 2,
            "num_attention_heads": 2, "intermediate_size": 16,
            "max_position_embeddings": 32, "type_vocab_size": 2}"#,
    )
    .unwrap();
    let extra: serde_json::Value = serde_json::from_str(fields).unwrap();
    for (k, v) in extra.as_object().unwrap() {
        json[k] = v.clone();
    }
    std::fs::write(&path, json.to_string()).unwrap();
    path
}

#[test]
fn bert_configs_out_of_range_are_refused_before_building() {
    let dir = tempdir("bert-config");
    for (fields, expect) in [
        (r#"{"vocab_size": 2000000}"#, "`vocab_size` is 2000000"),
        (
            r#"{"num_hidden_layers": 1000000000}"#,
            "`num_hidden_layers` is 1000000000",
        ),
        (r#"{"hidden_size": 0}"#, "`hidden_size` is 0"),
        (r#"{"num_attention_heads": 3}"#, "does not divide"),
        (r#"{"layer_norm_eps": -1.0}"#, "`layer_norm_eps`"),
        (r#"{"vocab_size": 2e6}"#, "not a whole number"),
        (
            r#"{"type_vocab_size": 18446744073709551615}"#,
            "`type_vocab_size`",
        ),
    ] {
        let path = bert_config(&dir, fields);
        let err = BertConfig::from_json_file(&path).unwrap_err();
        match &err {
            Error::ModelFile { path: p, reason } if p == &path => {
                assert!(reason.contains(expect), "{fields}: {reason}")
            }
            other => panic!("{fields}: {other:?}"),
        }
    }
    // Every field in range, but 2^20 × 65536 embeddings alone are 256 GiB:
    // refused from the config, before model.safetensors (absent) is read.
    let big = dir.join("big");
    let path = bert_config(
        &big,
        r#"{"vocab_size": 1048576, "hidden_size": 65536, "num_attention_heads": 1}"#,
    );
    let config = BertConfig::from_json_file(&path).unwrap();
    assert!(config.parameter_count().unwrap() > 1 << 36);
    let start = Instant::now();
    let Err(err) = Bert::from_pretrained(&big, DType::F32, Device::Cpu) else {
        panic!("a 256 GiB BERT was built");
    };
    assert!(start.elapsed().as_secs_f64() < 5.0);
    match &err {
        Error::ModelFile { path: p, reason } if p == &path => {
            assert!(
                reason.contains("parameters") && reason.contains("free"),
                "{reason}"
            )
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn bert_parameter_count_matches_the_model() {
    let config = BertConfig::tiny();
    let model = Bert::new(config, DType::F32, Device::Meta, 0).unwrap();
    use leangrad::nn::Module;
    let built: usize = model.parameters().iter().map(Tensor::numel).sum();
    assert_eq!(config.parameter_count(), Some(built));
    let no_pooler = BertConfig {
        add_pooling_layer: false,
        ..config
    };
    let model = Bert::new(no_pooler, DType::F32, Device::Meta, 0).unwrap();
    let built: usize = model.parameters().iter().map(Tensor::numel).sum();
    assert_eq!(no_pooler.parameter_count(), Some(built));
}

fn leangrad(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_leangrad"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn skip_bad_images_leaves_out_unreadable_files_and_the_default_names_them() {
    let dir = tempdir("skip-cli");
    let images = dir.join("images");
    std::fs::create_dir_all(&images).unwrap();
    std::fs::copy(fixture("rgb_23x31.png"), images.join("good.png")).unwrap();
    let jpg = std::fs::read(fixture("rgb_16x24.jpg")).unwrap();
    let cut = images.join("cut.jpg");
    std::fs::write(&cut, &jpg[..jpg.len() - 40]).unwrap();
    let out = dir.join("out");
    let (images_arg, out_arg) = (images.display().to_string(), out.display().to_string());
    let args = [
        "adversarial",
        "--images",
        &images_arg,
        "--out",
        &out_arg,
        "--size",
        "32",
        "--attack",
        "fgsm",
        "--classes",
        "10",
        "--device",
        "cpu",
        "--json",
    ];
    let refused = leangrad(&args);
    assert_eq!(refused.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains(&cut.display().to_string()), "{stderr}");
    let skipped = leangrad(&[&args[..], &["--skip-bad-images"]].concat());
    let stderr = String::from_utf8_lossy(&skipped.stderr);
    assert!(skipped.status.success(), "{stderr}");
    assert_eq!(
        stderr.matches("warning: skipping unreadable image").count(),
        1,
        "{stderr}"
    );
    assert!(stderr.contains(&cut.display().to_string()), "{stderr}");
    let report: serde_json::Value = serde_json::from_slice(&skipped.stdout).unwrap();
    let files: Vec<&str> = report["images"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["file"].as_str().unwrap())
        .collect();
    assert_eq!(files, [images.join("good.png").display().to_string()]);
    // Nothing readable at all is an error naming the folder.
    std::fs::remove_file(images.join("good.png")).unwrap();
    let none = leangrad(&[&args[..], &["--skip-bad-images"]].concat());
    let stderr = String::from_utf8_lossy(&none.stderr);
    assert_eq!(none.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("none of its 1 image files could be read"),
        "{stderr}"
    );
}

#[test]
fn the_command_line_caps_workers_and_refuses_huge_style_sizes_at_once() {
    let dir = tempdir("cli-caps");
    let data = folder(&dir);
    let data_arg = data.display().to_string();
    for workers in ["65", "1000000000000"] {
        let out = leangrad(&["finetune", "--data", &data_arg, "--workers", workers]);
        assert_eq!(out.status.code(), Some(2));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("from 0 to 64"), "{stderr}");
    }
    let content = fixture("rgb_23x31.png").display().to_string();
    let style = fixture("rgb_37x53.png").display().to_string();
    let result = dir.join("style.png").display().to_string();
    for size in ["20000", "50000", "100000000000"] {
        let start = Instant::now();
        let out = leangrad(&[
            "style",
            "--content",
            &content,
            "--style",
            &style,
            "--out",
            &result,
            "--size",
            size,
            "--device",
            "cpu",
        ]);
        let took = start.elapsed().as_secs_f64();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.starts_with("error:"), "{stderr}");
        // Refused from the headers and a meta-device step: no decode.
        assert!(took < 3.0, "--size {size} took {took:.2} s: {stderr}");
    }
}
