//! `GradScaler` against `torch.amp.GradScaler` (tests/fixtures/grad_scaler.json,
//! from python-compare/grad_scaler_fixture.py): the same scales, growth
//! trackers and skipped steps over forced (inf, NaN) and natural overflows,
//! the same weights; the fused path (norm pass, then the update inside
//! backward) bit for bit the usual one; the same on CUDA; misuse as clear
//! errors.
mod cuda_common;

use leangrad::ops::Reduction;
use leangrad::optim::{Clip, GradScaler, Optimizer, Sgd};
use leangrad::{Device, Error, Result, Tensor};
use serde_json::Value;

const CPU: Device = Device::Cpu;

fn fixture() -> Value {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/grad_scaler.json"
    ))
    .unwrap();
    serde_json::from_str(&text).unwrap()
}

/// The fixture's tensors: `x` 5×4, `y` 5×3, `W` 3×4 (f32, from formulas).
fn data() -> (Tensor, Tensor, Tensor) {
    data_on(CPU)
}

/// [`data`] on `device`.
fn data_on(device: Device) -> (Tensor, Tensor, Tensor) {
    let f = |rows: usize, cols: usize, v: &dyn Fn(usize, usize) -> f64| {
        let d: Vec<f32> = (0..rows * cols)
            .map(|k| v(k / cols, k % cols) as f32)
            .collect();
        Tensor::from_vec(d, &[rows, cols], CPU).unwrap()
    };
    let x = f(5, 4, &|i, j| ((7 * i + j) as f64).sin());
    let y = f(5, 3, &|i, j| ((3 * i + 2 * j) as f64).cos());
    let w = f(3, 4, &|i, j| 0.1 * (i as f64 - j as f64) + 0.05);
    let on = |t: Tensor| t.to_device(device).unwrap();
    (on(x), on(y), on(w).into_parameter().unwrap())
}

fn factor(s: &str) -> f64 {
    s.parse().unwrap()
}

/// One row per step: (skipped, scale, growth tracker, W).
type Steps = Vec<(bool, f64, u32, Vec<f32>)>;

fn scaler(scenario: &Value) -> GradScaler {
    GradScaler::new()
        .init_scale(scenario["init_scale"].as_f64().unwrap())
        .unwrap()
        .growth_interval(scenario["growth_interval"].as_u64().unwrap() as u32)
        .unwrap()
}

/// The scenario's steps on `device`: the usual path (scale, backward,
/// step, update) or the fused one (`backward_step`, update).
fn steps(scenario: &Value, device: Device, fused: bool) -> Steps {
    let (x, y, w) = data_on(device);
    let mut opt = Optimizer::new([w.clone()], Sgd::new(0.1)).unwrap();
    let mut s = scaler(scenario);
    let mut out = Vec::new();
    for step in scenario["steps"].as_array().unwrap() {
        let f = factor(step["factor"].as_str().unwrap());
        let forward = || -> Result<Tensor> {
            x.matmul(&w.t()?)?
                .mse_loss(&y, Reduction::Mean)?
                .mul_scalar(f)
        };
        let ran = if fused {
            let ran = s.backward_step(&mut opt, forward).unwrap();
            assert!(w.grad().is_none(), "the fused path keeps no gradient");
            ran
        } else {
            opt.zero_grad();
            s.scale(&forward().unwrap()).unwrap().backward().unwrap();
            let ran = s.step(&mut opt).unwrap();
            assert_eq!(ran, !s.found_inf());
            ran
        };
        s.update().unwrap();
        out.push((
            !ran,
            s.get_scale(),
            s.growth_tracker(),
            w.to_vec::<f32>().unwrap(),
        ));
    }
    out
}

fn usual(scenario: &Value, device: Device) -> Steps {
    steps(scenario, device, false)
}

fn fused(scenario: &Value, device: Device) -> Steps {
    steps(scenario, device, true)
}

#[test]
fn scales_and_skipped_steps_are_pytorchs() {
    let fx = fixture();
    for name in ["forced", "natural"] {
        let scenario = &fx[name];
        let got = usual(scenario, CPU);
        let want = scenario["steps"].as_array().unwrap();
        assert_eq!(got.len(), want.len());
        for (i, ((skipped, scale, tracker, w), step)) in got.iter().zip(want).enumerate() {
            let at = format!("{name} step {i}");
            assert_eq!(*skipped, step["skipped"].as_bool().unwrap(), "{at}");
            assert_eq!(*scale, step["scale"].as_f64().unwrap(), "{at}");
            assert_eq!(
                *tracker as u64,
                step["growth_tracker"].as_u64().unwrap(),
                "{at}"
            );
            for (a, b) in w.iter().zip(step["w"].as_array().unwrap()) {
                let b = b.as_f64().unwrap() as f32;
                assert!((a - b).abs() <= 1e-6 * b.abs().max(1.0), "{at}: {a} vs {b}");
            }
        }
        // Some steps skipped and some taken, in each scenario.
        assert!(
            got.iter().any(|s| s.0) && got.iter().any(|s| !s.0),
            "{name}"
        );
    }
}

#[test]
fn the_fused_path_is_the_usual_one_bit_for_bit() {
    let fx = fixture();
    for name in ["forced", "natural"] {
        let bits = |steps: Steps| -> Vec<(bool, u64, u32, Vec<u32>)> {
            steps
                .into_iter()
                .map(|(s, sc, t, w)| (s, sc.to_bits(), t, w.iter().map(|v| v.to_bits()).collect()))
                .collect()
        };
        assert_eq!(
            bits(fused(&fx[name], CPU)),
            bits(usual(&fx[name], CPU)),
            "{name}"
        );
    }
}

#[test]
fn unscaling_before_clipping_is_what_the_fused_path_clips() {
    // Usual: unscale, clip the unscaled gradients' global norm, step.
    let (x, y, w) = data();
    let loss = |w: &Tensor| -> Result<Tensor> { x.matmul(&w.t()?)?.mse_loss(&y, Reduction::Mean) };
    let mut opt = Optimizer::new([w.clone()], Sgd::new(0.1)).unwrap();
    let mut s = GradScaler::new();
    s.scale(&loss(&w).unwrap()).unwrap().backward().unwrap();
    s.unscale(&opt).unwrap();
    let norm = opt.clip_grad_norm(0.05).unwrap();
    assert!(norm > 0.05, "the clip must bite: {norm}");
    assert!(s.step(&mut opt).unwrap());
    s.update().unwrap();
    // Fused: Clip::GlobalNorm inside the optimizer, on the unscaled norm.
    let (_, _, w2) = data();
    let mut opt2 = Optimizer::new([w2.clone()], Sgd::new(0.1)).unwrap();
    opt2.set_clip(Clip::GlobalNorm(0.05)).unwrap();
    let mut s2 = GradScaler::new();
    assert!(s2.backward_step(&mut opt2, || loss(&w2)).unwrap());
    s2.update().unwrap();
    let (a, b) = (w.to_vec::<f32>().unwrap(), w2.to_vec::<f32>().unwrap());
    for (a, b) in a.iter().zip(&b) {
        assert!((a - b).abs() <= 1e-7, "{a} vs {b}");
    }
}

#[test]
fn misuse_is_a_clear_error() {
    let bad = |r: Result<()>, want: &str| match r {
        Err(Error::InvalidArgument {
            op: "GradScaler",
            msg,
        }) => {
            assert!(msg.contains(want), "{msg}")
        }
        other => panic!("{other:?}"),
    };
    bad(GradScaler::new().init_scale(0.0).map(drop), "init_scale");
    bad(
        GradScaler::new().growth_factor(1.0).map(drop),
        "growth_factor",
    );
    bad(
        GradScaler::new().backoff_factor(1.5).map(drop),
        "backoff_factor",
    );
    bad(
        GradScaler::new().growth_interval(0).map(drop),
        "growth_interval",
    );
    let (x, y, w) = data();
    let mut opt = Optimizer::new([w.clone()], Sgd::new(0.1)).unwrap();
    let mut s = GradScaler::new();
    bad(s.update(), "without a step");
    let loss = x
        .matmul(&w.t().unwrap())
        .unwrap()
        .mse_loss(&y, Reduction::Mean)
        .unwrap();
    s.scale(&loss).unwrap().backward().unwrap();
    s.unscale(&opt).unwrap();
    bad(s.unscale(&opt), "already");
    s.step(&mut opt).unwrap();
    bad(s.step(&mut opt).map(drop), "already");
    s.update().unwrap();
    // f16 gradients: keep f32 master weights.
    let h = Tensor::from_vec(vec![1.0f32, 2.0], &[2], CPU)
        .unwrap()
        .to_dtype(leangrad::DType::F16)
        .unwrap()
        .into_parameter()
        .unwrap();
    let opt16 = Optimizer::new([h.clone()], Sgd::new(0.1)).unwrap();
    s.scale(&h.sum_all().unwrap()).unwrap().backward().unwrap();
    bad(s.unscale(&opt16), "f32 master weights");
}

#[test]
fn disabled_it_is_the_plain_step() {
    let (x, y, w) = data();
    let mut opt = Optimizer::new([w.clone()], Sgd::new(0.1)).unwrap();
    let mut s = GradScaler::new().enabled(false);
    assert_eq!(s.get_scale(), 1.0);
    let loss = x
        .matmul(&w.t().unwrap())
        .unwrap()
        .mse_loss(&y, Reduction::Mean)
        .unwrap();
    let scaled = s.scale(&loss).unwrap();
    assert_eq!(
        scaled.to_vec::<f32>().unwrap(),
        loss.to_vec::<f32>().unwrap()
    );
    scaled.backward().unwrap();
    assert!(s.step(&mut opt).unwrap());
    s.update().unwrap();
}

#[test]
fn on_cuda_the_same_scales_skips_and_weights() {
    let fx = fixture();
    for device in cuda_common::devices("grad_scaler") {
        if device == CPU {
            continue;
        }
        for name in ["forced", "natural"] {
            let want = usual(&fx[name], CPU);
            for (path, got) in [
                ("usual", usual(&fx[name], device)),
                ("fused", fused(&fx[name], device)),
            ] {
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    let at = format!("{name} {path} step {i} on {device}");
                    assert_eq!((g.0, g.1, g.2), (w.0, w.1, w.2), "{at}");
                    for (a, b) in g.3.iter().zip(&w.3) {
                        assert!((a - b).abs() <= 1e-6 * b.abs().max(1.0), "{at}: {a} vs {b}");
                    }
                }
            }
        }
    }
}
