//! The PyTorch comparison harness of the model tests (fixtures written by
//! `python-compare/export.py`; see its docstring for the cases).

use leangrad::autograd::{with_save_policy, SavePolicy};
use leangrad::io::{load_safetensors, load_state_dict, LoadOptions};
use leangrad::memory::{Category, Ledger};
use leangrad::nn::Module;
use leangrad::{DType, Device, Tensor};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

pub const CPU: Device = Device::Cpu;

/// A model whose parameters can be frozen by name.
pub trait TestModel: Module {
    /// `set_requires_grad(want)` of the model.
    fn freeze(&mut self, want: &dyn Fn(&str) -> bool);
}

pub fn fixture(name: &str) -> BTreeMap<String, Tensor> {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("run under cargo");
    let path = PathBuf::from(dir).join("tests/fixtures/models").join(name);
    load_safetensors(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn layer_of(name: &str) -> &str {
    name.rsplit_once('.').map_or(name, |(p, _)| p)
}

/// Whether parameter `name` trains in `case` (as in export.py); `bn` tells
/// BatchNorm layers (by layer name) apart.
pub fn trainable(
    case: &str,
    names: &[String],
    bn: impl Fn(&str) -> bool + 'static,
) -> impl Fn(&str) -> bool {
    let mut layers: Vec<String> = Vec::new();
    for n in names {
        let l = layer_of(n).to_string();
        if !layers.contains(&l) {
            layers.push(l);
        }
    }
    let last: BTreeSet<String> = layers[layers.len() - layers.len().div_ceil(4)..]
        .iter()
        .cloned()
        .collect();
    let case = case.to_string();
    move |n: &str| match case.as_str() {
        "all" => true,
        "norm" => bn(layer_of(n)),
        "surgical-last" => last.contains(layer_of(n)),
        _ => false,
    }
}

pub struct Run {
    pub output: Tensor,
    pub grads: BTreeMap<String, Tensor>,
    pub saved_bytes: usize,
    /// Layers (scope before the `/op` suffix) the ledger reports saved
    /// bytes for, after the forward pass.
    pub layers: BTreeSet<String>,
}

/// Builds the model with `make`, loads `<model_name>.safetensors` strictly,
/// freezes and sets the mode as `case` says, and runs forward and backward
/// of `sum(output * probe)` under `policy`.
pub fn run<M: TestModel>(
    make: &dyn Fn(DType) -> M,
    bn: fn(&str) -> bool,
    model_name: &str,
    case: &str,
    policy: SavePolicy,
    dtype: DType,
) -> Run {
    let ledger = Ledger::new();
    let _l = ledger.enter();
    let mut model = make(dtype);
    let sd = fixture(&format!("{model_name}.safetensors"));
    let report = load_state_dict(&model, &sd, LoadOptions::default()).unwrap();
    assert!(report.missing.is_empty() && report.unexpected.is_empty());
    let names: Vec<String> = model
        .named_parameters()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    model.freeze(&trainable(case, &names, bn));
    model.set_training(case != "input-bn-eval");
    let io = fixture(&format!("{model_name}_{case}.safetensors"));
    let x = io["input"]
        .to_dtype(dtype)
        .unwrap()
        .set_requires_grad(case.starts_with("input"))
        .unwrap();
    let _p = with_save_policy(policy);
    let output = model.forward(&x).unwrap();
    let saved_bytes = ledger.live_in(CPU, Category::Saved);
    let layers = ledger
        .saved_by_layer(CPU)
        .into_iter()
        .map(|(l, _)| l.split('/').next().unwrap_or_default().to_string())
        .collect();
    let probe = io["probe"].to_dtype(dtype).unwrap();
    output
        .mul(&probe)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    let mut grads = BTreeMap::new();
    for (n, t) in model.named_parameters() {
        let expected = io.contains_key(&format!("grad.{n}"));
        assert_eq!(t.requires_grad(), expected, "{case}: {n}");
        if let Some(g) = t.grad() {
            grads.insert(format!("grad.{n}"), g);
        }
    }
    if let Some(g) = x.grad() {
        grads.insert("grad.input".to_string(), g);
    }
    Run {
        output,
        grads,
        saved_bytes,
        layers,
    }
}

/// max |a - b| ≤ tol · max(max |b|, floor); returns max |a - b| / scale.
fn assert_close_scaled(what: &str, a: &Tensor, b: &Tensor, tol: f64, floor: f64) -> f64 {
    assert_eq!(a.shape(), b.shape(), "{what}: shape");
    let (a, b) = (a.to_f64_vec().unwrap(), b.to_f64_vec().unwrap());
    let scale = b.iter().fold(floor.max(1e-12), |m, v| m.max(v.abs()));
    let err = a
        .iter()
        .zip(&b)
        .fold(0f64, |m, (x, y)| m.max((x - y).abs()));
    assert!(
        err <= tol * scale,
        "{what}: max error {err:e}, scale {scale:e}"
    );
    err / scale
}

/// Runs every case in `dtype` and compares the output and each gradient
/// with the f64 reference within `tol` (relative to each tensor's largest
/// magnitude; for gradients at least 1e-3 of the case's largest gradient,
/// since some are zero up to cancellation, e.g. a per-channel shift before
/// a 1×1 convolution and training-mode BatchNorm). Gradient names must
/// match one-to-one.
pub fn check_model<M: TestModel>(
    make: &dyn Fn(DType) -> M,
    bn: fn(&str) -> bool,
    model_name: &str,
    cases: &[&str],
    dtype: DType,
    tol: f64,
) {
    let mut worst = 0f64;
    for &case in cases {
        let io = fixture(&format!("{model_name}_{case}.safetensors"));
        let r = run(make, bn, model_name, case, SavePolicy::Lean, dtype);
        let what = format!("{model_name} {case} output");
        worst = worst.max(assert_close_scaled(
            &what,
            &r.output,
            &io["output"],
            tol,
            0.0,
        ));
        let want: BTreeSet<&String> = io.keys().filter(|k| k.starts_with("grad.")).collect();
        let got: BTreeSet<&String> = r.grads.keys().collect();
        assert_eq!(got, want, "{model_name} {case}: gradient names");
        assert!(!want.is_empty());
        let largest = want
            .iter()
            .flat_map(|n| io[n.as_str()].to_f64_vec().unwrap())
            .fold(0f64, |m, v| m.max(v.abs()));
        for (n, g) in &r.grads {
            let what = format!("{model_name} {case} {n}");
            let b = &io[n.as_str()];
            worst = worst.max(assert_close_scaled(&what, g, b, tol, 1e-3 * largest));
        }
    }
    eprintln!("{model_name} {dtype:?}: worst scaled error {worst:e}");
}

/// Lean against SaveAll in f32 for every case: never more saved bytes
/// (strictly fewer for `input`), identical outputs, bit-identical gradients.
pub fn check_policies<M: TestModel>(
    make: &dyn Fn(DType) -> M,
    bn: fn(&str) -> bool,
    model: &str,
    cases: &[&str],
) {
    for &case in cases {
        let lean = run(make, bn, model, case, SavePolicy::Lean, DType::F32);
        let all = run(make, bn, model, case, SavePolicy::SaveAll, DType::F32);
        let (l, a) = (lean.saved_bytes, all.saved_bytes);
        assert!(l <= a, "{model} {case}: {l} vs {a}");
        if case == "input" {
            assert!(l < a, "{model} {case}: {l} vs {a}");
        }
        let out = |r: &Run| r.output.to_f64_vec().unwrap();
        assert_eq!(out(&lean), out(&all));
        assert_eq!(lean.grads.len(), all.grads.len());
        let bits = |t: &Tensor| -> Vec<u32> {
            t.to_vec::<f32>()
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect()
        };
        for (n, g) in &lean.grads {
            assert_eq!(bits(g), bits(&all.grads[n]), "{model} {case} {n}");
        }
    }
}
