//! The PyTorch comparison harness of the transformer tests (fixtures
//! written by `python-compare/export_transformers.py`; see its docstring
//! for the layout and cases). Included with `#[path]` next to `common`.

use crate::common::models::{fixture, CPU};
use leangrad::autograd::{with_save_policy, SavePolicy};
use leangrad::io::{load_state_dict, LoadOptions};
use leangrad::memory::{Category, Ledger};
use leangrad::models::Case;
use leangrad::nn::{LayerKind, Module};
use leangrad::{DType, Tensor};
use std::collections::{BTreeMap, BTreeSet};

/// A Hugging Face-named model under test.
pub trait HfModel: Module {
    /// `set_requires_grad(want)` of the model.
    fn freeze(&mut self, want: &dyn Fn(&str) -> bool);
    /// The named outputs (`output`, and `pooled` for models with a pooler)
    /// for the case's inputs: `x` is the float input (images, or input
    /// embeddings) when the fixture has one, `io` the whole fixture.
    fn outputs(&self, x: Option<&Tensor>, io: &BTreeMap<String, Tensor>) -> Vec<(String, Tensor)>;
}

/// The parameters that train in `case` (the library's [`Case`], the same
/// rule as export_transformers.py).
pub fn trainable(case: &str, kinds: &[(String, LayerKind)]) -> BTreeSet<String> {
    let case: Case = case.parse().expect("a case name");
    case.trainable(kinds)
}

/// What one run measured.
pub struct Run {
    pub outputs: BTreeMap<String, Tensor>,
    pub grads: BTreeMap<String, Tensor>,
    pub saved_bytes: usize,
    /// Layer scopes the ledger reports saved bytes for after forward.
    pub layers: BTreeSet<String>,
}

/// Builds the model, loads `<name>.safetensors` strictly, freezes as the
/// case says, runs forward and backward of
/// `Σ sum(output_k * probe_k)` under `policy`.
pub fn run<M: HfModel>(
    make: &dyn Fn(DType) -> M,
    name: &str,
    case: &str,
    policy: SavePolicy,
    dtype: DType,
) -> Run {
    let ledger = Ledger::new();
    let _l = ledger.enter();
    let mut model = make(dtype);
    let sd = fixture(&format!("{name}.safetensors"));
    load_state_dict(&model, &sd, LoadOptions { strict: true }).unwrap();
    let train = trainable(case, &model.parameter_kinds());
    model.freeze(&|n| train.contains(n));
    let io = fixture(&format!("{name}_{case}.safetensors"));
    let x = io.get("input").map(|t| {
        t.to_dtype(dtype)
            .unwrap()
            .set_requires_grad(case == "input")
            .unwrap()
    });
    let _p = with_save_policy(policy);
    let outs = model.outputs(x.as_ref(), &io);
    let saved_bytes = ledger.live_in(CPU, Category::Saved);
    let layers = ledger
        .saved_by_layer(CPU)
        .into_iter()
        .map(|(l, _)| l.split('/').next().unwrap_or_default().to_string())
        .collect();
    let mut loss: Option<Tensor> = None;
    for (k, y) in &outs {
        let key = if k == "output" {
            "probe".to_string()
        } else {
            format!("probe.{k}")
        };
        let term = y
            .mul(&io[&key].to_dtype(dtype).unwrap())
            .unwrap()
            .sum_all()
            .unwrap();
        loss = Some(match loss {
            Some(l) => l.add(&term).unwrap(),
            None => term,
        });
    }
    loss.expect("an output").backward().unwrap();
    let mut grads = BTreeMap::new();
    for (n, t) in model.named_parameters() {
        assert_eq!(t.requires_grad(), train.contains(&n), "{case}: {n}");
        if let Some(g) = t.grad() {
            grads.insert(format!("grad.{n}"), g);
        }
    }
    if let Some(g) = x.as_ref().and_then(|x| x.grad()) {
        grads.insert("grad.input".to_string(), g);
    }
    Run {
        outputs: outs.into_iter().collect(),
        grads,
        saved_bytes,
        layers,
    }
}

/// max |a − b| / max(max |b|, floor), after checking the shapes.
fn scaled_error(what: &str, a: &Tensor, b: &Tensor, floor: f64) -> f64 {
    assert_eq!(a.shape(), b.shape(), "{what}: shape");
    let (a, b) = (a.to_f64_vec().unwrap(), b.to_f64_vec().unwrap());
    let scale = b.iter().fold(floor.max(1e-12), |m, v| m.max(v.abs()));
    let err = a
        .iter()
        .zip(&b)
        .fold(0f64, |m, (x, y)| m.max((x - y).abs()));
    err / scale
}

/// Runs every case in `dtype`; the outputs and every gradient must match
/// the f64 reference within `tol`, relative to each tensor's largest
/// magnitude (for gradients at least 1e-3 of the case's largest gradient).
/// Gradient names must match one-to-one. Returns the worst scaled error.
pub fn check_model<M: HfModel>(
    make: &dyn Fn(DType) -> M,
    name: &str,
    cases: &[&str],
    dtype: DType,
    tol: f64,
) -> f64 {
    let mut worst = 0f64;
    for &case in cases {
        let io = fixture(&format!("{name}_{case}.safetensors"));
        let r = run(make, name, case, SavePolicy::Lean, dtype);
        for (k, y) in &r.outputs {
            let e = scaled_error(&format!("{name} {case} {k}"), y, &io[k.as_str()], 0.0);
            assert!(e <= tol, "{name} {case} {k}: scaled error {e:e}");
            worst = worst.max(e);
        }
        let want: BTreeSet<&String> = io.keys().filter(|k| k.starts_with("grad.")).collect();
        let got: BTreeSet<&String> = r.grads.keys().collect();
        assert_eq!(got, want, "{name} {case}: gradient names");
        assert!(!want.is_empty(), "{name} {case}: no gradients");
        let largest = want
            .iter()
            .flat_map(|n| io[n.as_str()].to_f64_vec().unwrap())
            .fold(0f64, |m, v| m.max(v.abs()));
        for (n, g) in &r.grads {
            let e = scaled_error(n, g, &io[n.as_str()], 1e-3 * largest);
            assert!(e <= tol, "{name} {case} {n}: scaled error {e:e}");
            worst = worst.max(e);
        }
    }
    eprintln!("{name} {dtype:?}: worst scaled error {worst:e}");
    worst
}

/// Lean against SaveAll in f32 for every case: never more saved bytes
/// (strictly fewer for `input`), identical outputs, bit-identical
/// gradients. Returns `(case, lean, save-all)` saved bytes.
pub fn check_policies<M: HfModel>(
    make: &dyn Fn(DType) -> M,
    name: &str,
    cases: &[&str],
) -> Vec<(String, usize, usize)> {
    let mut bytes = Vec::new();
    for &case in cases {
        let lean = run(make, name, case, SavePolicy::Lean, DType::F32);
        let all = run(make, name, case, SavePolicy::SaveAll, DType::F32);
        let (l, a) = (lean.saved_bytes, all.saved_bytes);
        assert!(l <= a, "{name} {case}: {l} vs {a}");
        if case == "input" {
            assert!(l < a, "{name} {case}: {l} vs {a}");
        }
        let bits = |t: &Tensor| -> Vec<u32> {
            t.to_vec::<f32>()
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect()
        };
        for (k, y) in &lean.outputs {
            assert_eq!(bits(y), bits(&all.outputs[k]), "{name} {case} {k}");
        }
        assert_eq!(lean.grads.len(), all.grads.len());
        for (n, g) in &lean.grads {
            assert_eq!(bits(g), bits(&all.grads[n]), "{name} {case} {n}");
        }
        bytes.push((case.to_string(), l, a));
    }
    bytes
}
