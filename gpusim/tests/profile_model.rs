//! The performance model against every real-GPU measurement of a step the
//! project has profiles for: ResNet-18 forward + backward at batch 64,
//! 224² (`benches/conv_stack.rs`), measured on an H200
//! (`benches/results/2026-11-27-h200.md`, after the pool fix) and an H100
//! (`benches/results/2026-11-25-h100.md`). The profiles in
//! `tests/calibration/` are the simulator's of the same steps at 32² and
//! 64² (`conv_stack --profile-dir`, counts identical at every size), from
//! which the 224² step is extrapolated. Each row's error is printed; the
//! test holds every row within [`MAX_ERROR`].
//!
//! `cargo test --release -p leangrad-gpusim --test profile_model -- --ignored --nocapture`
//! searches the fitted constants around `model::COSTS` and prints the best.

use leangrad_gpusim::profile::model::{self, Costs, Gpu, COSTS, H100_SXM, H200};
use leangrad_gpusim::profile::{extrapolate, Profile};

/// The largest relative error any row may have (the aim is ±25%; the
/// fitted model is within about ±8% of these rows, so a drift shows).
const MAX_ERROR: f64 = 0.15;

/// One measurement: the profile's name (`<dtype>_<case>_<policy>`, conv
/// workspace budget in bytes), the GPU, the measured median ms, where.
struct Measured {
    step: &'static str,
    workspace: u64,
    gpu: &'static Gpu,
    ms: f64,
    source: &'static str,
}

const fn m(
    step: &'static str,
    workspace: u64,
    gpu: &'static Gpu,
    ms: f64,
    source: &'static str,
) -> Measured {
    Measured {
        step,
        workspace,
        gpu,
        ms,
        source,
    }
}

const H200_RUN: &str = "2026-11-27-h200 (after)";
const H100_RUN: &str = "2026-11-25-h100";

const MEASURED: [Measured; 6] = [
    m("f32_all_lean", 0, &H200, 122.4, H200_RUN),
    m("f32_input_lean", 0, &H200, 86.5, H200_RUN),
    m("f32_input-bn-eval_lean", 0, &H200, 77.5, H200_RUN),
    m("bf16_all_lean", 0, &H200, 96.5, H200_RUN),
    m("bf16_input_lean", 0, &H200, 68.5, H200_RUN),
    m("bf16_input-bn-eval_lean", 0, &H200, 59.4, H200_RUN),
];

/// Measurements on the H100 (the pool gave freed memory back at every
/// synchronisation then, which the model does not price: reported, held
/// to the same bound).
const MEASURED_H100: [Measured; 6] = [
    m("f32_all_lean", 0, &H100_SXM, 131.8, H100_RUN),
    m("f32_input_lean", 0, &H100_SXM, 95.0, H100_RUN),
    m("f32_input-bn-eval_lean", 0, &H100_SXM, 87.8, H100_RUN),
    m("bf16_all_lean", 0, &H100_SXM, 100.1, H100_RUN),
    m("bf16_input_lean", 0, &H100_SXM, 72.7, H100_RUN),
    m("bf16_input-bn-eval_lean", 0, &H100_SXM, 63.8, H100_RUN),
];

/// Steps not used in the fit, reported beside the fitted rows and not held
/// to the bound: the H100's steps with a 256 MiB convolution workspace
/// (fewer, larger GEMMs; predicted within 9–16%), and the save-all
/// policy's steps on the H200
/// (what PyTorch's autograd keeps), which take 2.3–3.9× the lean steps'
/// time with nearly the same launches — the model does not explain that.
const HELD_OUT: [Measured; 9] = [
    m("f32_all_lean", 256 << 20, &H100_SXM, 101.0, H100_RUN),
    m("f32_input_lean", 256 << 20, &H100_SXM, 67.1, H100_RUN),
    m(
        "f32_input-bn-eval_lean",
        256 << 20,
        &H100_SXM,
        57.6,
        H100_RUN,
    ),
    m("f32_all_save-all", 0, &H200, 283.9, H200_RUN),
    m("f32_input_save-all", 0, &H200, 247.5, H200_RUN),
    m("f32_input-bn-eval_save-all", 0, &H200, 241.0, H200_RUN),
    m("bf16_all_save-all", 0, &H200, 304.2, H200_RUN),
    m("bf16_input_save-all", 0, &H200, 244.1, H200_RUN),
    m("bf16_input-bn-eval_save-all", 0, &H200, 231.9, H200_RUN),
];

fn load(step: &str, size: u32, workspace: u64) -> Profile {
    let path = format!(
        "{}/tests/calibration/{step}_b64_{size}_ws{workspace}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    Profile::from_json(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The 224² profile of `step`, extrapolated from its 32² and 64² runs.
fn at_224(step: &str, workspace: u64) -> Profile {
    let (a, b) = (load(step, 32, workspace), load(step, 64, workspace));
    let t = (224.0f64 * 224.0 - 32.0 * 32.0) / (64.0 * 64.0 - 32.0 * 32.0);
    extrapolate(&a, &b, t).unwrap_or_else(|e| panic!("{step}: {e}"))
}

fn rows() -> Vec<(&'static Measured, Profile)> {
    MEASURED
        .iter()
        .chain(MEASURED_H100.iter())
        .map(|r| (r, at_224(r.step, r.workspace)))
        .collect()
}

/// Relative error of each row under `costs`.
fn errors(rows: &[(&Measured, Profile)], costs: &Costs) -> Vec<f64> {
    rows.iter()
        .map(|(r, p)| model::predict_with(p, r.gpu, costs).total_us / 1e3 / r.ms - 1.0)
        .collect()
}

#[test]
fn the_model_predicts_every_measured_step() {
    let rows = rows();
    let errs = errors(&rows, &COSTS);
    println!(
        "{:<26} {:>5} {:>8} {:>10} {:>11} {:>7}  source",
        "step (ResNet-18 b64 224²)", "GPU", "ws MiB", "measured", "predicted", "error"
    );
    for ((r, p), e) in rows.iter().zip(&errs) {
        let pred = model::predict(p, r.gpu);
        println!(
            "{:<26} {:>5} {:>8} {:>8.1}ms {:>9.1}ms {:>+6.1}%  {} (kernels {:.1}, GEMMs {:.1}, idle {:.1} ms)",
            r.step,
            r.gpu.name,
            r.workspace >> 20,
            r.ms,
            pred.total_us / 1e3,
            100.0 * e,
            r.source,
            pred.kernels_us / 1e3,
            pred.gemms_us / 1e3,
            pred.device_idle_us / 1e3
        );
    }
    let worst = errs.iter().fold(0.0f64, |a, e| a.max(e.abs()));
    println!("largest error {:.1}%", 100.0 * worst);
    println!("held out (not fitted, not held to the bound):");
    for r in &HELD_OUT {
        let pred = model::predict(&at_224(r.step, r.workspace), r.gpu).total_us / 1e3;
        println!(
            "{:<26} {:>5} {:>8} {:>8.1}ms {:>9.1}ms {:>+6.1}%  {}",
            r.step,
            r.gpu.name,
            r.workspace >> 20,
            r.ms,
            pred,
            100.0 * (pred / r.ms - 1.0),
            r.source
        );
    }
    assert!(worst <= MAX_ERROR, "largest error {:.1}%", 100.0 * worst);
}

/// A coordinate search over the fitted constants (not run by default).
#[test]
#[ignore]
fn fit_costs() {
    let rows = rows();
    let score = |c: &Costs| errors(&rows, c).iter().map(|e| e * e).sum::<f64>();
    let mut best = COSTS;
    let mut best_score = score(&best);
    for _ in 0..6 {
        for field in 0..6 {
            for factor in [0.5, 0.7, 0.85, 1.15, 1.4, 2.0] {
                let mut c = best;
                let v = match field {
                    0 => &mut c.host_launch_us,
                    1 => &mut c.host_gemm_us,
                    2 => &mut c.kernel_fixed_us,
                    3 => &mut c.gemm_fixed_us,
                    4 => &mut c.gemm_efficiency,
                    _ => &mut c.sync_us,
                };
                *v *= factor;
                if c.gemm_efficiency > 1.0 {
                    continue;
                }
                let s = score(&c);
                if s < best_score {
                    (best, best_score) = (c, s);
                }
            }
        }
    }
    println!("{best:#?}\nerrors: {:?}", errors(&rows, &best));
}
