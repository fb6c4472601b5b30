//! Image reading and the transforms against torchvision: the fixtures in
//! `tests/fixtures/data/` (images and `torchvision.safetensors`) are made by
//! `python-compare/data_fixtures.py`, which reads the same files with PIL
//! (`convert("RGB")`, `to_tensor`) and applies torchvision's tensor
//! transforms.

use std::collections::BTreeMap;
use std::path::PathBuf;

use leangrad::data::{
    center_crop, decode_image, hflip, normalize, read_image, read_image_as, resize, to_tensor,
    write_png, CenterCrop, ColorMode, Compose, Normalize, PngDepth, Resize, SampleRng, Transform,
    IMAGENET_MEAN, IMAGENET_STD,
};
use leangrad::{Device, Tensor};

fn fixtures_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/data")
}

fn reference() -> BTreeMap<String, Tensor> {
    leangrad::io::load_safetensors(fixtures_dir().join("torchvision.safetensors")).unwrap()
}

fn image(name: &str) -> Tensor {
    read_image(fixtures_dir().join(name)).unwrap()
}

/// The largest absolute difference, after checking the shapes agree.
fn max_diff(got: &Tensor, want: &Tensor) -> f32 {
    assert_eq!(got.shape(), want.shape());
    let (g, w) = (got.to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());
    g.iter()
        .zip(&w)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max)
}

fn assert_close(got: &Tensor, want: &Tensor, tol: f32, what: &str) {
    let d = max_diff(got, want);
    assert!(d <= tol, "{what}: max |diff| {d:e} > {tol:e}");
}

#[test]
fn lossless_files_read_exactly_as_pil_and_to_tensor() {
    let refs = reference();
    // PNG (RGB, gray repeated to RGB, RGBA with alpha dropped) and BMP: the
    // same samples, so the same f32 values bit for bit.
    for name in [
        "rgb_37x53.png",
        "rgb_23x31.png",
        "rgb_5x7.png",
        "gray_6x4.png",
        "rgba_4x5.png",
        "rgb_9x11.bmp",
    ] {
        let got = image(name);
        assert_eq!(
            max_diff(&got, &refs[&format!("to_tensor/{name}")]),
            0.0,
            "{name}"
        );
    }
}

#[test]
fn jpeg_decodes_within_a_few_steps_of_libjpeg() {
    // The image crate's JPEG decoder and PIL's libjpeg round the inverse DCT
    // and the chroma upsampling differently; on this checkered pattern (the
    // worst case for JPEG) they differ by at most 5 steps of 1/255, 0.3 on
    // average (measured).
    let got = image("rgb_16x24.jpg");
    let want = &reference()["to_tensor/rgb_16x24.jpg"];
    assert_close(&got, want, 6.0 / 255.0, "jpeg");
    let (g, w) = (got.to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());
    let mean = g.iter().zip(&w).map(|(a, b)| (a - b).abs()).sum::<f32>() / g.len() as f32;
    assert!(mean < 0.5 / 255.0, "mean |diff| {}", mean * 255.0);
}

#[test]
fn color_modes_keep_or_add_channels() {
    let gray = read_image_as(fixtures_dir().join("gray_6x4.png"), ColorMode::Unchanged).unwrap();
    assert_eq!(gray.shape(), &[1, 6, 4]);
    let rgb = image("gray_6x4.png");
    // Each RGB plane is the gray plane.
    let (g, c) = (gray.to_vec::<f32>().unwrap(), rgb.to_vec::<f32>().unwrap());
    assert_eq!(&c[..24], &g[..]);
    assert_eq!(&c[24..48], &g[..]);
    let rgba = read_image_as(fixtures_dir().join("rgba_4x5.png"), ColorMode::Unchanged).unwrap();
    assert_eq!(rgba.shape(), &[4, 4, 5]);
    let opaque = read_image_as(fixtures_dir().join("rgb_5x7.png"), ColorMode::Rgba).unwrap();
    assert!(opaque.to_vec::<f32>().unwrap()[3 * 35..]
        .iter()
        .all(|&a| a == 1.0));
    // Decoding from memory gives the same tensor as from the file.
    let bytes = std::fs::read(fixtures_dir().join("rgb_5x7.png")).unwrap();
    let from_bytes = decode_image(&bytes, ColorMode::Rgb).unwrap();
    assert_eq!(max_diff(&from_bytes, &image("rgb_5x7.png")), 0.0);
}

#[test]
fn to_tensor_is_planar_over_255() {
    // Two pixels of RGB, interleaved: (0, 51, 255), (255, 102, 1).
    let t = to_tensor(&[0, 51, 255, 255, 102, 1], 1, 2, 3).unwrap();
    assert_eq!(t.shape(), &[3, 1, 2]);
    let want = [0.0, 1.0, 0.2, 0.4, 1.0, 1.0 / 255.0];
    assert_eq!(t.to_vec::<f32>().unwrap(), want.map(|v: f64| v as f32));
    assert!(to_tensor(&[0; 5], 1, 2, 3).is_err());
}

/// Antialiased bilinear against torchvision: the same algorithm in the same
/// f32 arithmetic, so only a few roundings can differ (measured: at most
/// 1.2e-7, one step of f32 near 1).
const RESIZE_TOL: f32 = 1e-6;

#[test]
fn resize_matches_torchvision_antialias_bilinear() {
    let refs = reference();
    let big = image("rgb_37x53.png");
    let mid = image("rgb_23x31.png");
    let small = image("rgb_5x7.png");
    // Shorter side 16: 37×53 → 16×22 (22 = int(16·53/37)).
    let shorter = Resize::shorter(16)
        .apply(&big, &mut SampleRng::new(0))
        .unwrap();
    assert_close(
        &shorter,
        &refs["resize/37x53_shorter16"],
        RESIZE_TOL,
        "shorter 16",
    );
    let cases = [
        (&mid, (8, 12), "resize/23x31_to_8x12"),
        (&small, (9, 13), "resize/5x7_to_9x13"),
        (&mid, (30, 12), "resize/23x31_to_30x12"),
        (&big, (5, 3), "resize/37x53_to_5x3"),
    ];
    for (img, (h, w), key) in cases {
        assert_close(&resize(img, h, w).unwrap(), &refs[key], RESIZE_TOL, key);
    }
    // A batch [N, C, H, W] resizes each image.
    let batch = Tensor::stack(&[&mid, &hflip(&mid).unwrap()], 0).unwrap();
    let got = resize(&batch, 7, 9).unwrap();
    assert_close(&got, &refs["resize/batch_to_7x9"], RESIZE_TOL, "batch");
}

#[test]
fn crops_flips_and_normalize_match_torchvision() {
    let refs = reference();
    let big = image("rgb_37x53.png");
    let mid = image("rgb_23x31.png");
    let small = image("rgb_5x7.png");
    // Crops and flips move values: exact.
    let exact = [
        (
            center_crop(&big, 20, 30).unwrap(),
            "center_crop/37x53_to_20x30",
        ),
        (
            center_crop(&mid, 10, 11).unwrap(),
            "center_crop/23x31_to_10x11",
        ),
        (center_crop(&small, 8, 9).unwrap(), "center_crop/5x7_to_8x9"),
        (hflip(&mid).unwrap(), "hflip/23x31"),
        // (x − mean) / std in f32, the statistics rounded to f32 first.
        (
            normalize(&big, &IMAGENET_MEAN, &IMAGENET_STD).unwrap(),
            "normalize/37x53",
        ),
    ];
    for (got, key) in exact {
        assert_eq!(max_diff(&got, &refs[key]), 0.0, "{key}");
    }
    let pipeline = Compose::new()
        .then(Resize::shorter(16))
        .then(CenterCrop::square(14))
        .then(Normalize::imagenet());
    let got = pipeline.apply(&big, &mut SampleRng::new(0)).unwrap();
    // Normalising divides by std ≈ 0.22, scaling resize's rounding by ~4.5.
    assert_close(&got, &refs["pipeline/37x53"], 5e-6, "pipeline");
}

#[test]
fn denormalize_inverts_normalize() {
    let big = image("rgb_37x53.png");
    let norm = Normalize::imagenet();
    let mut rng = SampleRng::new(0);
    let back = norm
        .inverse()
        .apply(&norm.apply(&big, &mut rng).unwrap(), &mut rng)
        .unwrap();
    assert_close(&back, &big, 1e-6, "denormalize");
}

#[test]
fn write_png_rounds_as_save_image() {
    let refs = reference();
    let dir = tempdir("save_image");
    let path = dir.join("out.png");
    write_png(&refs["save_image/input"], &path, PngDepth::Eight).unwrap();
    let back = read_image(&path).unwrap().to_vec::<f32>().unwrap();
    let got: Vec<u8> = back.iter().map(|v| (v * 255.0).round() as u8).collect();
    assert_eq!(got, refs["save_image/u8"].to_vec::<u8>().unwrap());
}

fn tempdir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("leangrad-data-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn png_round_trips_at_8_and_16_bits() {
    let dir = tempdir("round_trip");
    // Values exactly on the 8-bit grid survive 8 bits; on the 16-bit grid, 16.
    let steps8: Vec<f32> = (0..2 * 3 * 4).map(|i| (i * 11) as f32 / 255.0).collect();
    let t = Tensor::from_vec(steps8.clone(), &[2, 3, 4], Device::Cpu).unwrap();
    let rgb = t.narrow(0, 0, 1).unwrap().broadcast_to(&[3, 3, 4]).unwrap();
    for (tensor, channels) in [(rgb, 3), (t.narrow(0, 1, 1).unwrap(), 1)] {
        let path = dir.join(format!("eight_{channels}.png"));
        write_png(&tensor, &path, PngDepth::Eight).unwrap();
        let back = read_image_as(&path, ColorMode::Unchanged).unwrap();
        assert_eq!(back.shape(), tensor.shape());
        assert_eq!(
            back.to_vec::<f32>().unwrap(),
            tensor.contiguous().unwrap().to_vec::<f32>().unwrap()
        );
    }
    let steps16: Vec<f32> = (0..4 * 2 * 3)
        .map(|i| (i * 2731) as f32 / 65535.0)
        .collect();
    let t16 = Tensor::from_vec(steps16.clone(), &[4, 2, 3], Device::Cpu).unwrap();
    let path = dir.join("sixteen.png");
    write_png(&t16, &path, PngDepth::Sixteen).unwrap();
    let back = read_image_as(&path, ColorMode::Unchanged).unwrap();
    assert_eq!(back.shape(), &[4, 2, 3]);
    assert_eq!(back.to_vec::<f32>().unwrap(), steps16);
    // Off-grid values round half up, out-of-range values clamp: 0.3·65535
    // = 19660.5 → 19661; -1 → 0; 2 → 65535; a [1, C, H, W] batch of one.
    let odd = Tensor::from_vec(vec![0.3f32, -1.0, 2.0], &[1, 1, 1, 3], Device::Cpu).unwrap();
    write_png(&odd, &path, PngDepth::Sixteen).unwrap();
    let back = read_image_as(&path, ColorMode::Unchanged).unwrap();
    let want = [19661.0 / 65535.0, 0.0, 1.0].map(|v: f64| v as f32);
    assert_eq!(back.to_vec::<f32>().unwrap(), want);
    // Shapes PNG cannot hold are typed errors naming the file.
    let two = Tensor::zeros(&[2, 3, 4], leangrad::DType::F32, Device::Cpu).unwrap();
    let err = write_png(&two, dir.join("two.png"), PngDepth::Eight).unwrap_err();
    assert!(err.to_string().contains("two.png"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn random_resized_crop_draws_valid_windows_reproducibly() {
    use leangrad::data::{crop, RandomCrop, RandomResizedCrop};
    let big = image("rgb_37x53.png");
    let t = RandomResizedCrop::new(8);
    let mut fallbacks = 0;
    for seed in 0..200 {
        let (top, left, h, w) = t.window(37, 53, &mut SampleRng::new(seed));
        assert!(top + h <= 37 && left + w <= 53 && h > 0 && w > 0);
        let area = (h * w) as f64 / (37.0 * 53.0);
        // Rounding the sides moves area and ratio a little off their ranges.
        assert!((0.06..=1.0).contains(&area), "area {area}");
        let ratio = w as f64 / h as f64;
        assert!((0.6..=1.5).contains(&ratio), "ratio {ratio}");
        fallbacks += usize::from((h, w) == (37, 49));
        // The same seed, the same window; the output is that window resized.
        assert_eq!(
            t.window(37, 53, &mut SampleRng::new(seed)),
            (top, left, h, w)
        );
    }
    assert!(fallbacks < 20, "{fallbacks} fallbacks");
    let got = t.apply(&big, &mut SampleRng::new(3)).unwrap();
    let (top, left, h, w) = t.window(37, 53, &mut SampleRng::new(3));
    let want = resize(&crop(&big, top, left, h, w).unwrap(), 8, 8).unwrap();
    assert_eq!(max_diff(&got, &want), 0.0);
    // No draw can fit an area of 2–3 times the image: the fallback is the
    // centred crop of the widest allowed ratio, 4/3: 37 × round(49.33).
    let impossible = RandomResizedCrop {
        scale: (2.0, 3.0),
        ..RandomResizedCrop::new(8)
    };
    assert_eq!(
        impossible.window(37, 53, &mut SampleRng::new(0)),
        (0, 2, 37, 49)
    );
    // RandomCrop: inside the image, and too large a window is an error.
    let rc = RandomCrop::new(30, 50);
    let out = rc.apply(&big, &mut SampleRng::new(9)).unwrap();
    assert_eq!(out.shape(), &[3, 30, 50]);
    let too_big = RandomCrop::new(38, 10);
    assert!(too_big.apply(&big, &mut SampleRng::new(9)).is_err());
}
