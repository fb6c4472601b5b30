//! The pooling layers on CUDA against the CPU, bit for bit: max pooling
//! (overlapping, padded, dilated windows; lean U8 positions), average
//! pooling with and without the padding in the divisor, and adaptive
//! average pooling, forward and backward, in every float dtype. (Was
//! `pools_match_the_cpu` in `tests/cuda_layers.rs`, on the launch wrappers;
//! the same assertions through the public layer functions.) Without a GPU
//! the test prints `skipped: no CUDA device (…)` and passes.

mod cuda_common;

use cuda_common::{cpu_rand, FLOATS};
use leangrad::nn;
use leangrad::{Device, Result, Tensor};

fn leaf(t: &Tensor) -> Tensor {
    t.clone().set_requires_grad(true).unwrap()
}

/// Backpropagates `sum(y · gy)` and returns the gradient of `x`.
fn grad(y: &Tensor, gy: &Tensor, x: &Tensor) -> Vec<f64> {
    y.mul(gy).unwrap().sum_all().unwrap().backward().unwrap();
    x.grad().unwrap().to_f64_vec().unwrap()
}

fn vals(t: &Tensor) -> Vec<f64> {
    t.to_f64_vec().unwrap()
}

/// Runs `f` on `x` on the CPU and on `dev` and asserts the outputs and the
/// gradients of `sum(y · gy)` (`gy` from `seed`) are identical.
fn same_on(dev: Device, what: &str, x: &Tensor, seed: u64, f: impl Fn(&Tensor) -> Result<Tensor>) {
    let xc = leaf(x);
    let yc = f(&xc).unwrap();
    let xd = leaf(&x.to_device(dev).unwrap());
    let yd = f(&xd).unwrap();
    assert_eq!(yd.device(), dev, "{what}: output device");
    assert_eq!(vals(&yd), vals(&yc), "{what}");
    let gy = cpu_rand(yc.shape(), -1.0, 1.0, x.dtype(), seed);
    let want = grad(&yc, &gy, &xc);
    let got = grad(&yd, &gy.to_device(dev).unwrap(), &xd);
    assert_eq!(got, want, "{what} bwd");
}

#[test]
fn pools_match_the_cpu() {
    let _dev = cuda_or_skip!("pool");
    let dev = Device::Cuda(0);
    for dtype in FLOATS {
        let x = cpu_rand(&[2, 3, 9, 11], -1.0, 1.0, dtype, 4);
        let mut o = nn::MaxPool2dOptions::new([3, 2]);
        o.stride = Some([2, 2]);
        o.padding = [1, 1];
        o.dilation = [1, 2];
        same_on(dev, &format!("max pool {dtype:?}"), &x, 5, |t| {
            nn::max_pool2d(t, &o)
        });
        for include in [false, true] {
            let mut o = nn::AvgPool2dOptions::new([3, 3]);
            o.stride = Some([2, 2]);
            o.padding = [1, 1];
            o.count_include_pad = include;
            same_on(dev, &format!("avg pool {dtype:?} {include}"), &x, 6, |t| {
                nn::avg_pool2d(t, &o)
            });
        }
        same_on(dev, &format!("adaptive {dtype:?}"), &x, 7, |t| {
            nn::adaptive_avg_pool2d(t, [4, 3])
        });
    }
}

/// Max pooling with dilation 1 (the 32-bit gather of the input gradient
/// and the 32-bit forward) against the CPU, bit for bit, in every float
/// dtype and both save policies (lean U8 window positions, SaveAll's I64
/// flat indices): ResNet's 3×3/2 with padding 1, overlapping 3×3/1 windows,
/// 2×2/2, a stride above the kernel, unequal kernel sides with ceil mode.
/// Inputs are whole numbers in [-3, 3], so windows hold ties (the first
/// maximum wins) and inputs are the maximum of several windows (their
/// gradients sum in output order).
#[test]
fn max_pools_without_dilation_match_the_cpu() {
    use leangrad::autograd::{with_save_policy, SavePolicy};
    let _dev = cuda_or_skip!("pool");
    let dev = Device::Cuda(0);
    // (kernel, stride, padding, ceil mode)
    type Geometry = ([usize; 2], [usize; 2], [usize; 2], bool);
    let geometries: [Geometry; 5] = [
        ([3, 3], [2, 2], [1, 1], false),
        ([3, 3], [1, 1], [1, 1], false),
        ([2, 2], [2, 2], [0, 0], false),
        ([2, 3], [4, 3], [1, 0], false),
        ([3, 2], [2, 1], [1, 1], true),
    ];
    for dtype in FLOATS {
        let shape = [2, 3, 13, 10];
        let whole: Vec<f64> = vals(&cpu_rand(&shape, -3.49, 3.49, dtype, 8))
            .iter()
            .map(|v| v.round())
            .collect();
        let x = Tensor::from_f64_slice(&whole, &shape, dtype, Device::Cpu).unwrap();
        for (i, &(kernel, stride, padding, ceil_mode)) in geometries.iter().enumerate() {
            let mut o = nn::MaxPool2dOptions::new(kernel);
            o.stride = Some(stride);
            o.padding = padding;
            o.ceil_mode = ceil_mode;
            for policy in [SavePolicy::Lean, SavePolicy::SaveAll] {
                let _p = with_save_policy(policy);
                let what = format!("max pool {dtype:?} #{i} {policy:?}");
                same_on(dev, &what, &x, 9 + i as u64, |t| nn::max_pool2d(t, &o));
            }
        }
    }
}
