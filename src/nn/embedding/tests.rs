//! The embedding launch wrappers against the CPU layer, bit for bit, and
//! their own index check (was `embedding_matches_the_cpu_bit_for_bit` in
//! `tests/cuda_layers.rs`). Without a GPU the test prints
//! `skipped: no CUDA device (…)` and passes.

use super::cuda::{embedding_backward, embedding_forward};
use crate::cuda::testing::device;
use crate::cuda::{CudaBuffer, CudaDevice};
use crate::{DType, Device, Tensor};
use std::sync::Arc;

const FLOATS: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

/// A seeded CPU tensor of `shape` in `dtype` with values in `[lo, hi)`.
fn cpu_rand(shape: &[usize], lo: f64, hi: f64, dtype: DType, seed: u64) -> Tensor {
    Tensor::rand_range(shape, lo, hi, DType::F64, Device::Cpu, seed)
        .and_then(|t| t.to_dtype(dtype))
        .unwrap()
}

/// A device copy of a contiguous CPU tensor's elements.
fn upload(dev: &Arc<CudaDevice>, t: &Tensor) -> CudaBuffer {
    CudaBuffer::from_cpu_data(dev, &t.storage().cpu().unwrap()).unwrap()
}

fn download(b: &CudaBuffer) -> Vec<f64> {
    b.to_cpu_data().unwrap().to_vec_as::<f64>()
}

fn vals(t: &Tensor) -> Vec<f64> {
    t.to_f64_vec().unwrap()
}

#[test]
fn embedding_matches_the_cpu_bit_for_bit() {
    let Some(dev) = device("embedding") else {
        return;
    };
    let idx = [3usize, 1, 3, 0, 5, 3, 1, 2];
    let it = Tensor::from_vec(
        idx.iter().map(|&i| i as i64).collect(),
        &[2, 4],
        Device::Cpu,
    )
    .unwrap();
    for dtype in FLOATS {
        let w = cpu_rand(&[6, 5], -1.0, 1.0, dtype, 22);
        let wl = w.clone().set_requires_grad(true).unwrap();
        let yc = crate::nn::embedding(&wl, &it, Some(1)).unwrap();
        let y = embedding_forward(&upload(&dev, &w), 6, 5, &idx).unwrap();
        assert_eq!(download(&y), vals(&yc), "embedding {dtype:?}");
        let gy = cpu_rand(yc.shape(), -1.0, 1.0, dtype, 23);
        let dw = embedding_backward(&upload(&dev, &gy), &idx, 6, 5, Some(1)).unwrap();
        // The CPU's gradient of sum(y · gy).
        yc.mul(&gy).unwrap().sum_all().unwrap().backward().unwrap();
        let want = vals(&wl.grad().unwrap());
        assert_eq!(download(&dw), want, "embedding bwd {dtype:?}");
    }
    assert!(embedding_forward(
        &upload(&dev, &cpu_rand(&[6, 5], 0.0, 1.0, DType::F32, 1)),
        6,
        5,
        &[6]
    )
    .is_err());
}
