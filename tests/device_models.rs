//! Whole models on every device: one training step of every tiny model of
//! the model tests (CNNs and transformers) on CUDA moves the ledger exactly
//! as on the CPU — peak and live bytes by category, the parameter-gradient
//! peak and saved bytes by layer, byte for byte — for the main cases, both
//! save policies, usual and fused SGD-momentum and AdamW; and the same with
//! every block a checkpointed segment (`--checkpoint`) for the models that
//! have blocks, and under bf16 and f16 autocast; and the tiny ResNet-101,
//! ResNeXt-101, AlexNet, MobileNetV3, RoBERTa, the Mistral-style decoder
//! and EfficientNetV2. Without a GPU only the
//! CPU runs and the CUDA half prints `skipped`.

mod tiny_models;

mod cuda_common;

use leangrad::autograd::SavePolicy;
use leangrad::memory_plan::{run_step, OptimizerKind, StepInput, StepSpec};
use leangrad::models::Case;
use leangrad::{DType, Device};
use tiny_models::{models, paper_models, Build};

fn check_model(index: usize) {
    let runs = [(OptimizerKind::Sgd, true), (OptimizerKind::Adamw, false)];
    check_steps(
        index,
        &["all", "input", "input-bn-eval", "surgical-last"],
        &runs,
        false,
        PLAIN,
    );
}

/// f32 and pure bf16 steps, no autocast.
const PLAIN: &[(DType, Option<DType>)] = &[(DType::F32, None), (DType::BF16, None)];

/// The models with blocks to checkpoint, each block a segment: fused AdamW.
fn check_checkpointed(index: usize) {
    check_steps(
        index,
        &["all", "input"],
        &[(OptimizerKind::Adamw, true)],
        true,
        PLAIN,
    );
}

/// An f32 model under bf16 and f16 autocast.
fn check_autocast(index: usize) {
    let runs = [(OptimizerKind::Sgd, false), (OptimizerKind::Adamw, true)];
    let variants = [
        (DType::F32, Some(DType::BF16)),
        (DType::F32, Some(DType::F16)),
    ];
    check_steps(index, &["all", "input-bn-eval"], &runs, false, &variants);
}

/// Every case × policy × run × (model dtype, autocast) variant: the CUDA
/// ledger equals the CPU's.
fn check_steps(
    index: usize,
    cases: &[&str],
    runs: &[(OptimizerKind, bool)],
    checkpoint: bool,
    variants: &[(DType, Option<DType>)],
) {
    let model = models().swap_remove(index);
    check_steps_of(model, cases, runs, checkpoint, variants);
}

/// [`check_steps`] for the tiny model `(name, build, input)`.
fn check_steps_of(
    (name, build, input): (&str, Build, StepInput),
    cases: &[&str],
    runs: &[(OptimizerKind, bool)],
    checkpoint: bool,
    variants: &[(DType, Option<DType>)],
) {
    let devices = cuda_common::devices(name);
    for case in cases.iter().map(|c| c.parse::<Case>().unwrap()) {
        for policy in [SavePolicy::Lean, SavePolicy::SaveAll] {
            for &(optimizer, fused) in runs {
                for &(dtype, autocast) in variants {
                    let spec = |device| StepSpec {
                        batch: 2,
                        input,
                        classes: 5,
                        dtype,
                        optimizer,
                        fused,
                        checkpoint,
                        optimizer_state: leangrad::optim::StateFormat::Full,
                        autocast,
                        case,
                        device,
                    };
                    let what = format!(
                        "{name} {case} {policy:?} {optimizer:?} fused={fused} {dtype:?} autocast={autocast:?} checkpoint={checkpoint}"
                    );
                    let cpu = run_step(build.as_ref(), &spec(Device::Cpu), policy)
                        .unwrap_or_else(|e| panic!("{what} cpu: {e}"));
                    for &dev in devices.iter().filter(|d| **d != Device::Cpu) {
                        let got = run_step(build.as_ref(), &spec(dev), policy)
                            .unwrap_or_else(|e| panic!("{what} {dev}: {e}"));
                        let (mut c, g) = (cpu.report.clone(), got.report);
                        assert_eq!(g.device, dev.to_string());
                        c.device = g.device.clone();
                        assert_eq!(c.peak, g.peak, "{what}: peak by category on {dev}");
                        assert_eq!(
                            c.saved_by_layer, g.saved_by_layer,
                            "{what}: saved by layer on {dev}"
                        );
                        assert_eq!(c, g, "{what}: whole report on {dev}");
                    }
                    assert!(cpu.report.peak_total > 0, "{what}");
                }
            }
        }
    }
}

#[test]
fn resnet18_tiny_ledger_matches_on_every_device() {
    check_model(0);
}

#[test]
fn resnet50_tiny_ledger_matches_on_every_device() {
    check_model(1);
}

#[test]
fn vgg16_bn_tiny_ledger_matches_on_every_device() {
    check_model(3);
}

#[test]
fn mobilenet_v2_tiny_ledger_matches_on_every_device() {
    check_model(4);
}

#[test]
fn transformers_tiny_ledger_match_on_every_device() {
    check_model(7);
    check_model(6);
    check_model(5);
}

#[test]
fn checkpointed_blocks_ledger_matches_on_every_device() {
    for index in [0, 1, 4, 5, 6, 7] {
        check_checkpointed(index);
    }
}

#[test]
fn autocast_ledger_matches_on_every_device() {
    for index in [0, 1, 3, 4, 5, 6, 7] {
        check_autocast(index);
    }
}

/// The tiny ResNet-101, ResNeXt-101 (grouped convolutions), AlexNet
/// (dropout, 64×64 images), MobileNetV3 (squeeze-and-excitation,
/// Hardswish), RoBERTa (positions after the padding token), the
/// Mistral-style decoder and EfficientNetV2 (FusedMBConv, SiLU, stochastic
/// depth): f32 and
/// bf16 steps with fused SGD and AdamW, all but AlexNet also with every
/// block checkpointed.
#[test]
fn paper_models_tiny_ledger_matches_on_every_device() {
    let runs = [(OptimizerKind::Sgd, true), (OptimizerKind::Adamw, false)];
    for model in paper_models() {
        check_steps_of(model, &["all", "input-bn-eval"], &runs, false, PLAIN);
    }
    for model in paper_models().into_iter().filter(|m| m.0 != "alexnet_tiny") {
        check_steps_of(
            model,
            &["input"],
            &[(OptimizerKind::Adamw, true)],
            true,
            &[(DType::F32, None)],
        );
    }
}

/// The tiny EfficientNet in training mode, with stochastic depth and
/// dropout drawing on the device: the output, the input's and every
/// parameter's gradient on CUDA as on the CPU (the same per-sample draws;
/// strict f32 convolutions, so only summation order differs): within 1e-4
/// of each tensor's largest magnitude, at least 1e-3 of the largest
/// gradient (a BatchNorm shift before a convolution and training-mode
/// BatchNorm has a gradient that is zero but for rounding).
#[test]
fn efficientnet_tiny_values_match_on_every_device() {
    use leangrad::nn::Module;
    let _strict = leangrad::cuda::with_conv_tf32(false);
    let build = tiny_models::efficientnet();
    let run = |device: Device| {
        let model = build(DType::F32, device).unwrap();
        let x = leangrad::Tensor::randn(&[2, 3, 32, 32], DType::F32, Device::Cpu, 0).unwrap();
        let x = x
            .to_device(device)
            .unwrap()
            .set_requires_grad(true)
            .unwrap();
        let y = model.step_logits(&x).unwrap();
        y.mul(&y).unwrap().sum_all().unwrap().backward().unwrap();
        let mut out = vec![
            ("output".to_string(), y),
            ("input".to_string(), x.grad().unwrap()),
        ];
        for (n, p) in model.named_parameters() {
            out.push((n, p.grad().unwrap()));
        }
        out
    };
    let cpu = run(Device::Cpu);
    let largest = |t: &leangrad::Tensor| {
        let v = t.to_f64_vec().unwrap();
        v.iter().fold(0f64, |m, x| m.max(x.abs()))
    };
    let largest_grad = cpu[1..].iter().fold(0f64, |m, (_, g)| m.max(largest(g)));
    for dev in cuda_common::devices("efficientnet_tiny values") {
        if dev == Device::Cpu {
            continue;
        }
        for ((n, want), (_, got)) in cpu.iter().zip(run(dev)) {
            assert_eq!(got.device(), dev, "{n}");
            let (w, g) = (want.to_f64_vec().unwrap(), got.to_f64_vec().unwrap());
            let big = match n.as_str() {
                "output" => largest(want),
                _ => largest(want).max(1e-3 * largest_grad),
            };
            let err = w
                .iter()
                .zip(&g)
                .fold(0f64, |m, (a, b)| m.max((a - b).abs()));
            assert!(
                err <= 1e-4 * big.max(1e-6),
                "{n} on {dev}: {err:e} of {big:e}"
            );
        }
    }
}
