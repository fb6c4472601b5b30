//! How long a memory prediction on the meta device takes: one whole
//! training step (forward, loss, backward, update) under the lean policy
//! and under save-all, for each full-size model and case, as JSON lines
//! (best of 5), then ResNet-18 (all trainable) at batch 10² … 10⁶: the
//! prediction's time must not grow with the batch. Run:
//! `cargo bench --bench meta_plan`.
use leangrad::memory_plan::{plan, OptimizerKind, StepSpec, MODELS};
use leangrad::models::Case;
use leangrad::{DType, Device};
use std::time::Instant;

fn main() {
    for batch in [100, 10_000, 1_000_000] {
        let model = &MODELS[0];
        let spec = StepSpec {
            batch,
            input: model.step_input(None, None).expect("resnet18 reads images"),
            classes: 1000,
            dtype: DType::F32,
            optimizer: OptimizerKind::Sgd,
            fused: false,
            checkpoint: false,
            optimizer_state: leangrad::optim::StateFormat::Full,
            autocast: None,
            case: Case::all()[0],
            device: Device::Meta,
        };
        let t = Instant::now();
        let p = plan(model.name, &spec).expect("resnet18 plans");
        println!(
            "{{\"model\":\"{}\",\"case\":\"{}\",\"batch\":{batch},\"seconds\":{:.4},\"lean_peak\":{}}}",
            model.name,
            spec.case,
            t.elapsed().as_secs_f64(),
            p.lean.report.peak_total
        );
    }
    for model in MODELS {
        for case in Case::all() {
            let Ok(input) = model.step_input(None, None) else {
                continue;
            };
            let spec = StepSpec {
                batch: 64,
                input,
                classes: 1000,
                dtype: DType::F32,
                optimizer: OptimizerKind::Sgd,
                fused: false,
                checkpoint: false,
                optimizer_state: leangrad::optim::StateFormat::Full,
                autocast: None,
                case,
                device: Device::Meta,
            };
            let mut best = f64::INFINITY;
            let mut peaks = (0, 0);
            for _ in 0..5 {
                let t = Instant::now();
                match plan(model.name, &spec) {
                    Ok(p) => {
                        best = best.min(t.elapsed().as_secs_f64());
                        peaks = (p.lean.report.peak_total, p.pytorch.report.peak_total);
                    }
                    Err(e) => {
                        println!(
                            "{{\"model\":\"{}\",\"case\":\"{}\",\"error\":\"{e}\"}}",
                            model.name, case
                        );
                        break;
                    }
                }
            }
            if best.is_finite() {
                println!(
                    "{{\"model\":\"{}\",\"case\":\"{}\",\"batch\":64,\"seconds\":{best:.4},\"lean_peak\":{},\"pytorch_peak\":{}}}",
                    model.name,
                    case,
                    peaks.0,
                    peaks.1
                );
            }
        }
    }
}
