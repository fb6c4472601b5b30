//! Helpers for tests written once for every device (`tests/device_*.rs`):
//! per-dtype tolerances, tensor comparison against the CPU, and the layer
//! harness that runs a layer on every device from `cuda_common::devices`
//! for every requires-grad combination of its inputs under both save
//! policies, comparing outputs, gradients and saved bytes with the CPU's.
//! Each file that uses it declares `mod cuda_common;` first.
#![allow(dead_code)]

use crate::cuda_common;
use leangrad::autograd::SavePolicy;
use leangrad::memory::{Category, Ledger};
use leangrad::{DType, Device, Result, Tensor};

/// The float dtypes a layer is checked in on every device (f64 is CPU-grade
/// and checked by the CPU suites; CUDA supports it too).
pub const FLOATS: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

/// Relative tolerance per dtype.
pub fn tol(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => 1e-12,
        DType::F32 => 1e-5,
        DType::F16 | DType::BF16 => 1e-2,
        _ => 0.0,
    }
}

/// `got` (any device) equals `want` (CPU) in shape, dtype and values, each
/// element within `tol · max(|want|, 1e-3 · largest |want|)`.
pub fn assert_close(what: &str, want: &Tensor, got: &Tensor) {
    assert_close_tol(what, want, got, tol(want.dtype()));
}

/// [`assert_close`] with an explicit relative tolerance (for layers whose
/// reductions legitimately reorder sums, e.g. norms in half precision).
pub fn assert_close_tol(what: &str, want: &Tensor, got: &Tensor, t: f64) {
    assert_eq!(want.shape(), got.shape(), "{what}: shape");
    assert_eq!(want.dtype(), got.dtype(), "{what}: dtype");
    let (w, g) = (want.to_f64_vec().unwrap(), got.to_f64_vec().unwrap());
    let big = w.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    for (i, (a, b)) in w.iter().zip(&g).enumerate() {
        let ok =
            a == b || (a.is_nan() && b.is_nan()) || (a - b).abs() <= t * a.abs().max(1e-3 * big);
        assert!(ok, "{what}: element {i}: cpu {a} vs {b}");
    }
}

/// A seeded CPU tensor with values in `[lo, hi)`.
pub fn input(shape: &[usize], dtype: DType, seed: u64, lo: f64, hi: f64) -> Tensor {
    Tensor::rand_range(shape, lo, hi, dtype, Device::Cpu, seed).unwrap()
}

/// Runs `op` on the CPU inputs and on copies on every device; compares.
pub fn check(test: &str, inputs: &[&Tensor], op: impl Fn(&[Tensor]) -> Result<Tensor>) {
    let cpu: Vec<Tensor> = inputs.iter().map(|&t| t.clone()).collect();
    let want = op(&cpu).unwrap();
    for dev in cuda_common::devices(test) {
        let moved: Vec<Tensor> = inputs.iter().map(|t| t.to_device(dev).unwrap()).collect();
        let got = op(&moved).unwrap_or_else(|e| panic!("{test} on {dev}: {e}"));
        assert_eq!(got.device(), dev, "{test}: output device");
        assert_close(&format!("{test} on {dev}"), &want, &got);
    }
}

/// A copy of `t` on `dev` in storage of its own, allocated in the ledger
/// entered now: `to_device` onto a tensor's own device shares its storage
/// (counted in whichever ledger made it), which would hide what a node
/// saves of its input on that device and not on another.
pub fn fresh_copy(t: &Tensor, dev: Device) -> Tensor {
    let values = t.to_f64_vec().unwrap();
    Tensor::from_f64_slice(&values, t.shape(), t.dtype(), dev).unwrap()
}

/// What one layer step leaves to compare across devices: the output, the
/// gradients of the inputs that required grad (on the host, in dtype
/// precision) and the bytes the autograd graph saved for backward.
pub struct LayerRun {
    pub out: Tensor,
    pub grads: Vec<Option<Tensor>>,
    pub saved: usize,
}

/// The output gradient of a layer run: seeded by the output's shape.
fn run_gy(shape: &[usize], dtype: DType, dev: Device) -> Tensor {
    Tensor::rand_range(shape, -1.0, 1.0, dtype, Device::Cpu, 99)
        .unwrap()
        .to_device(dev)
        .unwrap()
}

/// Runs `f` on copies of `inputs` on `dev` (input `i` requiring grad when
/// `requires[i]`) in a fresh ledger under `policy`, then backpropagates
/// `sum(out · gy)` (`gy` seeded by the output's shape).
pub fn layer_run(
    dev: Device,
    policy: SavePolicy,
    inputs: &[&Tensor],
    requires: &[bool],
    f: &dyn Fn(&[Tensor]) -> Result<Tensor>,
) -> LayerRun {
    let ledger = Ledger::new();
    let _guard = ledger.enter();
    let _policy = leangrad::autograd::with_save_policy(policy);
    let leaves: Vec<Tensor> = inputs
        .iter()
        .zip(requires)
        .map(|(t, &r)| fresh_copy(t, dev).set_requires_grad(r).unwrap())
        .collect();
    let out = f(&leaves).unwrap_or_else(|e| panic!("forward on {dev}: {e}"));
    let saved = ledger.live_in(dev, Category::Saved);
    let gy = run_gy(out.shape(), out.dtype(), dev);
    out.mul(&gy).unwrap().sum_all().unwrap().backward().unwrap();
    let grads = leaves
        .iter()
        .zip(requires)
        .map(|(l, &r)| {
            r.then(|| {
                l.grad()
                    .expect("a gradient")
                    .to_device(Device::Cpu)
                    .unwrap()
            })
        })
        .collect();
    let out = out.detach().to_device(Device::Cpu).unwrap();
    LayerRun { out, grads, saved }
}

/// `f` on every device, both save policies and every non-empty
/// requires-grad combination of `inputs`, against the CPU: output and
/// gradients within the dtype's tolerance, saved bytes equal.
pub fn check_layer(test: &str, inputs: &[&Tensor], f: impl Fn(&[Tensor]) -> Result<Tensor>) {
    check_layer_under(test, &[SavePolicy::Lean, SavePolicy::SaveAll], inputs, f)
}

/// [`check_layer`] under the given save policies only.
pub fn check_layer_under(
    test: &str,
    policies: &[SavePolicy],
    inputs: &[&Tensor],
    f: impl Fn(&[Tensor]) -> Result<Tensor>,
) {
    let t = inputs.first().map_or(1e-5, |x| tol(x.dtype()));
    check_layer_with(test, policies, inputs, t, f)
}

/// [`check_layer_under`] with an explicit relative tolerance.
pub fn check_layer_with(
    test: &str,
    policies: &[SavePolicy],
    inputs: &[&Tensor],
    t: f64,
    f: impl Fn(&[Tensor]) -> Result<Tensor>,
) {
    check_layers(test, policies, inputs, t, None, &f)
}

/// Per-element bounds on `|result − exact|` for any device: given the
/// inputs' dtype, the inputs as exact f64 CPU tensors and the output
/// gradient `gy` (f64), one f64 tensor for the output and one per input
/// (its gradient's bound), in input order.
pub type ErrorBound<'a> = &'a dyn Fn(DType, &[Tensor], &Tensor) -> Result<Vec<Tensor>>;

/// [`check_layer_with`] where each element may also differ from the CPU's
/// by twice `bound` (both results within it of the exact one): for layers
/// whose devices legitimately sum in different orders (cuBLAS vs the CPU's
/// gemm), where an element that cancels is off by far more than `t` of
/// itself.
pub fn check_layer_bounded(
    test: &str,
    policies: &[SavePolicy],
    inputs: &[&Tensor],
    t: f64,
    bound: ErrorBound,
    f: impl Fn(&[Tensor]) -> Result<Tensor>,
) {
    check_layers(test, policies, inputs, t, Some(bound), &f)
}

/// [`check_layer`] for a layer that is a sum of products of its inputs
/// (convolutions): elements may also differ by the two devices' summation
/// orders, within [`multilinear_bound`].
pub fn check_multilinear(test: &str, inputs: &[&Tensor], f: impl Fn(&[Tensor]) -> Result<Tensor>) {
    let t = inputs.first().map_or(1e-5, |x| tol(x.dtype()));
    let bound = multilinear_bound(&f);
    let policies = [SavePolicy::Lean, SavePolicy::SaveAll];
    check_layers(test, &policies, inputs, t, Some(&bound), &f)
}

/// The unit roundoff `u` of a float dtype (half its epsilon).
pub fn unit_roundoff(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => 2f64.powi(-53),
        DType::F32 => 2f64.powi(-24),
        DType::F16 => 2f64.powi(-11),
        DType::BF16 => 2f64.powi(-8),
        _ => 0.0,
    }
}

/// `γ_n = n·u / (1 − n·u)` elementwise for a tensor of term counts `n`:
/// computed in any order, with or without fused multiply-adds, a sum of
/// `n` products (or of `n − 1` products and one more term) is within
/// `γ_n · Σ|terms|` of the exact sum (Higham, Accuracy and Stability of
/// Numerical Algorithms, §3.1).
pub fn gamma(n: &Tensor, u: f64) -> Result<Tensor> {
    n.mul_scalar(u)?.div(&n.mul_scalar(-u)?.add_scalar(1.0)?)
}

/// The output of `f` and the gradients of `sum(out · gy)` with respect to
/// every input (all requiring grad), on the CPU.
pub fn output_and_grads(
    inputs: &[Tensor],
    gy: &Tensor,
    f: &dyn Fn(&[Tensor]) -> Result<Tensor>,
) -> Result<Vec<Tensor>> {
    let leaves = inputs
        .iter()
        .map(|t| t.detach().set_requires_grad(true))
        .collect::<Result<Vec<_>>>()?;
    let out = f(&leaves)?;
    out.mul(gy)?.sum_all()?.backward()?;
    let mut all = vec![out.detach()];
    for l in &leaves {
        all.push(
            l.grad()
                .ok_or(leangrad::Error::Backward("no gradient".into()))?,
        );
    }
    Ok(all)
}

/// The [`ErrorBound`] of a layer whose output is a sum of products of its
/// inputs' elements, each product taken once (convolutions, matmuls, with
/// bias): every output and gradient element is such a sum, so each device
/// is within `γ_(n+1) · Σ|terms|` of the exact value (`+1`: the rounding of
/// a half-precision result computed in f32). `f` on `|inputs|` and `|gy|`
/// in f64 gives `Σ|terms|` per element, `f` on ones the number of terms `n`.
pub fn multilinear_bound(
    f: &dyn Fn(&[Tensor]) -> Result<Tensor>,
) -> impl Fn(DType, &[Tensor], &Tensor) -> Result<Vec<Tensor>> + '_ {
    move |dtype, x, gy| {
        let abs = x.iter().map(|t| t.abs()).collect::<Result<Vec<_>>>()?;
        let magnitude = output_and_grads(&abs, &gy.abs()?, f)?;
        let ones = x
            .iter()
            .map(|t| Tensor::ones(t.shape(), DType::F64, Device::Cpu))
            .collect::<Result<Vec<_>>>()?;
        let counts = output_and_grads(&ones, &gy.ones_like()?, f)?;
        let u = unit_roundoff(dtype);
        magnitude
            .iter()
            .zip(&counts)
            .map(|(s, n)| gamma(&n.add_scalar(1.0)?, u)?.mul(s))
            .collect()
    }
}

fn check_layers(
    test: &str,
    policies: &[SavePolicy],
    inputs: &[&Tensor],
    t: f64,
    bound: Option<ErrorBound>,
    f: &dyn Fn(&[Tensor]) -> Result<Tensor>,
) {
    let n = inputs.len();
    // The same for every run: the output and each gradient are what they
    // are whichever inputs require grad.
    let mut bounds: Option<Vec<Vec<f64>>> = None;
    for mask in 1..(1u32 << n) {
        let requires: Vec<bool> = (0..n).map(|i| mask & (1 << i) != 0).collect();
        for &policy in policies {
            let want = layer_run(Device::Cpu, policy, inputs, &requires, f);
            if bounds.is_none() {
                bounds = bound.map(|b| exact_bounds(b, inputs, &want.out));
            }
            for dev in cuda_common::devices(test) {
                if dev == Device::Cpu {
                    continue;
                }
                let got = layer_run(dev, policy, inputs, &requires, f);
                let what = format!("{test} on {dev} ({policy:?}, requires grad {requires:?})");
                let within = |i: usize| bounds.as_ref().map(|b| b[i].as_slice());
                assert_close_within(&what, &want.out, &got.out, t, within(0));
                for (i, (w, g)) in want.grads.iter().zip(&got.grads).enumerate() {
                    if let (Some(w), Some(g)) = (w, g) {
                        let what = format!("{what}: grad {i}");
                        assert_close_within(&what, w, g, t, within(i + 1));
                    }
                }
                assert_eq!(got.saved, want.saved, "{what}: saved bytes vs the CPU's");
            }
        }
    }
}

/// `bound` evaluated on the exact (f64) inputs and the runs' `gy`.
fn exact_bounds(bound: ErrorBound, inputs: &[&Tensor], out: &Tensor) -> Vec<Vec<f64>> {
    let x = inputs
        .iter()
        .map(|t| t.to_dtype(DType::F64))
        .collect::<Result<Vec<_>>>()
        .unwrap();
    let gy = run_gy(out.shape(), out.dtype(), Device::Cpu)
        .to_dtype(DType::F64)
        .unwrap();
    let b = bound(inputs[0].dtype(), &x, &gy).unwrap();
    b.iter().map(|t| t.to_f64_vec().unwrap()).collect()
}

/// [`assert_close_tol`], each element also passing within twice its
/// `bound` (two results each within `bound` of the exact value).
fn assert_close_within(what: &str, want: &Tensor, got: &Tensor, t: f64, bound: Option<&[f64]>) {
    let Some(bound) = bound else {
        return assert_close_tol(what, want, got, t);
    };
    assert_eq!(want.shape(), got.shape(), "{what}: shape");
    assert_eq!(want.dtype(), got.dtype(), "{what}: dtype");
    assert_eq!(bound.len(), want.numel(), "{what}: bound's size");
    let (w, g) = (want.to_f64_vec().unwrap(), got.to_f64_vec().unwrap());
    let big = w.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    for (i, ((a, b), e)) in w.iter().zip(&g).zip(bound).enumerate() {
        let ok = a == b
            || (a.is_nan() && b.is_nan())
            || (a - b).abs() <= t * a.abs().max(1e-3 * big)
            || (a - b).abs() <= 2.0 * e;
        assert!(
            ok,
            "{what}: element {i}: cpu {a} vs {b} (bound {e:e} from the exact)"
        );
    }
}
