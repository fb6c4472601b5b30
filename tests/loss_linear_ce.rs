//! `Tensor::linear_cross_entropy` (a Linear layer and cross-entropy over
//! row chunks) against PyTorch's `F.cross_entropy(h @ W.T + b, t)` and its
//! gradients (fixture from `python-compare/linear_ce_fixture.py`, in f64),
//! against the unfused path (matmul, then `cross_entropy`), and its memory:
//! no logits saved, at most one chunk of them alive. GPT-2's `lm_loss` is
//! checked the same way against Hugging Face's GPT2LMHeadModel.
//!
//! Measured worst relative errors (max |a − b| / max |b| per tensor, over
//! the loss and every gradient): the op against PyTorch 4.5e-16 (f64) and
//! 2.8e-7 (f32), fused against unfused in f32 3.0e-7 (chunks change the
//! order of the weight gradient's sums); GPT-2 against Hugging Face 1.2e-15
//! (f64) and 4.2e-7 (f32), fused against unfused 0 (its 50-token
//! vocabulary is one chunk: the same products).

use leangrad::io::{load_state_dict, LoadOptions};
use leangrad::memory::{Category, Ledger};
use leangrad::models::{Gpt2, Gpt2Config, TextInput};
use leangrad::nn::Module;
use leangrad::ops::{CrossEntropyOptions, Reduction};
use leangrad::{DType, Device, Tensor};
use std::collections::BTreeMap;
use std::path::PathBuf;

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

fn opts(reduction: Reduction, label_smoothing: f64) -> CrossEntropyOptions {
    CrossEntropyOptions {
        reduction,
        label_smoothing,
        ..CrossEntropyOptions::default()
    }
}

/// Loss and the gradients of h, W, b of `Σ loss · probe`, fused in chunks
/// of `rows` (or unfused with `None`).
fn run(
    f: &BTreeMap<String, Tensor>,
    key: &str,
    o: CrossEntropyOptions,
    dtype: DType,
    rows: Option<usize>,
) -> [Tensor; 4] {
    let leaf = |k: &str| {
        f[k].to_dtype(dtype)
            .unwrap()
            .set_requires_grad(true)
            .unwrap()
    };
    let (h, w, b) = (leaf("h"), leaf("w"), leaf("b"));
    let t = &f["t"];
    let loss = match rows {
        Some(rows) => h
            .linear_cross_entropy_in_chunks(&w, Some(&b), t, o, rows)
            .unwrap(),
        None => h
            .matmul(&w.t().unwrap())
            .unwrap()
            .add(&b)
            .unwrap()
            .cross_entropy(t, o)
            .unwrap(),
    };
    let probe = f[&format!("{key}.probe")].to_dtype(dtype).unwrap();
    loss.mul(&probe)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    [
        loss.detach(),
        h.grad().unwrap(),
        w.grad().unwrap(),
        b.grad().unwrap(),
    ]
}

#[test]
fn matches_pytorch_and_the_unfused_path_for_every_reduction_and_chunking() {
    let f = fixture("linear_cross_entropy.safetensors");
    let mut worst = [0f64; 3];
    for (reduction, name) in [
        (Reduction::Mean, "mean"),
        (Reduction::Sum, "sum"),
        (Reduction::None, "none"),
    ] {
        for smoothing in [0.0, 0.1] {
            let key = format!("{name}_{smoothing:?}");
            let want: Vec<&Tensor> = ["loss", "grad_h", "grad_w", "grad_b"]
                .iter()
                .map(|k| &f[&format!("{key}.{k}")])
                .collect();
            let o = opts(reduction, smoothing);
            let unfused = run(&f, &key, o, DType::F32, None);
            // 40 rows: chunks of 1, 7 (the last has 5), all at once, and more than all.
            for rows in [1, 7, 40, 1000] {
                let f64s = run(&f, &key, o, DType::F64, Some(rows));
                let f32s = run(&f, &key, o, DType::F32, Some(rows));
                for i in 0..4 {
                    let (e64, e32, eu) = (
                        rel(&f64s[i], want[i]),
                        rel(&f32s[i], want[i]),
                        rel(&f32s[i], &unfused[i]),
                    );
                    assert!(e64 < 1e-12, "{key} rows {rows} #{i}: f64 {e64:e}");
                    assert!(e32 < 1e-5, "{key} rows {rows} #{i}: f32 {e32:e}");
                    assert!(eu < 1e-5, "{key} rows {rows} #{i}: fused vs unfused {eu:e}");
                    worst = [worst[0].max(e64), worst[1].max(e32), worst[2].max(eu)];
                }
            }
        }
    }
    eprintln!(
        "worst relative error: f64 {:e}, f32 {:e}, fused vs unfused {:e}",
        worst[0], worst[1], worst[2]
    );
}

#[test]
fn gpt2_lm_loss_matches_hugging_face_and_the_unfused_head() {
    let f = fixture("linear_cross_entropy.safetensors");
    let weights = fixture("models/gpt2_tiny.safetensors");
    let (ids, targets) = (&f["gpt2.ids"], &f["gpt2.targets"]);
    for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 1e-5)] {
        let fused = {
            let model = Gpt2::new(Gpt2Config::tiny(), dtype, Device::Cpu, 1).unwrap();
            load_state_dict(&model, &weights, LoadOptions { strict: true }).unwrap();
            let loss = model
                .lm_loss(TextInput::Ids(ids), targets, CrossEntropyOptions::default())
                .unwrap();
            loss.backward().unwrap();
            let grads: BTreeMap<String, Tensor> = model
                .named_parameters()
                .into_iter()
                .map(|(n, p)| (n, p.grad().unwrap()))
                .collect();
            (loss.detach(), grads)
        };
        let mut worst = rel(&fused.0, &f["gpt2.loss"]);
        for (name, g) in &fused.1 {
            let e = rel(g, &f[&format!("gpt2.grad.{name}")]);
            assert!(e < tol, "{dtype:?} {name}: {e:e}");
            worst = worst.max(e);
        }
        assert!(worst < tol, "{dtype:?} loss");
        eprintln!("gpt2 {dtype:?}: worst relative error against PyTorch {worst:e}");
        // The unfused head: logits [2, 12, 50] → [24, 50], then cross_entropy.
        let model = Gpt2::new(Gpt2Config::tiny(), dtype, Device::Cpu, 1).unwrap();
        load_state_dict(&model, &weights, LoadOptions { strict: true }).unwrap();
        let logits = model.forward_ids(ids).unwrap().reshape(&[24, 50]).unwrap();
        let loss = logits
            .cross_entropy(targets, CrossEntropyOptions::default())
            .unwrap();
        loss.backward().unwrap();
        let mut worst = rel(&fused.0, &loss);
        for (name, p) in model.named_parameters() {
            let e = rel(&fused.1[&name], &p.grad().unwrap());
            assert!(e < tol, "{dtype:?} {name} fused vs unfused: {e:e}");
            worst = worst.max(e);
        }
        assert!(worst < tol);
        eprintln!("gpt2 {dtype:?}: worst relative error fused vs unfused {worst:e}");
    }
}

/// One forward and backward of the op on `device` in a fresh ledger:
/// (saved bytes after forward, the ledger's peak by category).
fn step_bytes(device: Device, rows: usize) -> (usize, usize, usize, (usize, usize)) {
    let (n, d, v) = (64, 8, 1000);
    let ledger = Ledger::new();
    let _l = ledger.enter();
    let w = Tensor::randn(&[v, d], DType::F32, device, 0)
        .unwrap()
        .into_parameter()
        .unwrap();
    let h = Tensor::randn(&[n, d], DType::F32, device, 1)
        .unwrap()
        .set_requires_grad(true)
        .unwrap();
    let t = match device {
        Device::Meta => Tensor::zeros(&[n], DType::I64, device).unwrap(),
        _ => Tensor::from_vec(
            (0..n as i64).map(|i| i * 37 % v as i64).collect(),
            &[n],
            device,
        )
        .unwrap(),
    };
    let loss = h
        .linear_cross_entropy_in_chunks(&w, None, &t, CrossEntropyOptions::default(), rows)
        .unwrap();
    let saved = ledger.live_in(device, Category::Saved);
    loss.backward().unwrap();
    assert_eq!(ledger.live_in(device, Category::Saved), 0);
    (
        saved,
        ledger.peak_in(device, Category::Workspace),
        ledger.peak(device),
        (
            ledger.peak_in(device, Category::ParameterGradient),
            ledger.peak_in(device, Category::InputGradient),
        ),
    )
}

#[test]
fn saves_only_the_hidden_states_and_holds_one_chunk_of_logits() {
    let (n, d, v, rows) = (64usize, 8usize, 1000usize, 8usize);
    let (saved, workspace, peak, gradient) = step_bytes(Device::Cpu, rows);
    // h (f32) and the caller's targets (i64); no logits, no probabilities.
    assert_eq!(saved, n * d * 4 + n * 8);
    // A chunk's logits, then its probabilities and their gradient: two
    // [rows, v] f32 tensors at once at most, never the [n, v] logits.
    assert!(workspace <= 2 * rows * v * 4, "workspace peak {workspace}");
    assert!(workspace >= rows * v * 4, "workspace peak {workspace}");
    let whole_logits = n * v * 4;
    let inputs = v * d * 4 + n * d * 4 + n * 8;
    assert!(
        peak - inputs < whole_logits,
        "peak {peak} holds the logits ({whole_logits})"
    );
    // W's gradient is a parameter's, h's an input's: each exactly its size.
    assert_eq!(gradient, (v * d * 4, n * d * 4));
    // The meta device predicts the same bytes.
    assert_eq!(
        step_bytes(Device::Meta, rows),
        (saved, workspace, peak, gradient)
    );
}

#[test]
fn bad_arguments_are_errors() {
    let h = Tensor::zeros(&[4, 3], DType::F32, Device::Cpu).unwrap();
    let w = Tensor::zeros(&[5, 3], DType::F32, Device::Cpu).unwrap();
    let t = Tensor::zeros(&[4], DType::I64, Device::Cpu).unwrap();
    let o = CrossEntropyOptions::default();
    assert!(h.linear_cross_entropy(&w, None, &t, o).is_ok());
    assert!(h
        .linear_cross_entropy(&w.t().unwrap(), None, &t, o)
        .is_err());
    assert!(h.linear_cross_entropy(&w, Some(&t), &t, o).is_err());
    assert!(h
        .linear_cross_entropy(&w, None, &t.to_dtype(DType::F32).unwrap(), o)
        .is_err());
    assert!(h
        .linear_cross_entropy(&w, None, &t.narrow(0, 0, 3).unwrap(), o)
        .is_err());
    assert!(h
        .linear_cross_entropy_in_chunks(&w, None, &t, o, 0)
        .is_err());
    let bad = CrossEntropyOptions {
        label_smoothing: 1.5,
        ..o
    };
    assert!(h.linear_cross_entropy(&w, None, &t, bad).is_err());
}

/// GPT-2 small, batch 8 × 128 tokens, AdamW fused, every parameter
/// training, on the meta device with the ledger's timeline: under the lean
/// policy no allocation of the step is as large as the `[1024, 50257]`
/// logits (the largest is the token table itself, at setup), while
/// PyTorch's path allocates such tensors (logits, probabilities, their
/// gradient). The lean step saves nothing for the loss but h and the
/// targets; its peak is where the parameters, AdamW's two moments and
/// `wte`'s gradient meet, at the end of backward.
#[test]
fn gpt2_small_step_never_holds_tokens_by_vocabulary() {
    use leangrad::memory::{Category, EventKind};
    use leangrad::memory_plan::{find_model, parse_case, plan_recording, OptimizerKind, StepSpec};
    let spec = StepSpec {
        batch: 8,
        input: find_model("gpt2")
            .unwrap()
            .step_input(None, Some(128))
            .unwrap(),
        classes: 50257,
        dtype: DType::F32,
        optimizer: OptimizerKind::Adamw,
        fused: true,
        checkpoint: false,
        optimizer_state: leangrad::optim::StateFormat::Full,
        autocast: None,
        case: parse_case("all").unwrap(),
        device: Device::Meta,
    };
    let plan = plan_recording("gpt2", &spec, true).unwrap();
    let logits_bytes = 8 * 128 * 50257 * 4;
    let large = |events: &[leangrad::memory::TimelineEvent]| {
        events
            .iter()
            .filter(|e| e.kind == EventKind::Alloc && e.bytes >= logits_bytes)
            .count()
    };
    let lean = plan.lean.timeline.as_ref().unwrap();
    let pytorch = plan.pytorch.timeline.as_ref().unwrap();
    assert_eq!(large(lean), 0);
    assert!(large(pytorch) >= 3, "{}", large(pytorch));
    let wte = 50257 * 768 * 4;
    let biggest = lean.iter().map(|e| e.bytes).max().unwrap();
    assert_eq!(biggest, wte);
    // At the peak: parameters + AdamW's moments + wte's gradient, nothing else
    // above a few KiB (the input ids).
    let at = &plan.lean.report.at_peak.bytes;
    assert_eq!(
        at.get(Category::OptimizerState),
        2 * at.get(Category::Parameter)
    );
    assert_eq!(at.get(Category::ParameterGradient), wte);
    assert_eq!(at.get(Category::Saved), 0);
    assert!(plan.lean.report.peak_total - at.get(Category::Parameter) * 3 - wte < 64 * 1024);
}
