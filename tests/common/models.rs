//! The PyTorch comparison harness of the model tests (fixtures written by
//! `python-compare/export.py`): every selective-differentiation case of
//! `leangrad::models::Case` that means something for the model (the input
//! cases, and every case that trains at least one parameter).

use leangrad::autograd::{with_save_policy, SavePolicy};
use leangrad::io::{load_safetensors, load_state_dict, LoadOptions};
use leangrad::memory::{Category, Ledger};
use leangrad::models::{Case, Freeze};
use leangrad::nn::Module;
use leangrad::{DType, Device, Tensor};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

pub const CPU: Device = Device::Cpu;

pub fn fixture(name: &str) -> BTreeMap<String, Tensor> {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("run under cargo");
    let path = PathBuf::from(dir).join("tests/fixtures/models").join(name);
    load_safetensors(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The cases exported for `model`: the input cases and those that train at
/// least one of its parameters (export.py skips the others).
pub fn meaningful_cases(model: &dyn Freeze) -> Vec<Case> {
    let kinds = model.parameter_kinds();
    Case::all()
        .into_iter()
        .filter(|c| c.input_requires_grad() || !c.trainable(&kinds).is_empty())
        .collect()
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
/// applies `case` (requires-grad per parameter, training mode), and runs
/// forward and backward of `sum(output * probe)` under `policy` on the
/// input and probe of `<model_name>_io.safetensors`.
pub fn run<M: Freeze>(
    make: &dyn Fn(DType) -> M,
    model_name: &str,
    case: Case,
    policy: SavePolicy,
    dtype: DType,
) -> Run {
    let ledger = Ledger::new();
    let _l = ledger.enter();
    let mut model = make(dtype);
    let sd = fixture(&format!("{model_name}.safetensors"));
    let report = load_state_dict(&model, &sd, LoadOptions::default()).unwrap();
    assert!(report.missing.is_empty() && report.unexpected.is_empty());
    case.apply(&mut model).unwrap();
    let io = fixture(&format!("{model_name}_io.safetensors"));
    let expected = fixture(&format!("{model_name}_{case}.safetensors"));
    let x = io["input"]
        .to_dtype(dtype)
        .unwrap()
        .set_requires_grad(case.input_requires_grad())
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
        let wanted = expected.contains_key(&format!("grad.{n}"));
        assert_eq!(t.requires_grad(), wanted, "{case}: {n}");
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

/// Runs every meaningful case in `dtype` and compares the output and each
/// gradient with the f64 reference within `tol`, relative to each tensor's
/// largest magnitude, for gradients at least 1e-3 of the case's largest
/// gradient (some are tiny by cancellation, e.g. the BatchNorm shifts
/// before a ReLU, a convolution and another training-mode BatchNorm).
/// A structural zero (the reference is zero up to f64 rounding, ≤ 1e-12 of
/// the case's largest gradient: a conv bias or a BatchNorm shift right
/// before a convolution and training-mode BatchNorm, which removes any
/// per-channel shift) has no scale of its own and is measured against the
/// case's largest gradient. Gradient names must match one-to-one. Returns
/// the worst scaled error.
pub fn check_model<M: Freeze>(
    make: &dyn Fn(DType) -> M,
    model_name: &str,
    dtype: DType,
    tol: f64,
) -> f64 {
    let cases = meaningful_cases(&make(DType::F32));
    check_model_cases(make, model_name, dtype, tol, &cases)
}

/// [`check_model`] for the cases `cases` only (the fixtures of the deep
/// models hold a few cases; see python-compare/export.py's `--cases`).
pub fn check_model_cases<M: Freeze>(
    make: &dyn Fn(DType) -> M,
    model_name: &str,
    dtype: DType,
    tol: f64,
    cases: &[Case],
) -> f64 {
    let mut worst = (0f64, String::new());
    for &case in cases {
        let (io, r) = run_fixture_case(make, model_name, case, dtype);
        let mut note = |e: f64, what: String| {
            if e >= worst.0 {
                worst = (e, what);
            }
        };
        let what = format!("{model_name} {case} output");
        note(
            assert_close_scaled(&what, &r.output, &io["output"], tol, 0.0),
            what,
        );
        let largest = r
            .grads
            .keys()
            .flat_map(|n| io[n.as_str()].to_f64_vec().unwrap())
            .fold(0f64, |m, v| m.max(v.abs()));
        for (n, g) in &r.grads {
            let what = format!("{model_name} {case} {n}");
            let b = &io[n.as_str()];
            let size = b
                .to_f64_vec()
                .unwrap()
                .iter()
                .fold(0f64, |m, v| m.max(v.abs()));
            let floor = if size <= 1e-12 * largest {
                largest
            } else {
                1e-3 * largest
            };
            note(assert_close_scaled(&what, g, b, tol, floor), what);
        }
    }
    eprintln!(
        "{model_name} {dtype:?}: {} cases, worst scaled error {:e} ({})",
        cases.len(),
        worst.0,
        worst.1
    );
    worst.0
}

/// `case` of `model_name` in `dtype` under the lean policy, with its
/// fixture; the gradients it computed are exactly the ones the fixture
/// names (at least one).
fn run_fixture_case<M: Freeze>(
    make: &dyn Fn(DType) -> M,
    model_name: &str,
    case: Case,
    dtype: DType,
) -> (BTreeMap<String, Tensor>, Run) {
    let io = fixture(&format!("{model_name}_{case}.safetensors"));
    let r = run(make, model_name, case, SavePolicy::Lean, dtype);
    let want: BTreeSet<&String> = io.keys().filter(|k| k.starts_with("grad.")).collect();
    let got: BTreeSet<&String> = r.grads.keys().collect();
    assert_eq!(got, want, "{model_name} {case}: gradient names");
    assert!(!want.is_empty());
    (io, r)
}

/// The outputs of `cases` in `dtype` against the fixtures within `tol`
/// (relative to the output's largest magnitude), with every gradient the
/// fixture names present and finite; for cases whose gradients are too
/// ill-conditioned in `dtype` to compare (see tests/models_resnet.rs).
/// Returns the worst scaled error.
pub fn check_outputs_cases<M: Freeze>(
    make: &dyn Fn(DType) -> M,
    model_name: &str,
    dtype: DType,
    tol: f64,
    cases: &[Case],
) -> f64 {
    let mut worst = 0f64;
    for &case in cases {
        let (io, r) = run_fixture_case(make, model_name, case, dtype);
        let what = format!("{model_name} {case} output");
        worst = worst.max(assert_close_scaled(
            &what,
            &r.output,
            &io["output"],
            tol,
            0.0,
        ));
        for (n, g) in &r.grads {
            let finite = g.to_f64_vec().unwrap().iter().all(|v| v.is_finite());
            assert!(finite, "{model_name} {case} {n}: not finite");
        }
    }
    worst
}

/// Lean against SaveAll in f32 for every meaningful case: never more saved
/// bytes (strictly fewer for `input`), identical outputs, bit-identical
/// gradients.
pub fn check_policies<M: Freeze>(make: &dyn Fn(DType) -> M, model: &str) {
    check_policies_cases(make, model, &meaningful_cases(&make(DType::F32)));
}

/// [`check_policies`] for the cases `cases` only.
pub fn check_policies_cases<M: Freeze>(make: &dyn Fn(DType) -> M, model: &str, cases: &[Case]) {
    for &case in cases {
        let lean = run(make, model, case, SavePolicy::Lean, DType::F32);
        let all = run(make, model, case, SavePolicy::SaveAll, DType::F32);
        let (l, a) = (lean.saved_bytes, all.saved_bytes);
        assert!(l <= a, "{model} {case}: {l} vs {a}");
        if case.to_string() == "input" {
            assert!(l < a, "{model} {case}: {l} vs {a}");
        }
        let out = |r: &Run| r.output.to_f64_vec().unwrap();
        assert_eq!(out(&lean), out(&all), "{model} {case}: output");
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

/// torchvision's full-size models as `python-compare/torchvision_models.py`
/// wrote them.
pub fn torchvision(model: &str) -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/models/torchvision_models.json"
    );
    let text = std::fs::read_to_string(path).expect("the torchvision models fixture");
    let all: Value = serde_json::from_str(&text).expect("valid JSON");
    all["models"][model].clone()
}

/// The state dict `(name, shape)` in order and the parameter count of
/// `model`, on the meta device (nothing drawn or allocated).
pub fn ours(model: &dyn Module) -> (Vec<(String, Vec<usize>)>, usize) {
    let sd = leangrad::io::state_dict(model, "");
    let entries = sd.into_iter().map(|(n, t)| (n, t.shape().to_vec()));
    let count = model.parameters().iter().map(|t| t.numel()).sum();
    (entries.collect(), count)
}

/// What torchvision's fixture says: its state dict in order and its
/// parameter count.
pub fn theirs(v: &Value) -> (Vec<(String, Vec<usize>)>, usize) {
    let entries = v["state_dict"].as_array().expect("state_dict");
    let entries = entries.iter().map(|e| {
        let shape = e[1].as_array().expect("shape");
        let shape = shape.iter().map(|d| d.as_u64().unwrap() as usize);
        (e[0].as_str().expect("name").to_string(), shape.collect())
    });
    (
        entries.collect(),
        v["parameters"].as_u64().unwrap() as usize,
    )
}

/// `model`'s state dict has the names and shapes of torchvision's twin
/// (`want`, a model of [`torchvision`]), its parameters in torchvision's
/// order (the order the surgical cases count layers in), and as many
/// parameters; the first few differences are named.
pub fn same_state_dict(model: &dyn Module, want: &Value, name: &str) {
    let (sd, count) = ours(model);
    let (want_sd, want_count) = theirs(want);
    let a: BTreeMap<&String, &Vec<usize>> = sd.iter().map(|(n, s)| (n, s)).collect();
    let b: BTreeMap<&String, &Vec<usize>> = want_sd.iter().map(|(n, s)| (n, s)).collect();
    let differ: Vec<String> = a
        .keys()
        .chain(b.keys())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .filter(|n| a.get(*n) != b.get(*n))
        .map(|n| format!("{n}: ours {:?}, torchvision's {:?}", a.get(n), b.get(n)))
        .collect();
    assert!(
        differ.is_empty(),
        "{name}: {} state-dict entries differ, first: {:?}",
        differ.len(),
        &differ[..differ.len().min(5)]
    );
    let params: Vec<String> = model
        .named_parameters()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    let theirs_params: Vec<&String> = want_sd
        .iter()
        .map(|(n, _)| n)
        .filter(|n| params.contains(n))
        .collect();
    assert!(
        params.iter().eq(theirs_params.iter().copied()),
        "{name}: parameter order"
    );
    assert_eq!(count, want_count, "{name}: parameter count");
}

/// Each of the 14 cases trains on `model` the (tensors, values) that
/// `want["cases"]` counts on torchvision's twin.
pub fn check_cases_against(model: &mut dyn leangrad::models::Freeze, want: &Value, name: &str) {
    for case in Case::all() {
        case.apply(model).unwrap();
        let on: Vec<(String, usize)> = model
            .named_parameters()
            .into_iter()
            .filter(|(_, t)| t.requires_grad())
            .map(|(n, t)| (n, t.numel()))
            .collect();
        let base = case.to_string().replace("-bn-eval", "");
        let counts = &want["cases"][&base];
        let got = (on.len(), on.iter().map(|(_, n)| n).sum::<usize>());
        let expected = (
            counts[0].as_u64().unwrap() as usize,
            counts[1].as_u64().unwrap() as usize,
        );
        assert_eq!(got, expected, "{name} {case}");
    }
}

/// The state-dict names of `model` are exactly the fixture
/// `<name>.safetensors`'s, and include each of `samples`.
pub fn check_fixture_names(model: &dyn Module, name: &str, samples: &[&str]) {
    let ours: BTreeSet<String> = leangrad::io::state_dict(model, "")
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    let theirs: BTreeSet<String> = fixture(&format!("{name}.safetensors"))
        .into_keys()
        .collect();
    assert_eq!(ours, theirs);
    for n in samples {
        assert!(ours.contains(*n), "{n}");
    }
}

/// `model.features(x, names)` gives maps of `shapes`, in order, and an
/// unknown layer `unknown` is `Error::UnknownLayer`.
pub fn check_feature_shapes(
    model: &dyn leangrad::models::FeatureMaps,
    x: &Tensor,
    maps: &[(&str, &[usize])],
    unknown: &str,
) {
    let names: Vec<&str> = maps.iter().map(|(n, _)| *n).collect();
    let got = model.features(x, &names).unwrap();
    let shapes: Vec<&[usize]> = got.iter().map(|(_, t)| t.shape()).collect();
    let want: Vec<&[usize]> = maps.iter().map(|(_, s)| *s).collect();
    assert_eq!(shapes, want);
    assert!(matches!(
        model.features(x, &[unknown]),
        Err(leangrad::Error::UnknownLayer { .. })
    ));
}

/// A new head of 7 classes replaces `head` (the model had `classes`);
/// every other parameter keeps its value, and `x` gives `[n, 7]`.
pub fn check_replace_head<M: leangrad::models::ReplaceHead + Module>(
    model: &mut M,
    head: &str,
    classes: usize,
    x: &Tensor,
) {
    assert_eq!(model.head_name(), head);
    assert_eq!(model.num_classes(), classes);
    let before = model.named_parameters();
    model.replace_head(7, 3).unwrap();
    assert_eq!(model.num_classes(), 7);
    let after = model.named_parameters();
    assert_eq!(before.len(), after.len());
    for ((n, a), (m, b)) in before.iter().zip(&after) {
        assert_eq!(n, m);
        if !n.starts_with(head) {
            assert_eq!(a.to_f64_vec().unwrap(), b.to_f64_vec().unwrap(), "{n}");
        }
    }
    assert_eq!(model.forward(x).unwrap().shape(), [x.shape()[0], 7]);
}
