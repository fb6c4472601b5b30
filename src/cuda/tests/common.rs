//! Helpers of the launch-wrapper tests (as `tests/cuda_common`): uploads
//! of CPU tensors, downloads, dense layouts and per-dtype tolerances. The
//! device (or a printed skip) is `crate::cuda::testing::device`.

use crate::cuda::{CudaBuffer, CudaDevice, Strided};
use crate::{DType, Device, Tensor};
use std::sync::Arc;

/// The float dtypes every float kernel is tested in.
pub(super) const FLOATS: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

/// Every dtype.
pub(super) const ALL: [DType; 7] = [
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
pub(super) fn tol(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => 1e-11,
        DType::F32 => 2e-5,
        DType::F16 => 4e-3,
        DType::BF16 => 3e-2,
        _ => 0.0,
    }
}

/// A seeded CPU tensor of `shape` in `dtype` with values in `[lo, hi)`.
pub(super) fn cpu_rand(shape: &[usize], lo: f64, hi: f64, dtype: DType, seed: u64) -> Tensor {
    Tensor::rand_range(shape, lo, hi, DType::F64, Device::Cpu, seed)
        .and_then(|t| t.to_dtype(dtype))
        .unwrap()
}

/// A device copy of a CPU tensor's elements (row-major, contiguous).
pub(super) fn upload(dev: &Arc<CudaDevice>, t: &Tensor) -> CudaBuffer {
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
pub(super) fn download(b: &CudaBuffer) -> Vec<f64> {
    b.to_cpu_data().unwrap().to_vec_as::<f64>()
}

/// The contiguous layout of `shape`.
pub(super) fn dense(shape: &[usize]) -> Strided {
    Strided::contiguous(shape).unwrap()
}

/// Asserts `got` matches `want` within `tol` (absolute + relative); NaNs
/// and infinities must match exactly.
pub(super) fn assert_close(what: &str, got: &[f64], want: &[f64], tol: f64) {
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
pub(super) use cuda_or_skip;
