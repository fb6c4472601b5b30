//! `pad` (four border modes), `RandomCrop` with padding and `make_grid`
//! against torchvision: the fixture `tests/fixtures/data/pad_grid.safetensors`
//! comes from `python-compare/pad_grid_fixture.py`.

use leangrad::data::{
    make_grid, pad, read_image, write_png, PaddingMode, PngDepth, RandomCrop, SampleRng, Transform,
};
use leangrad::{Device, Error, Tensor};
use std::collections::BTreeMap;
use std::path::PathBuf;

fn fixture() -> BTreeMap<String, Tensor> {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/data/pad_grid.safetensors");
    leangrad::io::load_safetensors(path).unwrap()
}

fn values(t: &Tensor) -> Vec<f32> {
    t.to_vec::<f32>().unwrap()
}

#[test]
fn pad_matches_torchvision_in_every_mode() {
    let f = fixture();
    let image = &f["image"];
    for (name, borders) in [("a", [1, 2, 3, 0]), ("b", [3, 1, 0, 2])] {
        for (mode_name, mode) in [
            ("constant", PaddingMode::Constant(0.25)),
            ("edge", PaddingMode::Edge),
            ("reflect", PaddingMode::Reflect),
            ("symmetric", PaddingMode::Symmetric),
        ] {
            let want = &f[&format!("pad_{name}_{mode_name}")];
            let got = pad(image, borders, mode).unwrap();
            assert_eq!(got.shape(), want.shape(), "{name} {mode_name}");
            // Padding only copies values: exactly equal.
            assert_eq!(values(&got), values(want), "{name} {mode_name}");
        }
    }
}

#[test]
fn pad_rejects_borders_wider_than_the_mirror() {
    let image = Tensor::zeros(&[1, 3, 4], leangrad::DType::F32, Device::Cpu).unwrap();
    // Reflect needs a border narrower than the side (3 rows: at most 2).
    assert!(pad(&image, [0, 2, 0, 0], PaddingMode::Reflect).is_ok());
    let err = pad(&image, [0, 3, 0, 0], PaddingMode::Reflect).unwrap_err();
    assert!(
        matches!(err, Error::InvalidArgument { op: "pad", .. }),
        "{err}"
    );
    assert!(err.to_string().contains("top border of 3"), "{err}");
    assert!(pad(&image, [4, 0, 0, 0], PaddingMode::Symmetric).is_ok());
    assert!(pad(&image, [5, 0, 0, 0], PaddingMode::Symmetric).is_err());
    assert!(pad(&image, [9, 9, 9, 9], PaddingMode::Constant(1.0)).is_ok());
}

#[test]
fn random_crop_with_padding_takes_a_window_of_the_padded_image() {
    let f = fixture();
    let image = &f["image"]; // [3, 4, 5]
    let padded = values(&pad(image, [2; 4], PaddingMode::Reflect).unwrap()); // [3, 8, 9]
    let crop = RandomCrop {
        padding_mode: PaddingMode::Reflect,
        ..RandomCrop::new(4, 5).padding(2)
    };
    let mut offsets = std::collections::BTreeSet::new();
    for seed in 0..40 {
        let out = values(&crop.apply(image, &mut SampleRng::new(seed)).unwrap());
        // Find the window of the padded image it equals.
        let hit = (0..=4)
            .flat_map(|t| (0..=4).map(move |l| (t, l)))
            .find(|&(t, l)| {
                (0..3).all(|c| {
                    (0..4).all(|y| {
                        (0..5).all(|x| {
                            out[(c * 4 + y) * 5 + x] == padded[(c * 8 + t + y) * 9 + l + x]
                        })
                    })
                })
            });
        offsets.insert(hit.expect("the crop is a window of the padded image"));
    }
    assert!(offsets.len() > 10, "windows drawn: {offsets:?}");
    // pad_if_needed pads a short side on both sides by the missing length.
    let grow = RandomCrop {
        pad_if_needed: true,
        ..RandomCrop::new(6, 5)
    };
    let out = grow.apply(image, &mut SampleRng::new(3)).unwrap();
    assert_eq!(out.shape(), &[3, 6, 5]);
    let err = RandomCrop::new(6, 5)
        .apply(image, &mut SampleRng::new(3))
        .unwrap_err();
    assert!(err.to_string().contains("pad_if_needed"), "{err}");
}

#[test]
fn make_grid_matches_torchvision_and_write_png_writes_a_batch_as_its_grid() {
    let f = fixture();
    let batch = &f["batch"];
    for (name, got) in [
        ("grid_2_1", make_grid(batch, 2, 1, 0.5).unwrap()),
        ("grid_default", make_grid(batch, 8, 2, 0.0).unwrap()),
        ("grid_gray", make_grid(&f["gray_batch"], 3, 2, 0.0).unwrap()),
    ] {
        assert_eq!(got.shape(), f[name].shape(), "{name}");
        assert_eq!(values(&got), values(&f[name]), "{name}");
    }
    // One image: itself, unpadded.
    let one = make_grid(&batch.narrow(0, 0, 1).unwrap(), 8, 2, 0.0).unwrap();
    assert_eq!(values(&one), values(&f["image"]));
    assert!(make_grid(&f["image"], 8, 2, 0.0).is_err());
    assert!(make_grid(batch, 0, 2, 0.0).is_err());

    let dir = std::env::temp_dir().join(format!("leangrad-grid-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("batch.png");
    write_png(batch, &path, PngDepth::Sixteen).unwrap();
    let back = read_image(&path).unwrap();
    assert_eq!(back.shape(), f["grid_default"].shape());
    let max_err = values(&back)
        .iter()
        .zip(values(&f["grid_default"]))
        .map(|(a, b)| (a - b.clamp(0.0, 1.0)).abs())
        .fold(0f32, f32::max);
    assert!(
        max_err <= 0.5 / 65535.0 + 1e-7,
        "16-bit round trip error {max_err}"
    );
}
