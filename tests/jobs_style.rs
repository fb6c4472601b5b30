//! `leangrad style` as a library function and a command, on a tiny VGG
//! (torchvision's layout, plan [4, 4, M, 8, 8, M, 8]) with weights saved by
//! PyTorch: the losses of every step and of the final image against
//! PyTorch's (python-compare/style_fixture.py, Adam and L-BFGS), losses
//! going down, only the image getting a gradient, frames, weight files with
//! and without the classifier, and typed errors.

use leangrad::io::{load_safetensors, save_safetensors};
use leangrad::jobs::style::{
    frame_path, load_vgg_features, read_resized, run, StyleInit, StyleNet, StyleOptimizer,
    StyleOptions, StyleReport, Transfer,
};
use leangrad::memory::{Category, Ledger};
use leangrad::models::{Vgg, VggConfig};
use leangrad::nn::Module;
use leangrad::{DType, Device, Error, Tensor};
use serde_json::Value;
use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/style")
}

fn reference() -> Value {
    let text = std::fs::read_to_string(fixtures().join("losses.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn tiny() -> StyleNet {
    StyleNet {
        name: "tiny".into(),
        config: VggConfig {
            plan: vec![4, 4, 0, 8, 8, 0, 8],
            pool_size: 1,
            hidden: 1,
            num_classes: 1,
            ..VggConfig::vgg19(false, 1)
        },
        style_layers: ["features.0", "features.5", "features.10"]
            .map(String::from)
            .to_vec(),
        content_layers: vec!["features.7".into()],
    }
}

fn tempdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("leangrad-style-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The fixture's problem: its images at size 12, its weights, content
/// weight 1, style weight 1000, starting from the content image.
fn options(dir: &Path, optimizer: StyleOptimizer, steps: usize) -> StyleOptions {
    StyleOptions {
        net: tiny(),
        weights: Some(fixtures().join("tiny_vgg_features.safetensors")),
        size: 12,
        steps,
        style_weight: 1000.0,
        optimizer,
        lr: (optimizer == StyleOptimizer::Adam).then_some(0.05),
        ..StyleOptions::new(
            fixtures().join("content.png"),
            fixtures().join("style.png"),
            dir.join("out.png"),
        )
    }
}

fn close(got: f64, want: f64, what: &str) {
    let tol = 1e-5 * want.abs() + 1e-9;
    assert!(
        (got - want).abs() <= tol,
        "{what}: got {got}, PyTorch {want}"
    );
}

fn check_against_pytorch(r: &StyleReport, pytorch: &Value, what: &str) {
    let history = pytorch["history"].as_array().unwrap();
    assert_eq!(r.history.len(), history.len());
    for (k, (got, want)) in r.history.iter().zip(history).enumerate() {
        close(
            *got,
            want["total"].as_f64().unwrap(),
            &format!("{what} step {k} total"),
        );
    }
    let fin = &pytorch["final"];
    close(
        r.losses.content,
        fin["content"].as_f64().unwrap(),
        &format!("{what} final content"),
    );
    close(
        r.losses.style,
        fin["style"].as_f64().unwrap(),
        &format!("{what} final style"),
    );
    close(
        r.losses.total,
        fin["total"].as_f64().unwrap(),
        &format!("{what} final total"),
    );
}

#[test]
fn losses_match_pytorch_with_both_optimizers() {
    let f = reference();
    let steps = f["steps"].as_u64().unwrap() as usize;
    for (optimizer, key) in [
        (StyleOptimizer::Adam, "adam"),
        (StyleOptimizer::Lbfgs, "lbfgs"),
    ] {
        let dir = tempdir(key);
        let r = run(&options(&dir, optimizer, steps)).unwrap();
        assert!(!r.random_init);
        assert_eq!((r.height, r.width), (12, 15));
        check_against_pytorch(&r, &f[key], key);
        // The first step's style loss (the content loss is 0: the image
        // starts as the content image), read on its own.
        let first = f[key]["history"][0].clone();
        assert_eq!(first["content"].as_f64().unwrap(), 0.0);
        close(
            r.history[0],
            first["style"].as_f64().unwrap(),
            "first style",
        );
    }
}

#[test]
fn content_and_style_losses_of_another_image_match_pytorch() {
    // The final image PyTorch's Adam run produced, as the image to score.
    let f = reference();
    let image: Vec<f32> = f["adam"]["image"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap() as f32)
        .collect();
    let image = Tensor::from_vec(image, &[1, 3, 12, 15], Device::Cpu).unwrap();
    let content = read_resized(&fixtures().join("content.png"), 12).unwrap();
    let style = read_resized(&fixtures().join("style.png"), 12).unwrap();
    assert_eq!(style.shape(), &[1, 3, 12, 12]);
    let vgg = Vgg::new(&tiny().config, DType::F32, Device::Cpu, 0).unwrap();
    load_vgg_features(&vgg, &fixtures().join("tiny_vgg_features.safetensors")).unwrap();
    let t = Transfer::new(vgg, &tiny(), (&content, &style), &image, (1.0, 1000.0)).unwrap();
    let l = t.losses().unwrap();
    let fin = &f["adam"]["final"];
    close(l.content, fin["content"].as_f64().unwrap(), "content");
    close(l.style, fin["style"].as_f64().unwrap(), "style");
    assert!(l.content > 0.0 && l.style > 0.0);
}

#[test]
fn losses_decrease_with_both_optimizers() {
    for optimizer in [StyleOptimizer::Adam, StyleOptimizer::Lbfgs] {
        let dir = tempdir(&format!("{optimizer:?}-down"));
        let opts = StyleOptions {
            init: StyleInit::Noise,
            ..options(&dir, optimizer, 25)
        };
        let r = run(&opts).unwrap();
        let (first, last) = (r.history[0], *r.history.last().unwrap());
        assert!(last < 0.5 * first, "{optimizer:?}: {first} → {last}");
        assert!(
            r.losses.total < first,
            "{optimizer:?}: final {}",
            r.losses.total
        );
        let m = &r.memory;
        assert!(m.lean_step_bytes < m.pytorch_step_bytes, "{m:?}");
        assert!(m.measured_peak_bytes > 0);
    }
}

#[test]
fn only_the_image_gets_a_gradient() {
    let ledger = Ledger::new();
    let _l = ledger.enter();
    let content = read_resized(&fixtures().join("content.png"), 12).unwrap();
    let style = read_resized(&fixtures().join("style.png"), 12).unwrap();
    let vgg = Vgg::new(&tiny().config, DType::F32, Device::Cpu, 0).unwrap();
    let noise = Tensor::rand(content.shape(), DType::F32, Device::Cpu, 3).unwrap();
    let t = Transfer::new(vgg, &tiny(), (&content, &style), &noise, (1.0, 1000.0)).unwrap();
    let losses = t.evaluate().unwrap();
    assert!(losses.content > 0.0 && losses.style > 0.0);
    let params = t.vgg().named_parameters();
    assert!(!params.is_empty());
    for (name, p) in &params {
        assert!(!p.requires_grad(), "{name} requires grad");
        assert!(p.grad().is_none(), "{name} got a gradient");
    }
    let grad = t.image().grad().expect("the image has a gradient");
    assert_eq!(grad.shape(), &[1, 3, 12, 15]);
    // The image's gradient is the only gradient left (an input's, not a
    // parameter's), and nothing is saved.
    assert_eq!(
        ledger.live_in(Device::Cpu, Category::InputGradient),
        3 * 12 * 15 * 4
    );
    assert_eq!(ledger.live_gradients(Device::Cpu), 3 * 12 * 15 * 4);
    assert_eq!(ledger.live_in(Device::Cpu, Category::Saved), 0);
}

#[test]
fn frames_are_written_at_the_right_steps() {
    // A folder that does not exist yet: it is created.
    let dir = tempdir("frames").join("new");
    let opts = StyleOptions {
        every: Some(2),
        ..options(&dir, StyleOptimizer::Adam, 5)
    };
    let r = run(&opts).unwrap();
    let expected: Vec<PathBuf> = [2, 4].iter().map(|&s| frame_path(&opts.out, s)).collect();
    assert_eq!(r.frames, expected);
    assert_eq!(expected[0], dir.join("out-000002.png"));
    for path in expected.iter().chain([&r.written]) {
        let img = leangrad::data::read_image(path).unwrap();
        assert_eq!(img.shape(), &[3, 12, 15], "{}", path.display());
    }
    assert!(!frame_path(&opts.out, 5).exists());
    assert!(!frame_path(&opts.out, 1).exists());
}

#[test]
fn weight_files_with_the_classifier_load_and_wrong_names_fail() {
    let dir = tempdir("weights");
    let features = load_safetensors(fixtures().join("tiny_vgg_features.safetensors")).unwrap();
    // A whole state dict: the features plus a classifier of other shapes.
    let mut whole: Vec<(String, Tensor)> = features.clone().into_iter().collect();
    for (i, shape) in [(0, [16, 32]), (3, [16, 16]), (6, [10, 16])] {
        let w = Tensor::randn(&shape, DType::F32, Device::Cpu, i).unwrap();
        let b = Tensor::zeros(&shape[..1], DType::F32, Device::Cpu).unwrap();
        whole.push((format!("classifier.{i}.weight"), w));
        whole.push((format!("classifier.{i}.bias"), b));
    }
    let path = dir.join("whole.safetensors");
    save_safetensors(&path, &whole).unwrap();
    let vgg = Vgg::new(&tiny().config, DType::F32, Device::Cpu, 9).unwrap();
    load_vgg_features(&vgg, &path).unwrap();
    let loaded = vgg.named_parameters();
    let conv = loaded
        .iter()
        .find(|(n, _)| n == "features.5.weight")
        .unwrap();
    assert_eq!(
        conv.1.to_f64_vec().unwrap(),
        features["features.5.weight"].to_f64_vec().unwrap()
    );

    let mut extra = whole.clone();
    extra.push((
        "head.weight".into(),
        Tensor::zeros(&[2], DType::F32, Device::Cpu).unwrap(),
    ));
    let path = dir.join("extra.safetensors");
    save_safetensors(&path, &extra).unwrap();
    match load_vgg_features(&vgg, &path) {
        Err(Error::StateDictMismatch { unexpected, .. }) => {
            assert_eq!(unexpected, vec!["head.weight".to_string()])
        }
        other => panic!("expected a mismatch, got {other:?}"),
    }
    let missing: Vec<_> = whole
        .into_iter()
        .filter(|(n, _)| n != "features.10.bias")
        .collect();
    let path = dir.join("missing.safetensors");
    save_safetensors(&path, &missing).unwrap();
    match load_vgg_features(&vgg, &path) {
        Err(Error::StateDictMismatch { missing, .. }) => {
            assert_eq!(missing, vec!["features.10.bias".to_string()])
        }
        other => panic!("expected a mismatch, got {other:?}"),
    }
}

#[test]
fn bad_inputs_are_typed_errors_naming_them() {
    let dir = tempdir("errors");
    let opts = StyleOptions {
        content: dir.join("no-such-content.png"),
        ..options(&dir, StyleOptimizer::Adam, 1)
    };
    match run(&opts) {
        Err(Error::Image { path, .. }) => assert_eq!(path, dir.join("no-such-content.png")),
        other => panic!("expected an image error, got {other:?}"),
    }
    let opts = StyleOptions {
        weights: Some(dir.join("vgg.safetensors")),
        ..options(&dir, StyleOptimizer::Adam, 1)
    };
    let err = run(&opts).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { op: "style", .. }));
    assert!(err.to_string().contains("vgg.safetensors"), "{err}");
    let err = StyleNet::named("vgg11").unwrap_err();
    assert!(err.to_string().contains("vgg11"), "{err}");
    let err = StyleOptimizer::parse("sgd").unwrap_err();
    assert!(err.to_string().contains("sgd"), "{err}");
    for bad in [
        StyleOptions {
            steps: 0,
            ..options(&dir, StyleOptimizer::Adam, 1)
        },
        StyleOptions {
            every: Some(0),
            ..options(&dir, StyleOptimizer::Adam, 1)
        },
        StyleOptions {
            lr: Some(-1.0),
            ..options(&dir, StyleOptimizer::Adam, 1)
        },
        StyleOptions {
            style_weight: f64::NAN,
            ..options(&dir, StyleOptimizer::Adam, 1)
        },
    ] {
        assert!(matches!(
            run(&bad),
            Err(Error::InvalidArgument { op: "style", .. })
        ));
    }
    assert!(!dir.join("out.png").exists());
}

#[test]
fn command_runs_vgg16_without_weights_and_says_so() {
    let dir = tempdir("cli");
    let out = dir.join("result.png");
    let content = fixtures().join("content.png");
    let style = fixtures().join("style.png");
    let run = |extra: &[&str]| {
        let mut args = vec![
            "style".to_string(),
            "--content".into(),
            content.display().to_string(),
            "--style".into(),
            style.display().to_string(),
            "--out".into(),
            out.display().to_string(),
            "--size".into(),
            "16".into(),
            "--device".into(),
            "cpu".into(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        std::process::Command::new(env!("CARGO_BIN_EXE_leangrad"))
            .args(&args)
            .output()
            .unwrap()
    };
    let o = run(&[
        "--model",
        "vgg16",
        "--steps",
        "2",
        "--optimizer",
        "adam",
        "--json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let report: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(report["model"], "vgg16");
    assert_eq!(report["random_init"], true);
    assert_eq!(report["steps"], 2);
    assert_eq!(report["history"].as_array().unwrap().len(), 2);
    assert_eq!(
        (report["height"].clone(), report["width"].clone()),
        (16.into(), 20.into())
    );
    assert!(out.exists());
    let o = run(&["--model", "vgg11"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("vgg11"));
}

fn refused(r: leangrad::Result<StyleReport>, file: &Path, why: &str) {
    match r {
        Err(Error::OutputFile { path, reason }) => {
            assert_eq!(path, file);
            assert!(reason.contains(why), "{reason}");
            assert!(reason.contains("choose another --out"), "{reason}");
            assert!(!reason.contains("File exists"), "{reason}");
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
    let dir = tempdir("clobber");
    // `--out` the content image itself (written by PIL, not leangrad).
    let content = dir.join("photo.png");
    std::fs::copy(fixtures().join("content.png"), &content).unwrap();
    let before = std::fs::read(&content).unwrap();
    let opts = StyleOptions {
        content: content.clone(),
        out: content.clone(),
        ..options(&dir, StyleOptimizer::Adam, 1)
    };
    refused(run(&opts), &content, "did not write");
    assert_eq!(std::fs::read(&content).unwrap(), before);

    // A user's file where a frame would go: refused before any step, the
    // result and the earlier frame not written.
    let opts = StyleOptions {
        every: Some(1),
        ..options(&dir, StyleOptimizer::Adam, 2)
    };
    std::fs::copy(fixtures().join("style.png"), frame_path(&opts.out, 2)).unwrap();
    refused(run(&opts), &frame_path(&opts.out, 2), "did not write");
    assert!(!opts.out.exists());
    assert!(!frame_path(&opts.out, 1).exists());

    // leangrad's own earlier result is replaced.
    let again = options(&dir.join("again"), StyleOptimizer::Adam, 1);
    run(&again).unwrap();
    assert!(is_leangrad_png(&again.out));
    run(&again).unwrap();

    // A regular file on the way: it is not a folder.
    let file = dir.join("notes");
    std::fs::write(&file, "mine").unwrap();
    let opts = StyleOptions {
        out: file.join("x.png"),
        ..options(&dir, StyleOptimizer::Adam, 1)
    };
    refused(run(&opts), &file.join("x.png"), "`");
    let err = run(&opts).unwrap_err().to_string();
    assert!(
        err.contains(&format!("`{}` is not a folder", file.display())),
        "{err}"
    );
}

#[test]
fn the_caffe_input_is_bgr_on_0_to_255_with_the_mean_subtracted() {
    use leangrad::jobs::style::{InputConvention, CAFFE_MEAN_BGR};
    let content = read_resized(&fixtures().join("content.png"), 12).unwrap();
    let style = read_resized(&fixtures().join("style.png"), 12).unwrap();
    let vgg = Vgg::new(&tiny().config, DType::F32, Device::Cpu, 3).unwrap();
    let t = Transfer::with_input(
        vgg,
        &tiny(),
        (&content, &style),
        &content,
        (1.0, 1000.0),
        InputConvention::Caffe,
    )
    .unwrap();
    let x = t.image().to_f64_vec().unwrap();
    let input = t.network_input().unwrap();
    assert_eq!(input.shape(), &[1, 3, 12, 15]);
    let got = input.to_f64_vec().unwrap();
    let plane = 12 * 15;
    for c in 0..3 {
        for p in 0..plane {
            // Channel c of the input is channel 2 − c of the image (BGR).
            let want = 255.0 * x[(2 - c) * plane + p] - CAFFE_MEAN_BGR[c];
            let g = got[c * plane + p];
            assert!(
                (g - want).abs() <= 3e-5,
                "channel {c} pixel {p}: {g} vs {want}"
            );
        }
    }
    // torchvision's: (x − mean) / std, channels in order.
    let vgg = Vgg::new(&tiny().config, DType::F32, Device::Cpu, 3).unwrap();
    let t = Transfer::new(vgg, &tiny(), (&content, &style), &content, (1.0, 1.0)).unwrap();
    let got = t.network_input().unwrap().to_f64_vec().unwrap();
    let (mean, std) = (leangrad::data::IMAGENET_MEAN, leangrad::data::IMAGENET_STD);
    for c in 0..3 {
        let p = 7;
        let want = (x[c * plane + p] - mean[c]) / std[c];
        assert!((got[c * plane + p] - want).abs() < 1e-5);
    }
    // The losses read the Caffe input: the same run under both conventions
    // starts from different losses, and the option is reported.
    let dir = tempdir("caffe");
    let caffe = run(&StyleOptions {
        input_convention: InputConvention::Caffe,
        ..options(&dir, StyleOptimizer::Adam, 1)
    })
    .unwrap();
    assert_eq!(caffe.input_convention, InputConvention::Caffe);
    let plain = run(&options(&dir, StyleOptimizer::Adam, 1)).unwrap();
    assert!(
        caffe.history[0] > 100.0 * plain.history[0],
        "{} vs {}",
        caffe.history[0],
        plain.history[0]
    );
    assert_eq!(
        InputConvention::parse("caffe").unwrap(),
        InputConvention::Caffe
    );
    assert!(InputConvention::parse("bgr").is_err());
}

/// The losses of a healthy L-BFGS run (leangrad style, VGG-19 without
/// weights, 48-pixel fixture images, `--init noise`, 60 steps): spikes up
/// to 34× the first step's for up to 5 steps, then down to 2·10⁻⁴ of it.
const SPIKY_BUT_HEALTHY: [f64; 60] = [
    5.31, 5.31, 51.7, 5.28, 4.58, 15.5, 4.3, 3.52, 2.65, 1.75, 68.6, 9.3, 3.71, 2.81, 1.84, 30.7,
    3.56, 3.01, 2.4, 156.0, 151.0, 179.0, 153.0, 72.7, 2.01, 1.37, 1.08, 0.563, 0.395, 0.278,
    0.202, 0.132, 0.0951, 0.0701, 0.0482, 0.0298, 0.0201, 0.0166, 0.0134, 0.0109, 0.00744, 0.00562,
    0.00516, 0.00456, 0.00438, 0.00406, 0.00348, 0.0029, 0.00246, 0.00216, 0.00186, 0.00158,
    0.00137, 0.00133, 0.00123, 0.00118, 0.00114, 0.00105, 0.000962, 0.000912,
];

#[test]
fn divergence_is_a_non_finite_loss_or_one_that_stays_ten_times_the_first() {
    use leangrad::jobs::style::{divergence, divergence_at_end, DIVERGENCE_STEPS};
    assert_eq!(DIVERGENCE_STEPS, 10);
    assert!(divergence(&[]).is_none());
    assert!(divergence(&[2.0]).is_none());
    // One step far up is not divergence; ten in a row are.
    assert!(divergence(&[2.0, 1.0, 20.5]).is_none());
    let mut history = vec![2.0];
    history.extend([25.0; 9]);
    assert!(divergence(&history).is_none());
    history.push(20.5);
    let why = divergence(&history).unwrap();
    assert!(why.contains("for 10 steps"), "{why}");
    assert!(why.contains("at step 11"), "{why}");
    history.push(3.0);
    assert!(divergence(&history).is_none());
    assert!(divergence(&[2.0, f64::NAN])
        .unwrap()
        .contains("NaN at step 2"));
    assert!(divergence(&[f64::INFINITY])
        .unwrap()
        .contains("inf at step 1"));
    // The result: ten times worse than the start, or not a number.
    assert!(divergence_at_end(&[2.0, 1.0], 19.9).is_none());
    let why = divergence_at_end(&[2.0, 1.0], 20.5).unwrap();
    assert!(why.contains("for the result"), "{why}");
    assert!(divergence_at_end(&[2.0], f64::NAN).is_some());
    // Never on healthy runs: L-BFGS's spikes, and PyTorch's runs for the
    // fixture (Adam's rises 3.8× above its first step), at any step.
    let f = reference();
    let mut healthy = vec![SPIKY_BUT_HEALTHY.to_vec()];
    for optimizer in ["adam", "lbfgs"] {
        let history: Vec<f64> = f[optimizer]["history"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["total"].as_f64().unwrap())
            .collect();
        healthy.push(history);
    }
    for history in &healthy {
        for k in 1..=history.len() {
            assert!(divergence(&history[..k]).is_none(), "{history:?} {k}");
        }
        let last = *history.last().unwrap();
        assert!(divergence_at_end(history, last).is_none());
    }
}

#[test]
fn a_diverging_run_stops_unless_told_to_keep_going() {
    let dir = tempdir("diverging");
    // Adam at a learning rate 10⁴ times the fixture's: the first update
    // throws the image to the clamps and the loss far above its start.
    let wild = StyleOptions {
        lr: Some(500.0),
        ..options(&dir, StyleOptimizer::Adam, 4)
    };
    match run(&wild) {
        Err(Error::Diverged {
            job: "style",
            reason,
        }) => {
            assert!(reason.contains("rose from"), "{reason}");
            assert!(reason.contains("--lr, now 500"), "{reason}");
            assert!(reason.contains("--input-convention caffe"), "{reason}");
        }
        other => panic!("expected a divergence, got {other:?}"),
    }
    assert!(!wild.out.exists(), "no result written");
    // A longer run stops as soon as the loss has stayed up for 10 steps.
    let long = StyleOptions {
        steps: 30,
        every: Some(1),
        ..wild.clone()
    };
    match run(&long) {
        Err(Error::Diverged { reason, .. }) => {
            assert!(reason.contains("for 10 steps"), "{reason}");
            assert!(reason.contains("at step 11"), "{reason}");
        }
        other => panic!("expected a divergence, got {other:?}"),
    }
    assert!(frame_path(&long.out, 10).exists());
    assert!(!frame_path(&long.out, 11).exists());
    assert!(!long.out.exists());
    let r = run(&StyleOptions {
        keep_going: true,
        ..wild
    })
    .unwrap();
    assert!(r.diverged.as_deref().unwrap().contains("rose from"));
    assert_eq!(r.history.len(), 4);
    // The fixture's healthy runs do not stop.
    for optimizer in [StyleOptimizer::Adam, StyleOptimizer::Lbfgs] {
        let r = run(&options(&dir, optimizer, 4)).unwrap();
        assert!(r.diverged.is_none());
    }
}
