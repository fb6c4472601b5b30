//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod models;

use leangrad::autograd::gradcheck::{gradcheck, GradcheckOptions};
use leangrad::{DType, Device, Result, Tensor};

/// A seeded f64 tensor with values in [-1, 1).
pub fn rand64(shape: &[usize], seed: u64) -> Tensor {
    Tensor::rand_range(shape, -1.0, 1.0, DType::F64, Device::Cpu, seed).unwrap()
}

/// A seeded f64 tensor with values in [lo, hi).
pub fn rand64_in(shape: &[usize], lo: f64, hi: f64, seed: u64) -> Tensor {
    Tensor::rand_range(shape, lo, hi, DType::F64, Device::Cpu, seed).unwrap()
}

/// Runs gradcheck with default tolerances and panics with its message on failure.
pub fn check(f: impl Fn(&[Tensor]) -> Result<Tensor>, inputs: &[Tensor]) {
    let report =
        gradcheck(f, inputs, GradcheckOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    assert!(report.checked > 0, "gradcheck compared nothing");
}

/// Asserts two f64 slices agree within `tol` (absolute + relative).
pub fn assert_close(a: &[f64], b: &[f64], tol: f64) {
    assert_eq!(a.len(), b.len(), "lengths differ");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= tol * (1.0 + y.abs()),
            "element {i}: {x} vs {y}"
        );
    }
}

/// Asserts that `$e` fails with `leangrad::Error::$v`.
#[macro_export]
macro_rules! assert_err {
    ($e:expr, $v:ident) => {
        assert!(
            matches!($e, Err(leangrad::Error::$v { .. })),
            "{} did not fail with {}",
            stringify!($e),
            stringify!($v)
        )
    };
}

/// What one run of [`run_policy`] measured.
pub struct PolicyRun {
    /// Live saved-for-backward bytes right after forward.
    pub saved: usize,
    /// Gradients of the inputs that required grad (`None` for the others), as raw bits.
    pub grads: Vec<Option<Vec<u64>>>,
    /// The output, as raw bits.
    pub output: Vec<u64>,
}

/// Runs `f` on copies of `inputs` (those with `requires[i]` become leaves
/// requiring grad) under `policy`, in a fresh ledger; backward seeded with a
/// fixed random tensor.
pub fn run_policy(
    f: &dyn Fn(&[Tensor]) -> Result<Tensor>,
    inputs: &[Tensor],
    requires: &[bool],
    policy: leangrad::autograd::SavePolicy,
) -> PolicyRun {
    use leangrad::memory::{Category, Ledger};
    let ledger = Ledger::new();
    let _l = ledger.enter();
    let _p = leangrad::autograd::with_save_policy(policy);
    let leaves: Vec<Tensor> = inputs
        .iter()
        .zip(requires)
        .map(|(t, &r)| {
            let copy =
                Tensor::from_f64_slice(&t.to_f64_vec().unwrap(), t.shape(), t.dtype(), t.device())
                    .unwrap();
            if r {
                copy.set_requires_grad(true).unwrap()
            } else {
                copy
            }
        })
        .collect();
    let out = f(&leaves).unwrap();
    let saved = ledger.live_in(Device::Cpu, Category::Saved);
    let output = bits(&out);
    if out.requires_grad() {
        let seed =
            Tensor::rand_range(out.shape(), -1.0, 1.0, out.dtype(), Device::Cpu, 77).unwrap();
        leangrad::autograd::backward_with(&out, Some(seed), &mut leangrad::autograd::CollectGrads)
            .unwrap();
    }
    drop(out);
    let grads = leaves.iter().map(|l| l.grad().map(|g| bits(&g))).collect();
    PolicyRun {
        saved,
        grads,
        output,
    }
}

fn bits(t: &Tensor) -> Vec<u64> {
    t.to_f64_vec()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

/// For every combination of requires-grad over `inputs` (float inputs
/// only): the lean policy's outputs and gradients equal the save-everything
/// policy's bit for bit, and it saves no more. Returns, per combination
/// (bit i set = input i requires grad), the (lean, save-all) saved bytes.
pub fn check_policies(
    f: &dyn Fn(&[Tensor]) -> Result<Tensor>,
    inputs: &[Tensor],
) -> Vec<(u32, usize, usize)> {
    use leangrad::autograd::SavePolicy;
    let float: Vec<usize> = (0..inputs.len())
        .filter(|&i| inputs[i].dtype().is_float())
        .collect();
    let mut rows = Vec::new();
    for combo in 0u32..(1 << float.len()) {
        let mut requires = vec![false; inputs.len()];
        for (bit, &i) in float.iter().enumerate() {
            requires[i] = combo & (1 << bit) != 0;
        }
        let lean = run_policy(f, inputs, &requires, SavePolicy::Lean);
        let all = run_policy(f, inputs, &requires, SavePolicy::SaveAll);
        assert_eq!(
            lean.output, all.output,
            "outputs differ for requires {requires:?}"
        );
        assert_eq!(
            lean.grads, all.grads,
            "gradients differ for requires {requires:?}"
        );
        for (i, g) in lean.grads.iter().enumerate() {
            assert_eq!(
                g.is_some(),
                requires[i],
                "input {i}: gradient presence for requires {requires:?}"
            );
        }
        let mask = requires
            .iter()
            .enumerate()
            .fold(0u32, |m, (i, &r)| m | (u32::from(r) << i));
        rows.push((mask, lean.saved, all.saved));
    }
    rows
}
