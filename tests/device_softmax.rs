//! Softmax and log-softmax on CUDA against the CPU, and their gradient
//! against the formula in f64, odd sizes included (was
//! `softmax_and_log_softmax_forward_and_backward` in `tests/cuda_reduce.rs`,
//! on the launch wrappers; the same assertions through `Tensor::softmax`,
//! `Tensor::log_softmax` and backward). Without a GPU the test prints
//! `skipped: no CUDA device (…)` and passes.

mod cuda_common;

use cuda_common::{assert_close, cpu_rand, tol, FLOATS};
use leangrad::Device;

/// `dx` of softmax (or log-softmax) from `y` and `g` by the formula, in f64.
fn softmax_grad(y: &[f64], g: &[f64], outer: usize, c: usize, inner: usize, log: bool) -> Vec<f64> {
    let mut dx = vec![0.0; y.len()];
    for o in 0..outer {
        for j in 0..inner {
            let at = |k: usize| (o * c + k) * inner + j;
            let s: f64 = (0..c)
                .map(|k| if log { g[at(k)] } else { g[at(k)] * y[at(k)] })
                .sum();
            for k in 0..c {
                let i = at(k);
                dx[i] = if log {
                    g[i] - y[i].exp() * s
                } else {
                    y[i] * (g[i] - s)
                };
            }
        }
    }
    dx
}

#[test]
fn softmax_and_log_softmax_forward_and_backward() {
    let _dev = cuda_or_skip!("softmax");
    let dev = Device::Cuda(0);
    let shape = [4, 300, 3];
    for dtype in FLOATS {
        let x = cpu_rand(&shape, -4.0, 4.0, dtype, 13);
        let g = cpu_rand(&shape, -1.0, 1.0, dtype, 14);
        for log in [false, true] {
            let y_cpu = if log { x.log_softmax(1) } else { x.softmax(1) }.unwrap();
            let xd = x.to_device(dev).unwrap().set_requires_grad(true).unwrap();
            let y = if log {
                xd.log_softmax(1)
            } else {
                xd.softmax(1)
            }
            .unwrap();
            assert_eq!(y.device(), dev);
            let what = format!("softmax log={log} {dtype:?}");
            let yv = y.to_f64_vec().unwrap();
            assert_close(&what, &yv, &y_cpu.to_f64_vec().unwrap(), tol(dtype));
            // The gradient of sum(y · g) is softmax's backward from y and g.
            let gd = g.to_device(dev).unwrap();
            y.mul(&gd).unwrap().sum_all().unwrap().backward().unwrap();
            let dx = xd.grad().unwrap().to_f64_vec().unwrap();
            let want = softmax_grad(&yv, &g.to_f64_vec().unwrap(), 4, 300, 3, log);
            assert_close(&format!("{what} backward"), &dx, &want, tol(dtype) * 4.0);
        }
    }
}
