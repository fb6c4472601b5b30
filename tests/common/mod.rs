//! Helpers shared by the integration tests.
#![allow(dead_code)]

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
