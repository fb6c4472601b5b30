//! The layer kernels (`src/cuda/layers_*.rs`) against the CPU: relu mask
//! bits, conv and
//! optimizer updates (the norms' kernels are checked through the layers in
//! `tests/device_norm.rs`). Without a GPU every test prints
//! `skipped: no CUDA device (…)` and passes.

mod cuda_common;

use cuda_common::{assert_close, cpu_rand, dense, download, tol, upload, FLOATS};
use leangrad::cuda::layers_conv::{self as conv, ConvGeom};
use leangrad::cuda::layers_mask as mask;
use leangrad::cuda::layers_misc::{self as misc, GradMap};
use leangrad::nn;
use leangrad::optim::{apply_update, Adam, GradTransform, Sgd};
use leangrad::{Device, Tensor};

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
            let want_mask = leangrad::cpu::positive_mask(&x).unwrap();
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
        let want = leangrad::cpu::positive_mask(&x).unwrap();
        assert_eq!(pm.to_vec::<u32>().unwrap(), want.to_vec::<u32>().unwrap());
    }
}

#[test]
fn conv_matches_the_cpu_in_chunks() {
    let dev = cuda_or_skip!("conv");
    for dtype in FLOATS {
        let t = tol(dtype) * 8.0;
        let x = cpu_rand(&[3, 4, 7, 8], -1.0, 1.0, dtype, 16);
        let w = cpu_rand(&[6, 2, 3, 2], -1.0, 1.0, dtype, 17);
        let b = cpu_rand(&[6], -1.0, 1.0, dtype, 18);
        let opts = nn::Conv2dOptions {
            stride: [2, 1],
            padding: [1, 1],
            dilation: [1, 2],
            groups: 2,
        };
        let g = ConvGeom::new(3, 4, [7, 8], 6, [3, 2], [2, 1], [1, 1], [1, 2], 2).unwrap();
        let (xl, wl, bl) = (leaf(&x), leaf(&w), leaf(&b));
        let yc = nn::conv2d(&xl, &wl, Some(&bl), &opts).unwrap();
        let gy = cpu_rand(yc.shape(), -1.0, 1.0, dtype, 19);
        let want = grads(&yc, &gy, &[&xl, &wl, &bl]);
        let (gx, gw, gb, ggy) = (
            upload(&dev, &x),
            upload(&dev, &w),
            upload(&dev, &b),
            upload(&dev, &gy),
        );
        // a 1-byte budget forces one item per chunk; the default takes all
        for budget in [1, conv::LARGE_WORKSPACE_BYTES] {
            let y = conv::conv_forward(&gx, &gw, Some(&gb), &g, budget).unwrap();
            assert_close("conv y", &download(&y), &vals(&yc), t);
            let dx = conv::conv_input_grad(&ggy, &gw, &g, budget).unwrap();
            assert_close("conv dx", &download(&dx), &want[0], t);
            let dw = conv::conv_weight_grad(&ggy, &gx, &g, budget).unwrap();
            assert_close("conv dw", &download(&dw), &want[1], t);
        }
        let db = misc::channel_sum(&ggy, 3, 6, g.l()).unwrap();
        assert_close("conv db", &download(&db), &want[2], t);
        // 1-d
        let x1 = cpu_rand(&[2, 3, 10], -1.0, 1.0, dtype, 20);
        let w1 = cpu_rand(&[4, 3, 3], -1.0, 1.0, dtype, 21);
        let o1 = nn::Conv1dOptions {
            stride: 2,
            padding: 1,
            dilation: 1,
            groups: 1,
        };
        let y1 = nn::conv1d(&x1, &w1, None, &o1).unwrap();
        let g1 = ConvGeom::conv1d(2, 3, 10, 4, 3, 2, 1, 1, 1).unwrap();
        let y =
            conv::conv_forward(&upload(&dev, &x1), &upload(&dev, &w1), None, &g1, 1 << 20).unwrap();
        assert_close("conv1d y", &download(&y), &vals(&y1), t);
    }
}

#[test]
fn optimizer_updates_match_the_cpu_bit_for_bit() {
    let dev = cuda_or_skip!("optim");
    for dtype in FLOATS {
        let p0 = cpu_rand(&[300], -1.0, 1.0, dtype, 27);
        let grads: Vec<Tensor> = (0..3)
            .map(|i| cpu_rand(&[300], -1.0, 1.0, dtype, 28 + i))
            .collect();
        // SGD with momentum, nesterov and weight decay
        let mut sgd = Sgd::new(0.1);
        (sgd.momentum, sgd.weight_decay, sgd.nesterov) = (0.9, 0.01, true);
        let p = p0.to_dtype(dtype).unwrap();
        let buf = Tensor::zeros(&[300], dtype, Device::Cpu).unwrap();
        let (mut gp, mut gbuf) = (upload(&dev, &p0), upload(&dev, &buf));
        let hp = misc::SgdParams {
            lr: sgd.lr,
            momentum: sgd.momentum,
            dampening: sgd.dampening,
            weight_decay: sgd.weight_decay,
            nesterov: sgd.nesterov,
            maximize: sgd.maximize,
        };
        for (step, g) in grads.iter().enumerate() {
            let step = step as u64 + 1;
            apply_update(
                &sgd,
                step,
                &p,
                g,
                GradTransform::Scale(0.5),
                std::slice::from_ref(&buf),
            )
            .unwrap();
            misc::sgd_update(
                &mut gp,
                &upload(&dev, g),
                Some(&mut gbuf),
                step,
                &hp,
                GradMap::Scale(0.5),
            )
            .unwrap();
            assert_eq!(download(&gp), vals(&p), "sgd {dtype:?} step {step}");
        }
        // AdamW with amsgrad
        let mut adam = Adam::new(0.01);
        (adam.weight_decay, adam.decoupled_weight_decay, adam.amsgrad) = (0.1, true, true);
        let p = p0.to_dtype(dtype).unwrap();
        let st: Vec<Tensor> = (0..3)
            .map(|_| Tensor::zeros(&[300], dtype, Device::Cpu).unwrap())
            .collect();
        let mut gp = upload(&dev, &p0);
        let (mut m, mut v, mut vm) = (
            upload(&dev, &st[0]),
            upload(&dev, &st[1]),
            upload(&dev, &st[2]),
        );
        let hp = misc::AdamParams {
            lr: adam.lr,
            beta1: adam.beta1,
            beta2: adam.beta2,
            eps: adam.eps,
            weight_decay: adam.weight_decay,
            decoupled_weight_decay: adam.decoupled_weight_decay,
            amsgrad: adam.amsgrad,
            maximize: adam.maximize,
        };
        for (step, g) in grads.iter().enumerate() {
            let step = step as u64 + 1;
            apply_update(&adam, step, &p, g, GradTransform::ClampAbs(0.7), &st).unwrap();
            misc::adam_update(
                &mut gp,
                &upload(&dev, g),
                &mut m,
                &mut v,
                Some(&mut vm),
                step,
                &hp,
                GradMap::ClampAbs(0.7),
            )
            .unwrap();
            assert_eq!(download(&gp), vals(&p), "adam {dtype:?} step {step}");
        }
    }
}
