//! Helpers shared by the `tests/cuda_*.rs` suites: the device (or a printed
//! skip), uploads of CPU tensors, and per-dtype tolerances.
//!
//! Without a CUDA device the CUDA tests print `skipped: no CUDA device
//! (reason)` and pass — unless `LEANGRAD_REQUIRE_CUDA=1`, where a missing
//! device fails the test with the reason (CI's simulated-GPU phase sets it,
//! so a simulator that does not open cannot pass as a row of skips).
#![allow(dead_code)]

use leangrad::cuda::{CudaBuffer, CudaDevice, Strided};
use leangrad::{DType, Device, Tensor};
use std::io::Write;
use std::sync::Arc;

/// Whether `LEANGRAD_REQUIRE_CUDA=1`: a missing CUDA device is then a
/// failure, not a skip.
pub fn cuda_required() -> bool {
    std::env::var("LEANGRAD_REQUIRE_CUDA").is_ok_and(|v| v == "1")
}

/// CUDA device 0, or `None` after printing `skipped: no CUDA device (reason)`;
/// panics with the reason instead under `LEANGRAD_REQUIRE_CUDA=1`.
pub fn device(test: &str) -> Option<Arc<CudaDevice>> {
    match CudaDevice::get(0) {
        Ok(d) => Some(d),
        Err(e) => {
            assert!(
                !cuda_required(),
                "LEANGRAD_REQUIRE_CUDA=1 but no CUDA device: {e} [{test}]"
            );
            // Written to the process's stderr, past libtest's output
            // capture, so a skipped CUDA test is visible in every run.
            let _ = writeln!(std::io::stderr(), "skipped: no CUDA device ({e}) [{test}]");
            None
        }
    }
}

/// Binds the device or returns from the test after printing why it was skipped.
#[macro_export]
macro_rules! cuda_or_skip {
    ($test:expr) => {
        match cuda_common::device($test) {
            Some(d) => d,
            None => return,
        }
    };
}

/// The float dtypes every float kernel is tested in.
pub const FLOATS: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

/// Every dtype.
pub const ALL: [DType; 7] = [
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
pub fn tol(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => 1e-11,
        DType::F32 => 2e-5,
        DType::F16 => 4e-3,
        DType::BF16 => 3e-2,
        _ => 0.0,
    }
}

/// A seeded CPU tensor of `shape` in `dtype` with values in `[lo, hi)`.
pub fn cpu_rand(shape: &[usize], lo: f64, hi: f64, dtype: DType, seed: u64) -> Tensor {
    Tensor::rand_range(shape, lo, hi, DType::F64, Device::Cpu, seed)
        .and_then(|t| t.to_dtype(dtype))
        .unwrap()
}

/// A device copy of a CPU tensor's elements (row-major, contiguous).
pub fn upload(dev: &Arc<CudaDevice>, t: &Tensor) -> CudaBuffer {
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
pub fn download(b: &CudaBuffer) -> Vec<f64> {
    b.to_cpu_data().unwrap().to_vec_as::<f64>()
}

/// The contiguous layout of `shape`.
pub fn dense(shape: &[usize]) -> Strided {
    Strided::contiguous(shape).unwrap()
}

/// Asserts `got` matches `want` within `tol` (absolute + relative); NaNs
/// and infinities must match exactly.
pub fn assert_close(what: &str, got: &[f64], want: &[f64], tol: f64) {
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

/// The devices a test written once for every device runs on: the CPU
/// always, and `Device::Cuda(0)` when it can be opened; otherwise prints
/// `skipped: no CUDA device (reason)` for the CUDA half, once per test
/// (libtest names each test's thread after the test); under
/// `LEANGRAD_REQUIRE_CUDA=1` a missing device panics with the reason.
pub fn devices(test: &str) -> Vec<Device> {
    static PRINTED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut out = vec![Device::Cpu];
    match Device::cuda_if_available(0) {
        d @ Device::Cuda(_) => out.push(d),
        _ => {
            if cuda_required() {
                let reason = Device::Cuda(0)
                    .check_available()
                    .err()
                    .map_or_else(|| "unavailable".to_string(), |e| e.to_string());
                panic!("LEANGRAD_REQUIRE_CUDA=1 but no CUDA device: {reason} [{test}]");
            }
            let key = std::thread::current().name().unwrap_or(test).to_string();
            let mut printed = PRINTED.lock().unwrap_or_else(|e| e.into_inner());
            if printed.contains(&key) {
                return out;
            }
            printed.push(key);
            let reason = Device::Cuda(0)
                .check_available()
                .err()
                .map_or_else(|| "unavailable".to_string(), |e| e.to_string());
            let line = format!("skipped: no CUDA device ({reason}) [{test}: CUDA half]\n");
            let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
        }
    }
    out
}
