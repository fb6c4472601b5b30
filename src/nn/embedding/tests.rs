//! The embedding launch wrappers against the CPU layer, bit for bit, and
//! their own index check (was `embedding_matches_the_cpu_bit_for_bit` in
//! `tests/cuda_layers.rs`). Without a GPU the test prints
//! `skipped: no CUDA device (…)` and passes.

use super::cuda::{embedding_backward, embedding_forward};
use crate::cuda::testing::*;
use crate::{DType, Device, Tensor};

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
