//! Autocast (`leangrad::autocast`): which dtype each op runs in, gradients
//! against PyTorch's on every device (the CPU, and CUDA where there is one;
//! fixture from `python-compare/autocast_fixture.py`:
//! the tiny GPT-2 under `torch.autocast("cpu", bfloat16)`, and a conv net
//! with leangrad's casts written out), checkpointed = plain bit for bit
//! under autocast, backward inside the scope = outside, and clear errors.
//!
//! Measured worst relative errors (max |a − b| / max |b| per tensor):
//! GPT-2 against PyTorch's autocast: loss 2.4e-5, gradients 8.5e-3 (the
//! head's gradient products run in f32 here, in bf16 in PyTorch); the conv
//! net: loss 8.3e-5, gradients 9.7e-3, while PyTorch's own bf16 and f32
//! gradients differ by 1.6e-1 (so the comparison tells autocast from none).

use leangrad::autograd::with_save_policy;
use leangrad::io::{load_state_dict, LoadOptions};
use leangrad::models::{Gpt2, Gpt2Config, TextInput};
use leangrad::nn::{batch_norm, conv2d, Conv2dOptions, Linear, Module};
use leangrad::ops::{autocast_disabled, autocast_dtype, CrossEntropyOptions};
use leangrad::{autocast, DType, Device, Error, Tensor};
use std::collections::BTreeMap;
use std::path::PathBuf;

mod cuda_common;

const CPU: Device = Device::Cpu;

fn fixture(name: &str) -> BTreeMap<String, Tensor> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    leangrad::io::load_safetensors(path).unwrap()
}

/// max |a − b| / max |b|.
fn rel(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.shape(), b.shape());
    let (a, b) = (a.to_f64_vec().unwrap(), b.to_f64_vec().unwrap());
    let scale = b.iter().fold(0f64, |m, x| m.max(x.abs())).max(1e-30);
    a.iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f64, f64::max)
        / scale
}

fn bits(t: &Tensor) -> Vec<u64> {
    t.to_f64_vec()
        .unwrap()
        .into_iter()
        .map(f64::to_bits)
        .collect()
}

/// The largest |value| of a tensor.
trait MaxAll {
    fn max_all_value(&self) -> f64;
}

impl MaxAll for Tensor {
    fn max_all_value(&self) -> f64 {
        self.to_f64_vec().unwrap().into_iter().fold(0f64, f64::max)
    }
}

fn leaf(t: &Tensor) -> Tensor {
    t.clone().set_requires_grad(true).unwrap()
}

#[test]
fn each_op_runs_in_the_dtype_of_its_list() {
    let x = Tensor::randn(&[2, 3, 8], DType::F32, CPU, 1).unwrap();
    let w = leaf(&Tensor::randn(&[8, 8], DType::F32, CPU, 2).unwrap());
    let _a = autocast(DType::BF16).unwrap();
    assert_eq!(autocast_dtype(), Some(DType::BF16));
    let y = x.matmul(&w).unwrap();
    assert_eq!(y.dtype(), DType::BF16);
    // Promotion: the f32 residual stream plus a bf16 branch is f32.
    assert_eq!(x.add(&y).unwrap().dtype(), DType::F32);
    assert_eq!(y.mul(&x).unwrap().dtype(), DType::F32);
    // ReLU and GELU keep the dtype they are given; softmax and layer norm are f32.
    assert_eq!(y.relu().unwrap().dtype(), DType::BF16);
    assert_eq!(y.gelu(true).unwrap().dtype(), DType::BF16);
    assert_eq!(y.softmax(-1).unwrap().dtype(), DType::F32);
    let ln = leangrad::nn::layer_norm(&y, &[8], None, None, 1e-5).unwrap();
    assert_eq!(ln.dtype(), DType::F32);
    // f64 is left alone, as PyTorch does.
    let d = Tensor::randn(&[4, 4], DType::F64, CPU, 3).unwrap();
    assert_eq!(d.matmul(&d).unwrap().dtype(), DType::F64);
    // The parameter's gradient is f32 (its cast's backward casts it back).
    y.sum_all().unwrap().backward().unwrap();
    assert_eq!(w.grad().unwrap().dtype(), DType::F32);
    {
        let _off = autocast_disabled();
        assert_eq!(x.matmul(&w).unwrap().dtype(), DType::F32);
    }
    assert_eq!(autocast_dtype(), Some(DType::BF16));
}

#[test]
fn the_tiny_gpt2_matches_pytorch_autocast() {
    for device in cuda_common::devices("the_tiny_gpt2_matches_pytorch_autocast") {
        gpt2_matches_pytorch(device);
    }
}

fn gpt2_matches_pytorch(device: Device) {
    let f = fixture("autocast.safetensors");
    let weights: BTreeMap<String, Tensor> = fixture("models/gpt2_tiny.safetensors")
        .into_iter()
        .map(|(k, v)| (k, v.to_device(device).unwrap()))
        .collect();
    let model = Gpt2::new(Gpt2Config::tiny(), DType::F32, device, 1).unwrap();
    load_state_dict(&model, &weights, LoadOptions { strict: true }).unwrap();
    let on = |t: &Tensor| t.to_device(device).unwrap();
    let loss = {
        let _a = autocast(DType::BF16).unwrap();
        model
            .lm_loss(
                TextInput::Ids(&on(&f["gpt2.ids"])),
                &on(&f["gpt2.targets"]),
                CrossEntropyOptions::default(),
            )
            .unwrap()
    };
    assert_eq!(loss.dtype(), DType::F32);
    loss.backward().unwrap();
    let e = rel(&loss, &f["gpt2.loss"]);
    assert!(e < 2e-4, "{device} loss {e:e}");
    let mut worst = 0f64;
    for (name, p) in model.named_parameters() {
        let g = p.grad().unwrap();
        assert_eq!(g.dtype(), DType::F32, "{name}");
        let e = rel(&g, &f[&format!("gpt2.grad.{name}")]);
        assert!(e < 2e-2, "{device} {name}: {e:e}");
        worst = worst.max(e);
    }
    eprintln!("gpt2 under autocast on {device}: loss {e:e}, worst gradient {worst:e}");
}

const CONV_KEYS: [&str; 9] = [
    "x",
    "conv1.weight",
    "conv1.bias",
    "bn.weight",
    "bn.bias",
    "conv2.weight",
    "conv2.bias",
    "fc.weight",
    "fc.bias",
];

/// The fixture's conv net: its loss and the gradient of every input.
fn conv_net(
    f: &BTreeMap<String, Tensor>,
    low: Option<DType>,
    device: Device,
) -> (Tensor, Vec<Tensor>) {
    let t: BTreeMap<&str, Tensor> = CONV_KEYS
        .iter()
        .map(|k| {
            (
                *k,
                leaf(&f[&format!("conv.{k}")].to_device(device).unwrap()),
            )
        })
        .collect();
    let labels = f["conv.labels"].to_device(device).unwrap();
    let mut fc = Linear::builder(128, 5).build(&device).unwrap();
    fc.weight = t["fc.weight"].clone();
    fc.bias = Some(t["fc.bias"].clone());
    let loss = {
        let _a = low.map(|d| autocast(d).unwrap());
        let pad = Conv2dOptions {
            padding: [1, 1],
            ..Default::default()
        };
        let h = conv2d(&t["x"], &t["conv1.weight"], Some(&t["conv1.bias"]), &pad).unwrap();
        assert_eq!(h.dtype(), low.unwrap_or(DType::F32));
        let (w, b) = (Some(&t["bn.weight"]), Some(&t["bn.bias"]));
        let h = batch_norm(&h, None, None, w, b, true, 0.1, 1e-5).unwrap();
        assert_eq!(h.dtype(), low.unwrap_or(DType::F32));
        let strided = Conv2dOptions {
            stride: [2, 2],
            ..pad
        };
        let h = conv2d(
            &h.relu().unwrap(),
            &t["conv2.weight"],
            Some(&t["conv2.bias"]),
            &strided,
        )
        .unwrap();
        let logits = fc
            .forward(&h.relu().unwrap().flatten(1, -1).unwrap())
            .unwrap();
        assert_eq!(logits.dtype(), low.unwrap_or(DType::F32));
        logits
            .cross_entropy(&labels, CrossEntropyOptions::default())
            .unwrap()
    };
    loss.backward().unwrap();
    let grads = CONV_KEYS.iter().map(|k| t[k].grad().unwrap()).collect();
    (loss, grads)
}

#[test]
fn a_conv_net_matches_pytorch_with_the_same_casts() {
    for device in cuda_common::devices("a_conv_net_matches_pytorch_with_the_same_casts") {
        conv_net_matches_pytorch(device);
    }
}

fn conv_net_matches_pytorch(device: Device) {
    let f = fixture("autocast.safetensors");
    for (tag, low, tol) in [("bf16", Some(DType::BF16), 1.5e-2), ("f32", None, 1e-5)] {
        let (loss, grads) = conv_net(&f, low, device);
        let e = rel(&loss, &f[&format!("conv.{tag}.loss")]);
        assert!(e < tol / 10.0, "{tag} loss {e:e}");
        let mut worst = 0f64;
        for (k, g) in CONV_KEYS.iter().zip(&grads) {
            assert_eq!(g.dtype(), DType::F32, "{k}");
            if *k == "conv1.bias" {
                // Batch norm subtracts the mean: this gradient is 0 up to
                // rounding noise (4e-4 in PyTorch's bf16 step), which is all
                // either side can match.
                let noise = g.abs().unwrap().max_all_value();
                assert!(noise < 2e-3, "{tag} {k}: {noise:e}");
                continue;
            }
            let e = rel(g, &f[&format!("conv.{tag}.grad.{k}")]);
            assert!(e < tol, "{tag} {k}: {e:e}");
            worst = worst.max(e);
        }
        eprintln!("conv net {tag} on {device}: loss {e:e}, worst gradient {worst:e}");
    }
    // The bf16 step is not the f32 one: the comparison above tells them apart.
    let apart = CONV_KEYS
        .iter()
        .filter(|k| **k != "conv1.bias")
        .map(|k| {
            rel(
                &f[&format!("conv.bf16.grad.{k}")],
                &f[&format!("conv.f32.grad.{k}")],
            )
        })
        .fold(0f64, f64::max);
    eprintln!("conv net: PyTorch's bf16 and f32 gradients differ by {apart:e}");
    assert!(apart > 1.5e-2);
}

/// Loss and every parameter's gradient of a tiny GPT-2 step under bf16
/// autocast, its blocks checkpointed when `on`, backward run inside the
/// scope when `backward_inside`.
fn gpt2_step(on: bool, backward_inside: bool) -> Vec<Vec<u64>> {
    let mut m = Gpt2::new(Gpt2Config::tiny(), DType::F32, CPU, 5).unwrap();
    m.gradient_checkpointing(on);
    let vocab = Gpt2Config::tiny().vocab_size as i64;
    let ids: Vec<i64> = (0..16).map(|i| (i * 7 + 3) % vocab).collect();
    let ids = Tensor::from_vec(ids, &[2, 8], CPU).unwrap();
    let targets = ids.reshape(&[16]).unwrap();
    let scope = autocast(DType::BF16).unwrap();
    let loss = m
        .lm_loss(
            TextInput::Ids(&ids),
            &targets,
            CrossEntropyOptions::default(),
        )
        .unwrap();
    if !backward_inside {
        drop(scope);
        loss.backward().unwrap();
    } else {
        loss.backward().unwrap();
        drop(scope);
    }
    let mut out = vec![bits(&loss)];
    out.extend(
        m.named_parameters()
            .iter()
            .map(|(_, p)| bits(&p.grad().unwrap())),
    );
    out
}

#[test]
fn checkpointed_blocks_recompute_under_the_forwards_autocast_bit_for_bit() {
    let plain = gpt2_step(false, false);
    assert_eq!(gpt2_step(true, false), plain);
    // Backward inside the scope changes nothing: it runs with autocast off.
    assert_eq!(gpt2_step(false, true), plain);
    assert_eq!(gpt2_step(true, true), plain);
}

#[test]
fn the_pytorch_policy_gives_the_same_values_under_autocast() {
    let lean = gpt2_step(false, false);
    let all = {
        let _p = with_save_policy(leangrad::autograd::SavePolicy::SaveAll);
        gpt2_step(false, false)
    };
    assert_eq!(lean, all);
}

#[test]
fn batch_norm_under_autocast_gives_the_same_bits_under_both_policies() {
    let f = fixture("autocast.safetensors");
    let run = |policy| {
        let _p = with_save_policy(policy);
        let (loss, grads) = conv_net(&f, Some(DType::BF16), CPU);
        let mut out = vec![bits(&loss)];
        out.extend(grads.iter().map(bits));
        out
    };
    use leangrad::autograd::SavePolicy;
    assert_eq!(run(SavePolicy::Lean), run(SavePolicy::SaveAll));
}

/// f16 autocast with a `GradScaler` on the tiny GPT-2, usual and fused
/// AdamW: a scale too large overflows the f16 gradients, those steps are
/// skipped and the scale backs off until the steps run, and then the loss
/// goes down.
#[test]
fn f16_autocast_trains_with_a_grad_scaler_on_both_paths() {
    use leangrad::optim::{Adam, GradScaler, Optimizer};
    for fused in [false, true] {
        let m = Gpt2::new(Gpt2Config::tiny(), DType::F32, CPU, 3).unwrap();
        let vocab = Gpt2Config::tiny().vocab_size as i64;
        let ids =
            Tensor::from_vec((0..16).map(|i| (i * 5 + 1) % vocab).collect(), &[2, 8], CPU).unwrap();
        let targets =
            Tensor::from_vec((0..16).map(|i| (i * 5 + 6) % vocab).collect(), &[16], CPU).unwrap();
        let forward = || {
            let _a = autocast(DType::F16)?;
            m.lm_loss(
                TextInput::Ids(&ids),
                &targets,
                CrossEntropyOptions::default(),
            )
        };
        let mut opt = Optimizer::new(m.parameters(), Adam::adamw(1e-2)).unwrap();
        // 2²⁴ times this step's gradients is past f16's 65504.
        let mut scaler = GradScaler::new().init_scale(16_777_216.0).unwrap();
        let first = forward().unwrap().to_f64_vec().unwrap()[0];
        let (mut ran, mut skipped) = (0, 0);
        for _ in 0..30 {
            let stepped = if fused {
                scaler.backward_step(&mut opt, forward).unwrap()
            } else {
                let loss = forward().unwrap();
                scaler.scale(&loss).unwrap().backward().unwrap();
                let s = scaler.step(&mut opt).unwrap();
                opt.zero_grad();
                s
            };
            scaler.update().unwrap();
            if stepped {
                ran += 1;
            } else {
                assert_eq!(ran, 0, "fused={fused}: a skip after steps ran");
                skipped += 1;
            }
        }
        let what = format!(
            "fused={fused}: {skipped} skipped, scale {}",
            scaler.get_scale()
        );
        assert!(skipped >= 1 && ran >= 20, "{what}");
        assert!(scaler.get_scale() < 16_777_216.0, "{what}");
        let last = forward().unwrap().to_f64_vec().unwrap()[0];
        assert!(
            last.is_finite() && last < 0.5 * first,
            "{what}: {first} → {last}"
        );
        for p in m.parameters() {
            assert!(
                p.to_f64_vec().unwrap().iter().all(|v| v.is_finite()),
                "{what}"
            );
        }
    }
}

#[test]
fn bad_uses_are_clear_errors() {
    for d in [DType::F32, DType::F64, DType::I64] {
        let err = autocast(d).unwrap_err();
        assert!(
            matches!(&err, Error::InvalidArgument { op: "autocast", .. }),
            "{err}"
        );
    }
    // f64 is not cast: an f64 operand with an f32 one stays a mismatch.
    let _a = autocast(DType::F16).unwrap();
    let a = Tensor::randn(&[2, 2], DType::F64, CPU, 1).unwrap();
    let b = Tensor::randn(&[2, 2], DType::F32, CPU, 1).unwrap();
    assert!(matches!(a.matmul(&b), Err(Error::DTypeMismatch { .. })));
}
