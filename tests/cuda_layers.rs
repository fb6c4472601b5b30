//! The relu mask kernels (`src/cuda/layers_mask.rs`) against the CPU: the
//! packed bits and the masked values. (Every family's kernels are checked
//! through its layers in the `device_*` suites.) Without a GPU every test
//! prints `skipped: no CUDA device (…)` and passes.

mod cuda_common;

use cuda_common::{cpu_rand, dense, download, upload, FLOATS};
use leangrad::cuda::layers_mask as mask;
use leangrad::Tensor;

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
fn relu_mask_bits_and_values_match_the_cpu() {
    let dev = cuda_or_skip!("relu_mask");
    for dtype in FLOATS {
        let x = cpu_rand(&[5, 37], -1.0, 1.0, dtype, 1);
        let gy = cpu_rand(&[5, 37], -1.0, 1.0, dtype, 2);
        let (gx, ggy) = (upload(&dev, &x), upload(&dev, &gy));
        for slope in [0.0, 0.1] {
            let (y, m) = mask::relu_mask_forward(&gx, &dense(&[5, 37]), slope).unwrap();
            let want_mask = leangrad::primitives::positive_mask(&x).unwrap();
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
            let dx = mask::relu_mask_backward(&ggy, &dense(&[5, 37]), &m, slope).unwrap();
            assert_eq!(
                download(&dx),
                grads(&yc, &gy, &[&xl])[0],
                "relu bwd {dtype:?}"
            );
        }
        let pm = mask::positive_mask(&gx, &dense(&[5, 37])).unwrap();
        let want = leangrad::primitives::positive_mask(&x).unwrap();
        assert_eq!(pm.to_vec::<u32>().unwrap(), want.to_vec::<u32>().unwrap());
    }
}
