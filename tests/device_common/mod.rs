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
    let gy = Tensor::rand_range(out.shape(), -1.0, 1.0, out.dtype(), Device::Cpu, 99)
        .unwrap()
        .to_device(dev)
        .unwrap();
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
    let n = inputs.len();
    for mask in 1..(1u32 << n) {
        let requires: Vec<bool> = (0..n).map(|i| mask & (1 << i) != 0).collect();
        for &policy in policies {
            let want = layer_run(Device::Cpu, policy, inputs, &requires, &f);
            for dev in cuda_common::devices(test) {
                if dev == Device::Cpu {
                    continue;
                }
                let got = layer_run(dev, policy, inputs, &requires, &f);
                let what = format!("{test} on {dev} ({policy:?}, requires grad {requires:?})");
                assert_close_tol(&what, &want.out, &got.out, t);
                for (i, (w, g)) in want.grads.iter().zip(&got.grads).enumerate() {
                    if let (Some(w), Some(g)) = (w, g) {
                        assert_close_tol(&format!("{what}: grad {i}"), w, g, t);
                    }
                }
                assert_eq!(got.saved, want.saved, "{what}: saved bytes vs the CPU's");
            }
        }
    }
}
