//! For unit tests of launch code inside the crate (`src/cuda/tests/`, the
//! families' `tests.rs`): CUDA device 0 or a printed skip (a failure under
//! `LEANGRAD_REQUIRE_CUDA=1`), uploads of CPU tensors, downloads, dense
//! layouts and per-dtype tolerances, as `tests/cuda_common` for the
//! integration suites.

use super::{CudaBuffer, CudaDevice, Strided};
use crate::{DType, Device, Tensor};
use std::io::Write;
use std::sync::Arc;

/// CUDA device 0, or `None` after printing `skipped: no CUDA device
/// (reason) [test]`; panics with the reason under `LEANGRAD_REQUIRE_CUDA=1`.
pub(crate) fn device(test: &str) -> Option<Arc<CudaDevice>> {
    match CudaDevice::get(0) {
        Ok(d) => Some(d),
        Err(e) => {
            let required = std::env::var("LEANGRAD_REQUIRE_CUDA").is_ok_and(|v| v == "1");
            assert!(
                !required,
                "LEANGRAD_REQUIRE_CUDA=1 but no CUDA device: {e} [{test}]"
            );
            // Past libtest's capture, so every skip shows in the log.
            let _ = writeln!(std::io::stderr(), "skipped: no CUDA device ({e}) [{test}]");
            None
        }
    }
}

/// The float dtypes every float kernel is tested in.
pub(crate) const FLOATS: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

/// Every dtype.
pub(crate) const ALL: [DType; 7] = [
    DType::F32,
    DType::F64,
    DType::F16,
    DType::BF16,
    DType::U8,
    DType::U32,
    DType::I64,
];

/// Absolute + relative tolerance for comparing a kernel with the CPU in
/// `dtype` (half types compute in f32 on the GPU, round once more).
pub(crate) fn tol(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => 1e-11,
        DType::F32 => 2e-5,
        DType::F16 => 4e-3,
        DType::BF16 => 3e-2,
        _ => 0.0,
    }
}

/// A seeded CPU tensor of `shape` in `dtype` with values in `[lo, hi)`.
pub(crate) fn cpu_rand(shape: &[usize], lo: f64, hi: f64, dtype: DType, seed: u64) -> Tensor {
    Tensor::rand_range(shape, lo, hi, DType::F64, Device::Cpu, seed)
        .and_then(|t| t.to_dtype(dtype))
        .unwrap()
}

/// A device copy of a CPU tensor's elements (row-major, contiguous).
pub(crate) fn upload(dev: &Arc<CudaDevice>, t: &Tensor) -> CudaBuffer {
    let t = t.to_dtype(t.dtype()).unwrap();
    match t.dtype() {
        DType::F32 => CudaBuffer::from_slice(dev, &t.to_vec::<f32>().unwrap()),
        DType::F64 => CudaBuffer::from_slice(dev, &t.to_vec::<f64>().unwrap()),
        DType::F16 => CudaBuffer::from_slice(dev, &t.to_vec::<half::f16>().unwrap()),
        DType::BF16 => CudaBuffer::from_slice(dev, &t.to_vec::<half::bf16>().unwrap()),
        DType::U8 => CudaBuffer::from_slice(dev, &t.to_vec::<u8>().unwrap()),
        DType::U32 => CudaBuffer::from_slice(dev, &t.to_vec::<u32>().unwrap()),
        DType::I64 => CudaBuffer::from_slice(dev, &t.to_vec::<i64>().unwrap()),
    }
    .unwrap()
}

/// A buffer's elements as f64.
pub(crate) fn download(b: &CudaBuffer) -> Vec<f64> {
    b.to_cpu_data().unwrap().to_vec_as::<f64>()
}

/// The contiguous layout of `shape`.
pub(crate) fn dense(shape: &[usize]) -> Strided {
    Strided::contiguous(shape).unwrap()
}

/// Asserts `got` matches `want` within `tol` (absolute + relative); NaNs
/// and infinities must match exactly.
pub(crate) fn assert_close(what: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let ok = if w.is_finite() {
            (g - w).abs() <= tol * (1.0 + w.abs())
        } else {
            g.is_nan() == w.is_nan() && (w.is_nan() || g == w)
        };
        assert!(ok, "{what}: element {i}: got {g}, want {w} (tol {tol})");
    }
}

/// Binds CUDA device 0 or returns from the test after the printed skip
/// (a failure under `LEANGRAD_REQUIRE_CUDA=1`), as `tests/cuda_common`'s
/// `cuda_or_skip!`.
macro_rules! cuda_or_skip {
    ($test:expr) => {
        match crate::cuda::testing::device($test) {
            Some(d) => d,
            None => return,
        }
    };
}
pub(crate) use cuda_or_skip;

/// A tensor's elements as f64.
pub(crate) fn vals(t: &Tensor) -> Vec<f64> {
    t.to_f64_vec().unwrap()
}

/// The value of `#define NAME value` in a kernel file's source `src`, for
/// the tests that check a constant the launch code plans with against the
/// kernels' own (one source each side).
pub(crate) fn cu_define(src: &str, name: &str) -> usize {
    let line = src
        .lines()
        .find(|l| l.starts_with(&format!("#define {name} ")))
        .unwrap_or_else(|| panic!("the kernel source defines {name}"));
    let value = line.split_whitespace().nth(2).unwrap_or_default();
    value
        .parse()
        .unwrap_or_else(|e| panic!("#define {name} {value}: {e}"))
}
