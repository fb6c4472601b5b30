//! `leangrad adversarial` as a library function: perturbation bounds,
//! attack directions, labels from folder names, written images, memory and
//! errors, on a randomly initialised ResNet-18 at 32×32.

use leangrad::data::{normalize, read_image, write_png, PngDepth, IMAGENET_MEAN, IMAGENET_STD};
use leangrad::jobs::adversarial::{run, AdversarialOptions, AdversarialReport, Attack};
use leangrad::jobs::{image_model, read_square};
use leangrad::ops::CrossEntropyOptions;
use leangrad::{Device, Error, Tensor};
use std::path::{Path, PathBuf};

/// Four 40×48 images with smooth random content (values well inside
/// (0, 1), so clamping to [0, 1] never cuts a perturbation), in class
/// folders `3/` and `7/`.
fn images(root: &Path) -> PathBuf {
    let dir = root.join("images");
    for (i, class) in ["3", "3", "7", "7"].iter().enumerate() {
        let d = dir.join(class);
        std::fs::create_dir_all(&d).unwrap();
        let t = Tensor::rand_range(
            &[3, 40, 48],
            0.2,
            0.8,
            leangrad::DType::F32,
            Device::Cpu,
            i as u64,
        )
        .unwrap();
        // The same names in both classes: `3/img0.png` and `7/img0.png`.
        write_png(&t, d.join(format!("img{}.png", i % 2)), PngDepth::Eight).unwrap();
    }
    dir
}

fn options(root: &Path, attack: Attack) -> AdversarialOptions {
    AdversarialOptions {
        attack,
        size: 32,
        batch: 3,
        steps: 4,
        ..AdversarialOptions::new("resnet18", images(root), root.join("out"))
    }
}

fn tempdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("leangrad-adv-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn check_written(r: &AdversarialReport, eps_linf: f64) {
    assert_eq!(r.images.len(), 4);
    for img in &r.images {
        let adv = read_image(&img.written).unwrap();
        assert_eq!(adv.shape(), &[3, 32, 32]);
        // The written PNG is the adversarial image rounded to 8 bits: the
        // reported L∞ norm bounds it within half a grey level.
        assert!(img.linf <= eps_linf + 1e-6, "{} > {eps_linf}", img.linf);
    }
}

#[test]
fn fgsm_moves_every_pixel_by_eps_and_labels_come_from_folder_names() {
    let root = tempdir("fgsm");
    let r = run(&options(&root, Attack::Fgsm)).unwrap();
    assert!(r.random_init);
    assert_eq!(r.steps, 1);
    check_written(&r, r.eps);
    // FGSM adds ±eps to every pixel (none is clamped: the images lie in
    // [0.2, 0.8]); a pixel whose gradient is exactly 0 would stay, and the
    // 32×32×3 image's L2 norm is then eps·√3072 at most.
    for img in &r.images {
        assert!((img.linf - r.eps).abs() < 1e-6, "{}", img.linf);
        assert!(img.l2 <= r.eps * (3072f64).sqrt() + 1e-4);
        assert!(img.l2 > 0.9 * r.eps * (3072f64).sqrt(), "{}", img.l2);
    }
    let labels: Vec<Option<usize>> = r.images.iter().map(|i| i.label).collect();
    assert_eq!(labels, [Some(3), Some(3), Some(7), Some(7)]);
    // Each image is written under its class folder: none overwrites another
    // of the same name (check_written read each back as its own).
    let written: Vec<PathBuf> = r.images.iter().map(|i| i.written.clone()).collect();
    let out = root.join("out");
    let want: Vec<PathBuf> = ["3/img0", "3/img1", "7/img0", "7/img1"]
        .iter()
        .map(|n| out.join(format!("{n}.png")))
        .collect();
    assert_eq!(written, want);
    let clean = r.images.iter().filter(|i| Some(i.clean) == i.label).count();
    assert_eq!(r.clean_accuracy, Some(clean as f64 / 4.0));
    // The memory of an input-only step: the lean policy never keeps more
    // than PyTorch's, and the run's measured peak holds at least the
    // parameters of ResNet-18 (11,689,512 f32).
    assert!(r.memory.lean_step_bytes <= r.memory.pytorch_step_bytes);
    assert!(r.memory.measured_peak_bytes >= 11_689_512 * 4);
}

#[test]
fn pgd_stays_in_its_ball_and_moves_the_loss_the_right_way() {
    let root = tempdir("pgd");
    let r = run(&options(&root, Attack::Pgd)).unwrap();
    check_written(&r, r.eps);
    let l2 = run(&AdversarialOptions {
        eps: 0.5,
        alpha: 0.2,
        out: root.join("out-l2"),
        ..options(&root, Attack::PgdL2)
    })
    .unwrap();
    for img in &l2.images {
        assert!(img.l2 <= 0.5 + 1e-4, "{}", img.l2);
    }
    // The attack's direction: the untargeted one raised each image's loss
    // to its label, the targeted one lowered the loss to its target (the
    // written PNGs, read back, through the same model).
    // (A randomly initialised ResNet-18 barely reacts to 8/255: a wider
    // ball shows the direction plainly.)
    let strong = |targeted, out: &str| AdversarialOptions {
        eps: 0.3,
        alpha: 0.05,
        steps: 6,
        targeted,
        out: root.join(out),
        ..options(&root, Attack::Pgd)
    };
    let u = run(&strong(None, "out-wide")).unwrap();
    let (la, lc) = (loss(&u, None), loss_of_clean(&u, None));
    assert!(la > lc + 0.01, "adversarial {la} clean {lc}");
    let t = run(&strong(Some(5), "out-targeted")).unwrap();
    let (la, lc) = (loss(&t, Some(5)), loss_of_clean(&t, Some(5)));
    assert!(la < lc - 0.01, "adversarial {la} clean {lc}");
}

/// Mean cross-entropy of the model on `images`, to `target` or each
/// image's label: the function the job attacked, BatchNorm in evaluation
/// mode (in training mode each batch would normalise itself).
fn mean_loss(r: &AdversarialReport, target: Option<usize>, images: Vec<Tensor>) -> f64 {
    // The attacked function: every BatchNorm in evaluation mode, as the
    // job runs the model (training mode would normalise by this batch).
    let mut model = image_model("resnet18", None, 1000, Device::Cpu).unwrap();
    model.set_training(false);
    let x = Tensor::stack(&images.iter().collect::<Vec<_>>(), 0).unwrap();
    let x = normalize(&x, &IMAGENET_MEAN, &IMAGENET_STD).unwrap();
    let goal: Vec<i64> = r
        .images
        .iter()
        .map(|i| target.or(i.label).unwrap() as i64)
        .collect();
    let goal = Tensor::from_vec(goal, &[r.images.len()], Device::Cpu).unwrap();
    model
        .step_logits(&x)
        .unwrap()
        .cross_entropy(&goal, CrossEntropyOptions::default())
        .unwrap()
        .to_scalar()
        .unwrap()
}

fn loss(r: &AdversarialReport, target: Option<usize>) -> f64 {
    let adv = r
        .images
        .iter()
        .map(|i| read_image(&i.written).unwrap())
        .collect();
    mean_loss(r, target, adv)
}

fn loss_of_clean(r: &AdversarialReport, target: Option<usize>) -> f64 {
    let clean = r
        .images
        .iter()
        .map(|i| read_square(&i.file, 32).unwrap())
        .collect();
    mean_loss(r, target, clean)
}

#[test]
fn bad_arguments_are_typed_errors() {
    let root = tempdir("errors");
    let bad_eps = run(&AdversarialOptions {
        eps: 0.0,
        ..options(&root, Attack::Fgsm)
    });
    assert!(
        matches!(bad_eps, Err(Error::InvalidArgument { .. })),
        "{bad_eps:?}"
    );
    let bad_target = run(&AdversarialOptions {
        targeted: Some(1000),
        ..options(&root, Attack::Pgd)
    });
    assert!(matches!(bad_target, Err(Error::InvalidArgument { .. })));
    let empty = root.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    match run(&AdversarialOptions::new("resnet18", &empty, root.join("o"))) {
        Err(Error::Image { path, .. }) => assert_eq!(path, empty),
        other => panic!("{other:?}"),
    }
    let unknown = run(&AdversarialOptions::new(
        "resnet9000",
        images(&root),
        root.join("o"),
    ));
    assert!(unknown.is_err());
}

/// One FGSM step against PyTorch's (python-compare/fgsm_fixture.py): a
/// small ResNet with torchvision's names, frozen, in evaluation mode.
#[test]
fn one_fgsm_step_matches_pytorch() {
    use leangrad::io::{load_safetensors, load_state_dict, LoadOptions};
    use leangrad::jobs::adversarial::{input_gradient, perturb};
    use leangrad::models::{BlockKind, ResNet, ResNetConfig};
    use std::collections::BTreeMap;

    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/adversarial/fgsm.safetensors"
    );
    let f = load_safetensors(path).unwrap();
    let config = ResNetConfig {
        block: BlockKind::Basic,
        layers: [2, 2, 2, 2],
        base_width: 2,
        num_classes: 5,
        in_channels: 3,
        zero_init_residual: false,
        groups: 1,
        width_per_group: 64,
    };
    let mut model = ResNet::new(config, leangrad::DType::F32, Device::Cpu, 9).unwrap();
    let weights: BTreeMap<String, Tensor> = f
        .iter()
        .filter_map(|(k, v)| k.strip_prefix("model.").map(|k| (k.to_string(), v.clone())))
        .collect();
    load_state_dict(&model, &weights, LoadOptions::default()).unwrap();
    leangrad::memory_plan::parse_case("input-bn-eval")
        .unwrap()
        .apply(&mut model)
        .unwrap();
    let (x, labels) = (&f["images"], &f["labels"]);

    let (grad, loss) = input_gradient(&model, x, labels).unwrap();
    let want_loss = f["loss"].to_f64_vec().unwrap()[0];
    assert!((loss.to_scalar().unwrap() - want_loss).abs() < 1e-5);
    let (g, want_g) = (grad.to_f64_vec().unwrap(), f["grad"].to_f64_vec().unwrap());
    let scale = want_g.iter().fold(0f64, |m, v| m.max(v.abs()));
    let worst = g
        .iter()
        .zip(&want_g)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max);
    assert!(
        worst <= 1e-4 * scale,
        "gradient off by {worst} (scale {scale})"
    );

    let opts = AdversarialOptions {
        attack: Attack::Fgsm,
        eps: 8.0 / 255.0,
        classes: 5,
        ..AdversarialOptions::new("resnet18", "unused", "unused")
    };
    let adv = perturb(&model, x, labels, &opts, 0)
        .unwrap()
        .to_f64_vec()
        .unwrap();
    let want = f["adversarial"].to_f64_vec().unwrap();
    // Equal within 1e-4 wherever the gradient's sign is not in doubt: its
    // magnitude above the gradients' agreement (1e-4 of their scale), or
    // exactly 0 (pixels no output depends on: no step in either).
    let mut doubtful = 0;
    for ((a, w), gv) in adv.iter().zip(&want).zip(&want_g) {
        if *gv != 0.0 && gv.abs() <= 1e-4 * scale {
            doubtful += 1;
            continue;
        }
        assert!((a - w).abs() < 1e-4, "{a} vs {w} (grad {gv})");
    }
    assert!(doubtful * 100 < want.len(), "{doubtful} of {}", want.len());
}

/// Two images written by another program (the `image` crate, no leangrad
/// marker) in a flat folder: `a.png` and `b.png`.
fn users_images(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    for (i, name) in ["a.png", "b.png"].iter().enumerate() {
        let img = image::RgbImage::from_fn(40, 48, |x, y| {
            image::Rgb([(60 + x * 3) as u8, (50 + y * 3) as u8, (90 + 20 * i) as u8])
        });
        img.save(dir.join(name)).unwrap();
    }
}

fn refused(r: leangrad::Result<AdversarialReport>, file: &Path, why: &str) {
    match r {
        Err(Error::OutputFile { path, reason }) => {
            assert_eq!(path, file);
            assert!(reason.contains(why), "{reason}");
            assert!(reason.contains("choose another --out"), "{reason}");
        }
        other => panic!(
            "expected a refusal naming {}, got {other:?}",
            file.display()
        ),
    }
}

#[test]
fn outputs_never_overwrite_files_leangrad_did_not_write() {
    use leangrad::data::is_leangrad_png;
    let root = tempdir("clobber");
    let mine = root.join("mine");
    users_images(&mine);
    let before: Vec<Vec<u8>> = ["a.png", "b.png"]
        .iter()
        .map(|n| std::fs::read(mine.join(n)).unwrap())
        .collect();
    assert!(!is_leangrad_png(mine.join("a.png")));
    let opts = |out: PathBuf| AdversarialOptions {
        attack: Attack::Fgsm,
        size: 32,
        batch: 1,
        ..AdversarialOptions::new("resnet18", &mine, out)
    };
    // `--out` pointed at the images' own folder: refused before any work,
    // the user's images untouched.
    refused(
        run(&opts(mine.clone())),
        &mine.join("a.png"),
        "did not write",
    );
    let after: Vec<Vec<u8>> = ["a.png", "b.png"]
        .iter()
        .map(|n| std::fs::read(mine.join(n)).unwrap())
        .collect();
    assert_eq!(after, before);
    assert_eq!(std::fs::read_dir(&mine).unwrap().count(), 2);

    // Into a folder of its own: the written PNGs carry the marker, and a
    // second run replaces them.
    let out = root.join("adv");
    let first = run(&opts(out.clone())).unwrap();
    for img in &first.images {
        assert!(is_leangrad_png(&img.written), "{}", img.written.display());
    }
    let second = run(&opts(out.clone())).unwrap();
    assert_eq!(second.images.len(), 2);

    // A user's file where the second image would go: refused before the
    // first image is written.
    let other = root.join("other");
    std::fs::create_dir_all(&other).unwrap();
    std::fs::copy(mine.join("a.png"), other.join("b.png")).unwrap();
    refused(
        run(&opts(other.clone())),
        &other.join("b.png"),
        "did not write",
    );
    assert!(!other.join("a.png").exists());

    // `--out` a regular file: said so, not "File exists".
    let file = root.join("notes.txt");
    std::fs::write(&file, "mine").unwrap();
    refused(
        run(&opts(file.clone())),
        &file.join("a.png"),
        "is not a folder",
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "mine");
}
