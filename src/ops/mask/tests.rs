//! The masks on a strided view (was `mask_of_strided_tensor` in
//! `primitives/bitmask.rs`), and the relu mask launch wrappers against the
//! CPU: the packed bits and the masked values (was
//! `relu_mask_bits_and_values_match_the_cpu` in `tests/cuda_layers.rs`).
//! Without a GPU the CUDA test prints `skipped: no CUDA device (…)` and
//! passes.

use super::cuda::{
    positive_mask as cuda_positive_mask, relu_mask_backward, relu_mask_backward_in_place,
    relu_mask_forward, relu_mask_forward_in_place,
};
use super::{mask_scale, positive_mask};
use crate::cuda::testing::device;
use crate::cuda::{CudaBuffer, CudaDevice, Strided};
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

/// The contiguous layout of `shape`.
fn dense(shape: &[usize]) -> Strided {
    Strided::contiguous(shape).unwrap()
}

fn leaf(t: &Tensor) -> Tensor {
    t.clone().set_requires_grad(true).unwrap()
}

/// Backpropagates `sum(y · gy)` and returns the gradients of `leaves`.
fn grads(y: &Tensor, gy: &Tensor, leaves: &[&Tensor]) -> Vec<Vec<f64>> {
    y.mul(gy).unwrap().sum_all().unwrap().backward().unwrap();
    leaves
        .iter()
        .map(|l| l.grad().unwrap().to_f64_vec().unwrap())
        .collect()
}

fn vals(t: &Tensor) -> Vec<f64> {
    t.to_f64_vec().unwrap()
}

#[test]
fn mask_of_strided_tensor() {
    let x = Tensor::from_vec(vec![1.0f32, -1.0, 0.0, 2.0], &[2, 2], Device::Cpu).unwrap();
    let xt = x.view_with_layout(x.layout().permute(&[1, 0]).unwrap());
    // Transposed order: 1, 0, -1, 2.
    let m = positive_mask(&xt).unwrap();
    assert_eq!(m.to_vec::<u32>().unwrap(), vec![0b1001]);
    let g = mask_scale(&xt, &m, 0.5).unwrap();
    assert_eq!(g.to_vec::<f32>().unwrap(), vec![1.0, 0.0, -0.5, 2.0]);
}

#[test]
fn relu_mask_bits_and_values_match_the_cpu() {
    let Some(dev) = device("relu_mask") else {
        return;
    };
    // 185 elements: a partial pass of the in-place kernels' 128 and a
    // partial run; 3,003: many passes (words past a warp's first four).
    for (dtype, shape) in FLOATS
        .into_iter()
        .flat_map(|d| [(d, [5, 37]), (d, [3, 1001])])
    {
        let n = shape[0] * shape[1];
        let x = cpu_rand(&shape, -1.0, 1.0, dtype, 1);
        let gy = cpu_rand(&shape, -1.0, 1.0, dtype, 2);
        let (gx, ggy) = (upload(&dev, &x), upload(&dev, &gy));
        for slope in [0.0, 0.1] {
            let (y, m) = relu_mask_forward(&gx, &dense(&shape), slope).unwrap();
            let want_mask = positive_mask(&x).unwrap();
            assert_eq!(
                m.to_vec::<u32>().unwrap(),
                want_mask.to_vec::<u32>().unwrap()
            );
            let xl = leaf(&x);
            let yc = if slope == 0.0 {
                xl.relu()
            } else {
                xl.leaky_relu(slope)
            }
            .unwrap();
            assert_eq!(download(&y), vals(&yc), "relu fwd {dtype:?} {slope}");
            // In place: the same values over x's own buffer, the same bits.
            let mut own = upload(&dev, &x);
            let mi = relu_mask_forward_in_place(&mut own, n, slope, None).unwrap();
            assert_eq!(
                download(&own),
                vals(&yc),
                "relu fwd in place {dtype:?} {slope}"
            );
            assert_eq!(mi.to_vec::<u32>().unwrap(), m.to_vec::<u32>().unwrap());
            let dx = relu_mask_backward(&ggy, &dense(&shape), &m, slope).unwrap();
            let want_dx = grads(&yc, &gy, &[&xl])[0].clone();
            assert_eq!(download(&dx), want_dx, "relu bwd {dtype:?}");
            let mut g_own = upload(&dev, &gy);
            relu_mask_backward_in_place(&mut g_own, n, &m, slope).unwrap();
            assert_eq!(download(&g_own), want_dx, "relu bwd in place {dtype:?}");
        }
        let pm = cuda_positive_mask(&gx, &dense(&shape)).unwrap();
        let want = positive_mask(&x).unwrap();
        assert_eq!(pm.to_vec::<u32>().unwrap(), want.to_vec::<u32>().unwrap());
    }
}
