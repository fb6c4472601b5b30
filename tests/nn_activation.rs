//! Activation layers, Flatten and relu_inplace: values, gradients, saved
//! bytes under both policies, and when relu writes over its input;
//! hardswish and hardsigmoid bit for bit against PyTorch.
mod common;
use common::*;
use leangrad::autograd::{with_save_policy, SavePolicy};
use leangrad::memory::{Category, Ledger};
use leangrad::nn::*;
use leangrad::{DType, Device, Tensor};
use std::sync::Arc;

fn f32s(shape: &[usize], seed: u64) -> Tensor {
    Tensor::rand_range(shape, -2.0, 2.0, DType::F32, Device::Cpu, seed).unwrap()
}

fn bytes(rows: &[(u32, usize, usize)], mask: u32) -> (usize, usize) {
    let r = rows.iter().find(|r| r.0 == mask).expect("combination");
    (r.1, r.2)
}

fn erf(x: f64) -> f64 {
    // Abramowitz–Stegun 7.1.26 is too coarse; integrate the series instead.
    let (mut term, mut sum, mut n) = (x, x, 0.0);
    while term.abs() > 1e-18 {
        n += 1.0;
        term *= -x * x / n;
        sum += term / (2.0 * n + 1.0);
    }
    sum * 2.0 / std::f64::consts::PI.sqrt()
}

/// Every activation layer with its naive reference and what it saves
/// (lean, SaveAll) for `n` f32 elements.
type Case = (Box<dyn Module>, fn(f64) -> f64, fn(usize) -> (usize, usize));

fn cases() -> Vec<(&'static str, Case)> {
    fn bit_mask(n: usize) -> (usize, usize) {
        (n.div_ceil(32) * 4, 4 * n)
    }
    fn whole(n: usize) -> (usize, usize) {
        (4 * n, 4 * n)
    }
    vec![
        (
            "relu",
            (Box::new(ReLU { inplace: false }), |x| x.max(0.0), bit_mask),
        ),
        (
            "relu_inplace",
            (Box::new(ReLU { inplace: true }), |x| x.max(0.0), bit_mask),
        ),
        (
            "leaky_relu",
            (
                Box::new(LeakyReLU {
                    negative_slope: 0.125,
                }),
                |x| if x > 0.0 { x } else { 0.125 * x },
                bit_mask,
            ),
        ),
        (
            "gelu",
            (
                Box::new(GELU { approximate: false }),
                |x| 0.5 * x * (1.0 + erf(x / 2f64.sqrt())),
                whole,
            ),
        ),
        (
            "gelu_tanh",
            (
                Box::new(GELU { approximate: true }),
                |x| {
                    let k = (2.0 / std::f64::consts::PI).sqrt();
                    0.5 * x * (1.0 + (k * (x + 0.044715 * x * x * x)).tanh())
                },
                whole,
            ),
        ),
        (
            "silu",
            (Box::new(SiLU {}), |x| x / (1.0 + (-x).exp()), whole),
        ),
        (
            "sigmoid",
            (Box::new(Sigmoid {}), |x| 1.0 / (1.0 + (-x).exp()), whole),
        ),
        ("tanh", (Box::new(Tanh {}), |x| x.tanh(), whole)),
        (
            "hardswish",
            (
                Box::new(Hardswish {}),
                |x| x * (x + 3.0).clamp(0.0, 6.0) / 6.0,
                whole,
            ),
        ),
        (
            "hardsigmoid",
            (
                Box::new(Hardsigmoid {}),
                |x| (x + 3.0).clamp(0.0, 6.0) / 6.0,
                whole,
            ),
        ),
        (
            "mish",
            (Box::new(Mish {}), |x| x * x.exp().ln_1p().tanh(), whole),
        ),
    ]
}

#[test]
fn activations_match_naive_values() {
    let x = rand64(&[3, 17], 1);
    let xs = x.to_f64_vec().unwrap();
    for (name, (m, f, _)) in cases() {
        let y = m.forward(&x).unwrap();
        assert_eq!(y.shape(), x.shape(), "{name}");
        let want: Vec<f64> = xs.iter().map(|&v| f(v)).collect();
        assert_close(&y.to_f64_vec().unwrap(), &want, 1e-13);
        assert!(m.named_parameters().is_empty());
    }
}

#[test]
fn activations_gradcheck_and_save_exact_bytes() {
    for (name, (m, _, saves)) in cases() {
        check(|t| m.forward(&t[0]), &[rand64(&[4, 5], 2)]);
        for n in [1usize, 31, 33, 100] {
            let x = f32s(&[n], 3 + n as u64);
            let rows = check_policies(&|t| m.forward(&t[0]), std::slice::from_ref(&x));
            assert_eq!(bytes(&rows, 1), saves(n), "{name} n={n}");
            assert_eq!(bytes(&rows, 0), (0, 0), "{name} n={n}");
        }
    }
}

#[test]
fn flatten_views_and_saves_nothing() {
    let x = rand64(&[2, 3, 4, 5], 4);
    let y = Flatten::default().forward(&x).unwrap();
    assert_eq!(y.shape(), &[2, 60]);
    assert!(y.shares_storage_with(&x));
    assert_eq!(y.to_f64_vec().unwrap(), x.to_f64_vec().unwrap());
    let f = Flatten {
        start_dim: 0,
        end_dim: 1,
    };
    assert_eq!(f.forward(&x).unwrap().shape(), &[6, 4, 5]);
    check(|t| f.forward(&t[0]), &[rand64(&[2, 3, 2], 5)]);
    let rows = check_policies(&|t| f.forward(&t[0]), &[f32s(&[2, 3, 2], 6)]);
    assert_eq!(bytes(&rows, 1), (0, 0));
    let bad = Flatten {
        start_dim: 2,
        end_dim: 1,
    };
    assert_err!(bad.forward(&x), InvalidArgument);
    assert_err!(
        Flatten {
            start_dim: 0,
            end_dim: 9
        }
        .forward(&x),
        DimOutOfRange
    );
}

#[test]
fn relu_inplace_writes_over_an_unshared_input() {
    let ledger = Ledger::new();
    let _l = ledger.enter();
    let vals = [-1.0f32, 2.0, -0.5, 0.0, 3.0, f32::NAN];
    // Nothing else holds it: same storage, no allocation, version bumped.
    let x = Tensor::from_vec(vals.to_vec(), &[2, 3], Device::Cpu).unwrap();
    let (ptr, allocs) = (
        Arc::as_ptr(x.storage()),
        ledger.allocation_count(Device::Cpu),
    );
    let y = x.relu_inplace().unwrap();
    assert_eq!(Arc::as_ptr(y.storage()), ptr);
    assert_eq!(ledger.allocation_count(Device::Cpu), allocs);
    assert_eq!(y.version(), 1);
    let ys = y.to_vec::<f32>().unwrap();
    assert_eq!(ys[..5], [0.0, 2.0, 0.0, 0.0, 3.0]);
    assert!(ys[5].is_nan());
    // Shared with a live clone: out of place, the input untouched.
    let x = Tensor::from_vec(vals.to_vec(), &[6], Device::Cpu).unwrap();
    let keep = x.clone();
    let allocs = ledger.allocation_count(Device::Cpu);
    let y = x.relu_inplace().unwrap();
    assert!(!y.shares_storage_with(&keep));
    assert_eq!(ledger.allocation_count(Device::Cpu), allocs + 1);
    assert_eq!(keep.to_vec::<f32>().unwrap()[..5], vals[..5]);
    // Shared through another view of the storage, or a strided view.
    let x = Tensor::from_vec(vals.to_vec(), &[2, 3], Device::Cpu).unwrap();
    let view = x.reshape(&[3, 2]).unwrap();
    let y = x.relu_inplace().unwrap();
    assert!(!y.shares_storage_with(&view));
    let x = Tensor::from_vec(vals.to_vec(), &[2, 3], Device::Cpu).unwrap();
    let xt = x.t().unwrap();
    drop(x);
    let y = xt.relu_inplace().unwrap();
    assert_eq!(y.version(), 0);
    assert_eq!(y.shape(), &[3, 2]);
    // A leaf that requires grad is never overwritten.
    let x = f32s(&[8], 7).set_requires_grad(true).unwrap();
    let leaf = x.clone();
    let y = x.relu_inplace().unwrap();
    assert!(!y.shares_storage_with(&leaf));
    // ReLU{inplace}.apply on an owned tensor writes in place too.
    let x = Tensor::from_vec(vals.to_vec(), &[6], Device::Cpu).unwrap();
    let ptr = Arc::as_ptr(x.storage());
    let y = ReLU { inplace: true }.apply(x).unwrap();
    assert_eq!(Arc::as_ptr(y.storage()), ptr);
    let x = Tensor::from_vec(vals.to_vec(), &[6], Device::Cpu).unwrap();
    let y = ReLU { inplace: false }.apply(x).unwrap();
    assert_eq!(y.version(), 0);
}

#[test]
fn relu_inplace_on_an_intermediate_keeps_gradients_and_the_bit_mask() {
    for policy in [SavePolicy::Lean, SavePolicy::SaveAll] {
        let ledger = Ledger::new();
        let _l = ledger.enter();
        let _p = with_save_policy(policy);
        let n = 100;
        let a = f32s(&[n], 8).set_requires_grad(true).unwrap();
        let b = f32s(&[n], 9);
        // add saves nothing, so its output is held by nobody else.
        let h = a.add(&b).unwrap();
        let ptr = Arc::as_ptr(h.storage());
        let allocs = ledger.allocation_count(Device::Cpu);
        let y = h.relu_inplace().unwrap();
        assert_eq!(Arc::as_ptr(y.storage()), ptr, "{policy:?}");
        let saved = ledger.live_in(Device::Cpu, Category::Saved);
        match policy {
            // Only the mask is allocated.
            SavePolicy::Lean => {
                assert_eq!(ledger.allocation_count(Device::Cpu), allocs + 1);
                assert_eq!(saved, n.div_ceil(32) * 4);
            }
            // The output (the same storage) is kept, as PyTorch's relu_.
            SavePolicy::SaveAll => {
                assert_eq!(ledger.allocation_count(Device::Cpu), allocs);
                assert_eq!(saved, 4 * n);
            }
        }
        y.sum_all().unwrap().backward().unwrap();
        let (av, bv) = (a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
        let want: Vec<f32> = av
            .iter()
            .zip(&bv)
            .map(|(x, y)| if x + y > 0.0 { 1.0 } else { 0.0 })
            .collect();
        assert_eq!(a.grad().unwrap().to_vec::<f32>().unwrap(), want);
    }
    // An intermediate some op saved is shared: relu falls back and the
    // saved tensor stays valid for its backward.
    let a = f32s(&[10], 10).set_requires_grad(true).unwrap();
    let h = a.mul_scalar(1.0).unwrap().add_scalar(0.0).unwrap();
    let sq = h.square().unwrap();
    let y = h.relu_inplace().unwrap().add(&sq).unwrap();
    y.sum_all().unwrap().backward().unwrap();
    let av = a.to_vec::<f32>().unwrap();
    let want: Vec<f32> = av
        .iter()
        .map(|&x| 2.0 * x + if x > 0.0 { 1.0 } else { 0.0 })
        .collect();
    assert_eq!(a.grad().unwrap().to_vec::<f32>().unwrap(), want);
    // Gradcheck through the in-place path.
    check(
        |t| t[0].mul_scalar(2.0)?.relu_inplace(),
        &[rand64(&[3, 4], 11)],
    );
    assert_err!(
        Tensor::from_vec(vec![1i64, -2], &[2], Device::Cpu)
            .unwrap()
            .relu_inplace(),
        UnsupportedDType
    );
}

/// PyTorch's hardswish and hardsigmoid (`python-compare/activation_fixture.py`:
/// 1000 elements over [−7, 7] with ±3, ±inf, ±0 and neighbours of ±3),
/// outputs and input gradients, bit for bit in f32 and f64.
#[test]
fn hardswish_and_hardsigmoid_equal_pytorch_bit_for_bit() {
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/activations/hard.safetensors");
    let fx = leangrad::io::load_safetensors(path).unwrap();
    let get = |k: &str| fx.get(k).unwrap_or_else(|| panic!("fixture {k}")).clone();
    let bits = |t: &Tensor| -> Vec<u64> {
        t.to_f64_vec()
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect()
    };
    for dtype in ["f32", "f64"] {
        let layers: [(&str, Box<dyn Module>); 2] = [
            ("hardswish", Box::new(Hardswish {})),
            ("hardsigmoid", Box::new(Hardsigmoid {})),
        ];
        for (name, m) in layers {
            let x = get(&format!("x_{dtype}")).set_requires_grad(true).unwrap();
            let y = m.forward(&x).unwrap();
            let want = get(&format!("{name}_{dtype}"));
            assert_eq!(bits(&y), bits(&want), "{name} {dtype} forward");
            // d(Σ y·g)/dy is g exactly, so backward receives PyTorch's g.
            let g = get(&format!("g_{dtype}"));
            y.mul(&g).unwrap().sum_all().unwrap().backward().unwrap();
            let grad = x.grad().expect("input gradient");
            let want = get(&format!("{name}_grad_{dtype}"));
            assert_eq!(bits(&grad), bits(&want), "{name} {dtype} gradient");
        }
    }
}

/// PyTorch's mish on the same inputs: PyTorch's vectorised exp, log1p and
/// tanh are not the C library's, so values agree to a few ulps, not bits
/// (f32 within 4e-7 relative to max(|y|, 1); f64 within 1e-15).
#[test]
fn mish_matches_pytorch() {
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/activations/hard.safetensors");
    let fx = leangrad::io::load_safetensors(path).unwrap();
    let get = |k: &str| fx.get(k).unwrap_or_else(|| panic!("fixture {k}")).clone();
    for (dtype, tol) in [("f32", 4e-7), ("f64", 1e-15)] {
        let x = get(&format!("x_{dtype}")).set_requires_grad(true).unwrap();
        let y = Mish {}.forward(&x).unwrap();
        let g = get(&format!("g_{dtype}"));
        y.mul(&g).unwrap().sum_all().unwrap().backward().unwrap();
        let grad = x.grad().expect("input gradient");
        for (what, got, want) in [
            (
                "forward",
                y.to_f64_vec().unwrap(),
                get(&format!("mish_{dtype}")),
            ),
            (
                "gradient",
                grad.to_f64_vec().unwrap(),
                get(&format!("mish_grad_{dtype}")),
            ),
        ] {
            let want = want.to_f64_vec().unwrap();
            let worst = got
                .iter()
                .zip(&want)
                .map(|(a, b)| {
                    if a == b {
                        0.0
                    } else {
                        (a - b).abs() / b.abs().max(1.0)
                    }
                })
                .fold(0.0f64, f64::max);
            assert!(worst <= tol, "mish {dtype} {what}: {worst:e} > {tol:e}");
        }
    }
}
