//! The meta device: tensors without data whose kernels compute shapes only.
//! One whole training step on meta moves the ledger exactly as the same
//! step on the CPU: peak and live bytes by category, the parameter-gradient
//! peak and saved bytes by layer, byte for byte, for every tiny model of
//! the model tests (CNNs and transformers) and every one of the 14 cases
//! that trains something, both save policies, SGD with momentum and AdamW,
//! usual and fused steps.

mod tiny_models;

use leangrad::autograd::SavePolicy;
use leangrad::memory::{Category, Ledger};
use leangrad::memory_plan::{run_step, OptimizerKind, StepInput, StepModel, StepSpec};
use leangrad::models::{Case, ResNet, ResNetConfig};
use leangrad::{DType, Device, Error, Tensor};
use tiny_models::{models, paper_models, Build};

fn spec(
    input: StepInput,
    case: Case,
    optimizer: OptimizerKind,
    fused: bool,
    device: Device,
) -> StepSpec {
    StepSpec {
        batch: 2,
        input,
        classes: 5,
        dtype: DType::F32,
        optimizer,
        fused,
        checkpoint: false,
        optimizer_state: leangrad::optim::StateFormat::Full,
        autocast: None,
        case,
        device,
    }
}

fn assert_meta_equals_cpu(model: &str, build: &Build, input: StepInput, case: Case) {
    for policy in [SavePolicy::Lean, SavePolicy::SaveAll] {
        for (opt, fused) in [
            (OptimizerKind::Sgd, false),
            (OptimizerKind::Sgd, true),
            (OptimizerKind::Adamw, false),
            (OptimizerKind::Adamw, true),
        ] {
            let what = format!("{model} {case} {policy:?} {opt:?} fused={fused}");
            let at = |device| spec(input, case, opt, fused, device);
            let cpu = run_step(build.as_ref(), &at(Device::Cpu), policy)
                .unwrap_or_else(|e| panic!("{what} cpu: {e}"));
            let meta = run_step(build.as_ref(), &at(Device::Meta), policy)
                .unwrap_or_else(|e| panic!("{what} meta: {e}"));
            let (mut c, m) = (cpu.report, meta.report);
            assert_eq!(c.device, "cpu");
            assert_eq!(m.device, "meta");
            c.device = m.device.clone();
            assert!(c.peak_total > 0, "{what}");
            // Taken at the end of the step: the model and its state are alive.
            assert!(c.live.parameters > 0 && c.live_total > 0, "{what}");
            assert!(!c.saved_by_layer.is_empty(), "{what}");
            assert_eq!(c.peak, m.peak, "{what}: peak by category");
            assert_eq!(c.live, m.live, "{what}: live by category");
            assert_eq!(c.at_peak, m.at_peak, "{what}: the moment of the peak");
            assert_eq!(c.at_peak.bytes.total(), c.peak_total, "{what}: rows add up");
            assert_eq!(c.gradients_peak, m.gradients_peak, "{what}: gradient peak");
            assert_eq!(c.saved_by_layer, m.saved_by_layer, "{what}: saved by layer");
            assert_eq!(c, m, "{what}: whole report");
        }
    }
}

/// Every case of model `index` that trains something; a case that trains
/// nothing (no parameter selected, no input gradient) must be the clear
/// error instead. Returns how many cases ran.
fn check_model(index: usize) -> usize {
    let (name, build, input) = models().swap_remove(index);
    let mut ran = 0;
    for case in Case::all() {
        let kinds = {
            let ledger = Ledger::new();
            let _l = ledger.enter();
            build(DType::F32, Device::Meta).unwrap().parameter_kinds()
        };
        if case.trainable(&kinds).is_empty() && !case.input_requires_grad() {
            let s = spec(input, case, OptimizerKind::Sgd, false, Device::Meta);
            let err = run_step(build.as_ref(), &s, SavePolicy::Lean).err();
            assert!(
                matches!(&err, Some(Error::InvalidArgument { msg, .. }) if msg.contains("trains nothing")),
                "{name} {case}: {err:?}"
            );
            continue;
        }
        assert_meta_equals_cpu(name, &build, input, case);
        ran += 1;
    }
    ran
}

#[test]
fn meta_ledger_equals_cpu_resnet18_tiny() {
    assert_eq!(check_model(0), 14);
}

#[test]
fn meta_ledger_equals_cpu_resnet50_tiny() {
    assert_eq!(check_model(1), 14);
}

#[test]
fn meta_ledger_equals_cpu_vgg16_tiny() {
    // No normalisation layers: `norm` and `norm-bn-eval` train nothing.
    assert_eq!(check_model(2), 12);
}

#[test]
fn meta_ledger_equals_cpu_vgg16_bn_tiny() {
    assert_eq!(check_model(3), 14);
}

/// The tiny ResNet-101, ResNeXt-101 (grouped convolutions), AlexNet
/// (dropout, 64×64 images), MobileNetV3, RoBERTa, the Mistral-style
/// decoder and EfficientNetV2 (stochastic depth): a few cases each,
/// every one of AlexNet's twelve that train something.
#[test]
fn meta_ledger_equals_cpu_paper_models_tiny() {
    for (name, build, input) in paper_models() {
        let cases: Vec<Case> = if name == "alexnet_tiny" {
            Case::all()
                .into_iter()
                .filter(|c| !c.to_string().starts_with("norm"))
                .collect()
        } else {
            ["all", "input", "norm-bn-eval", "surgical-last"]
                .map(|c| c.parse().unwrap())
                .to_vec()
        };
        for case in cases {
            assert_meta_equals_cpu(name, &build, input, case);
        }
    }
}

#[test]
fn meta_ledger_equals_cpu_mobilenet_v2_tiny() {
    assert_eq!(check_model(4), 14);
}

#[test]
fn meta_ledger_equals_cpu_vit_tiny() {
    assert_eq!(check_model(5), 14);
}

#[test]
fn meta_ledger_equals_cpu_bert_tiny() {
    // No convolutions: `conv` and `conv-bn-eval` train nothing.
    assert_eq!(check_model(6), 12);
}

#[test]
fn meta_ledger_equals_cpu_gpt2_tiny() {
    // GPT-2's Conv1D layers are Linear layers: `conv` trains nothing.
    assert_eq!(check_model(7), 12);
}

/// Under autocast (bf16 and f16) every tiny model's step moves the meta
/// ledger as the CPU's, byte for byte, under both policies, usual and fused
/// AdamW.
#[test]
fn autocast_on_meta_equals_cpu() {
    let case = leangrad::memory_plan::parse_case("all").unwrap();
    let mut ran = 0;
    for (name, build, input) in models() {
        ran += 1;
        for low in [DType::BF16, DType::F16] {
            for policy in [SavePolicy::Lean, SavePolicy::SaveAll] {
                for fused in [false, true] {
                    let what = format!("{name} {low:?} {policy:?} fused={fused}");
                    let at = |device| StepSpec {
                        autocast: Some(low),
                        ..spec(input, case, OptimizerKind::Adamw, fused, device)
                    };
                    let cpu = run_step(build.as_ref(), &at(Device::Cpu), policy)
                        .unwrap_or_else(|e| panic!("{what} cpu: {e}"));
                    let meta = run_step(build.as_ref(), &at(Device::Meta), policy)
                        .unwrap_or_else(|e| panic!("{what} meta: {e}"));
                    let (mut c, m) = (cpu.report, meta.report);
                    c.device = m.device.clone();
                    assert_eq!(c, m, "{what}: whole report");
                }
            }
        }
    }
    assert!(ran >= 6, "{ran} tiny models");
}

/// Compact optimizer state (bf16 and 8-bit Adam moments) moves the meta
/// ledger exactly as the CPU's: bf16 holds half the bytes, 8-bit no more
/// than full state (the tiny models' parameters are mostly under the
/// 4096 elements where 8-bit starts).
#[test]
fn compact_optimizer_state_on_meta_equals_cpu() {
    use leangrad::optim::StateFormat;
    let mut ran = 0;
    for (name, build, input) in models()
        .into_iter()
        .filter(|(n, ..)| *n == "resnet18_tiny" || *n == "gpt2_tiny")
    {
        ran += 1;
        let case = leangrad::memory_plan::parse_case("all").unwrap();
        for fused in [false, true] {
            let mut state_peaks = Vec::new();
            for format in [
                StateFormat::Full,
                StateFormat::Bf16,
                StateFormat::Blockwise8,
            ] {
                let what = format!("{name} {format} fused={fused}");
                let at = |device| StepSpec {
                    optimizer_state: format,
                    ..spec(input, case, OptimizerKind::Adamw, fused, device)
                };
                let cpu = run_step(build.as_ref(), &at(Device::Cpu), SavePolicy::Lean)
                    .unwrap_or_else(|e| panic!("{what} cpu: {e}"));
                let meta = run_step(build.as_ref(), &at(Device::Meta), SavePolicy::Lean)
                    .unwrap_or_else(|e| panic!("{what} meta: {e}"));
                let (mut c, m) = (cpu.report, meta.report);
                c.device = m.device.clone();
                assert_eq!(c, m, "{what}: whole report");
                state_peaks.push(c.peak.optimizer_state);
            }
            assert!(
                state_peaks[1] * 2 == state_peaks[0] && state_peaks[2] <= state_peaks[0],
                "{name}: state bytes f32, bf16, 8bit: {state_peaks:?}"
            );
        }
    }
    assert_eq!(ran, 2);
}

/// A full-size ResNet-18 (at 32², its conv weights well over the 8-bit
/// threshold) with 8-bit AdamW state: meta equals the CPU byte for byte
/// under both policies, and the state is about a quarter of f32's.
#[test]
fn eight_bit_state_resnet18_on_meta_equals_cpu() {
    use leangrad::optim::StateFormat;
    let at = |device, format| StepSpec {
        batch: 2,
        optimizer_state: format,
        ..spec(
            StepInput::Image {
                channels: 3,
                size: 32,
            },
            leangrad::memory_plan::parse_case("all").unwrap(),
            OptimizerKind::Adamw,
            true,
            device,
        )
    };
    let cpu =
        leangrad::memory_plan::plan("resnet18", &at(Device::Cpu, StateFormat::Blockwise8)).unwrap();
    let meta = leangrad::memory_plan::plan("resnet18", &at(Device::Meta, StateFormat::Blockwise8))
        .unwrap();
    for (mut c, m) in [(cpu.lean, meta.lean.clone()), (cpu.pytorch, meta.pytorch)] {
        c.report.device = m.report.device.clone();
        assert_eq!(c.report, m.report);
    }
    let full =
        leangrad::memory_plan::plan("resnet18", &at(Device::Meta, StateFormat::Full)).unwrap();
    let (q, f) = (
        meta.lean.report.peak.optimizer_state,
        full.lean.report.peak.optimizer_state,
    );
    assert!(
        q * 100 < f * 27 && q * 100 > f * 25,
        "8-bit {q} vs f32 {f} bytes"
    );
}

/// A full-size ResNet-18 training step (batch 64, 224×224, f32) on meta:
/// it runs (timing belongs in a bench) and its numbers are plausible.
#[test]
fn full_size_resnet18_step_on_meta() {
    let build: Build = Box::new(|d, dev| {
        Ok(Box::new(ResNet::new(ResNetConfig::resnet18(1000), d, dev, 0)?) as Box<dyn StepModel>)
    });
    let input = StepInput::Image {
        channels: 3,
        size: 224,
    };
    let all: Case = "all".parse().unwrap();
    let mut s = spec(input, all, OptimizerKind::Sgd, false, Device::Meta);
    (s.batch, s.classes) = (64, 1000);
    let lean = run_step(build.as_ref(), &s, SavePolicy::Lean)
        .unwrap()
        .report;
    let all = run_step(build.as_ref(), &s, SavePolicy::SaveAll)
        .unwrap()
        .report;
    let params = 11_689_512 * 4;
    // BatchNorm buffers count as parameters too: running mean and variance
    // of 4800 channels (f32) and 20 `num_batches_tracked` (i64).
    assert_eq!(lean.peak.parameters, params + 2 * 4800 * 4 + 20 * 8);
    assert_eq!(lean.peak.optimizer_state, params); // momentum
    assert!(lean.gradients_peak >= params);
    assert_eq!(lean.peak.parameter_gradients, params);
    // Activations of ResNet-18 at batch 64: a few GiB under save-all.
    assert!(
        all.peak.saved > (1 << 30) && all.peak.saved < (8 << 30),
        "{}",
        all.peak.saved
    );
    assert!(lean.peak.saved < all.peak.saved);
    assert!(lean.peak_total < all.peak_total);
    assert!(lean
        .saved_by_layer
        .iter()
        .any(|l| l.layer.starts_with("layer1.0.conv1")));
    // Nothing is left on the CPU by a meta step.
    assert_eq!(Ledger::global().live(Device::Meta), 0);
}

#[test]
fn meta_tensors_have_shapes_and_no_data() {
    let ledger = Ledger::new();
    let _l = ledger.enter();
    let x = Tensor::randn(&[4, 8], DType::F32, Device::Meta, 0).unwrap();
    assert_eq!(x.shape(), &[4, 8]);
    assert_eq!(x.device(), Device::Meta);
    assert_eq!(ledger.live(Device::Meta), 128);
    assert_eq!(ledger.live(Device::Cpu), 0);
    for t in [
        Tensor::zeros(&[3], DType::F16, Device::Meta).unwrap(),
        Tensor::ones(&[3], DType::F16, Device::Meta).unwrap(),
        Tensor::full(&[3], 2.0, DType::F16, Device::Meta).unwrap(),
        Tensor::rand(&[3], DType::F16, Device::Meta, 1).unwrap(),
        Tensor::arange(3, DType::F16, Device::Meta).unwrap(),
    ] {
        assert_eq!(
            (t.shape(), t.dtype(), t.device()),
            (&[3][..], DType::F16, Device::Meta)
        );
    }
    assert!(matches!(x.to_vec::<f32>(), Err(Error::NoData { .. })));
    assert!(matches!(x.to_f64_vec(), Err(Error::NoData { .. })));
    assert!(matches!(
        x.sum_all().unwrap().to_scalar(),
        Err(Error::NoData { .. })
    ));
    assert!(matches!(
        Tensor::from_vec(vec![1.0f32], &[1], Device::Meta),
        Err(Error::NoData { .. })
    ));
    assert!(matches!(
        x.to_device(Device::Cpu),
        Err(Error::NoData { .. })
    ));
    // Ops give the right shapes and dtypes.
    let w = Tensor::zeros(&[8, 3], DType::F32, Device::Meta).unwrap();
    let y = x.matmul(&w).unwrap().relu().unwrap();
    assert_eq!((y.shape(), y.dtype()), (&[4, 3][..], DType::F32));
    let h = y.to_dtype(DType::BF16).unwrap();
    assert_eq!(h.dtype(), DType::BF16);
    // Mixed meta and CPU operands are a device mismatch.
    let c = Tensor::zeros(&[4, 8], DType::F32, Device::Cpu).unwrap();
    assert!(matches!(x.add(&c), Err(Error::DeviceMismatch { .. })));
    assert!(matches!(
        x.matmul(&c.transpose(0, 1).unwrap()),
        Err(Error::DeviceMismatch { .. })
    ));
    // A CPU tensor copied to meta keeps its shape; its bytes are counted under meta.
    let m = c.to_device(Device::Meta).unwrap();
    assert_eq!(m.shape(), c.shape());
    assert_eq!(
        ledger.live_in(Device::Meta, Category::Activation),
        ledger.live(Device::Meta)
    );
}

#[test]
fn in_place_on_meta_bumps_the_version_only() {
    // Its own ledger: the full-size test checks the global one is empty.
    let ledger = Ledger::new();
    let _l = ledger.enter();
    let x = Tensor::zeros(&[5], DType::F32, Device::Meta).unwrap();
    let v = x.version();
    let y = Tensor::ones(&[5], DType::F32, Device::Meta).unwrap();
    leangrad::primitives::copy_into(&x, &y).unwrap();
    assert_eq!(x.version(), v + 1);
}

#[test]
fn data_dependent_ops_on_meta_treat_indices_as_valid() {
    // Its own ledger: the full-size test checks the global one is empty.
    let ledger = Ledger::new();
    let _l = ledger.enter();
    let w = Tensor::zeros(&[10, 4], DType::F32, Device::Meta)
        .unwrap()
        .set_requires_grad(true)
        .unwrap();
    let idx = Tensor::zeros(&[2, 3], DType::I64, Device::Meta).unwrap();
    let e = leangrad::nn::embedding(&w, &idx, None).unwrap();
    assert_eq!(e.shape(), &[2, 3, 4]);
    let logits = e.reshape(&[6, 4]).unwrap();
    let t = Tensor::zeros(&[6], DType::I64, Device::Meta).unwrap();
    let loss = logits
        .cross_entropy(&t, leangrad::ops::CrossEntropyOptions::default())
        .unwrap();
    assert_eq!(loss.shape(), &[] as &[usize]);
    loss.backward().unwrap();
    let g = w.grad().unwrap();
    assert_eq!((g.shape(), g.device()), (&[10, 4][..], Device::Meta));
    let picked = w
        .detach()
        .index_select(0, &Tensor::zeros(&[7], DType::U32, Device::Meta).unwrap())
        .unwrap();
    assert_eq!(picked.shape(), &[7, 4]);
}
