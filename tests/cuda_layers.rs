//! The layer kernels (`src/cuda/layers_*.rs`) against the CPU: relu mask
//! bits, dropout masks, pools, embedding, the attention softmax and
//! optimizer updates (the norms' kernels are checked through the layers in
//! `tests/device_norm.rs`). Without a GPU every test prints
//! `skipped: no CUDA device (…)` and passes.

mod cuda_common;

use cuda_common::{assert_close, cpu_rand, dense, download, tol, upload, FLOATS};
use leangrad::cuda::layers_mask as mask;
use leangrad::cuda::layers_misc::{self as misc, AttnMask};
use leangrad::cuda::layers_pool::{self as pool, AvgPoolMode, PoolGeom};
use leangrad::nn;
use leangrad::{DType, Device, Tensor};

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

#[test]
fn dropout_masks_replay_the_cpu_rule() {
    let dev = cuda_or_skip!("dropout");
    let (seed, offset, p, n) = (7u64, 1234u64, 0.3, 1000usize);
    let bits = mask::dropout_bits(&dev, seed, offset, p, n).unwrap();
    let want = leangrad::primitives::pack_bits(n, |i| {
        leangrad::rng::dropout_keep(seed, offset, i as u64, p)
    });
    assert_eq!(bits.to_vec::<u32>().unwrap(), want);
    for dtype in FLOATS {
        let x = cpu_rand(&[10, 100], -1.0, 1.0, dtype, 3);
        let gx = upload(&dev, &x);
        let scale = 1.0 / (1.0 - p);
        let fwd = mask::dropout_forward(&gx, &dense(&[10, 100]), seed, offset, p, scale).unwrap();
        let from_bits = mask::dropout_masked(&gx, &dense(&[10, 100]), &bits, scale).unwrap();
        let cpu = nn::dropout(&x, p, seed, offset).unwrap();
        assert_eq!(download(&fwd), vals(&cpu), "dropout {dtype:?}");
        assert_eq!(
            download(&from_bits),
            vals(&cpu),
            "dropout from bits {dtype:?}"
        );
    }
}

#[test]
fn pools_match_the_cpu() {
    let dev = cuda_or_skip!("pool");
    for dtype in FLOATS {
        let x = cpu_rand(&[2, 3, 9, 11], -1.0, 1.0, dtype, 4);
        let gx = upload(&dev, &x);
        let mut o = nn::MaxPool2dOptions::new([3, 2]);
        o.stride = Some([2, 2]);
        o.padding = [1, 1];
        o.dilation = [1, 2];
        let g = PoolGeom::new(6, 9, 11, [3, 2], [2, 2], [1, 1], [1, 2]).unwrap();
        let (y, pos) = pool::max_pool2d_forward(&gx, &g).unwrap();
        let xl = leaf(&x);
        let yc = nn::max_pool2d(&xl, &o).unwrap();
        assert_eq!(download(&y), vals(&yc), "max pool {dtype:?}");
        let gy = cpu_rand(yc.shape(), -1.0, 1.0, dtype, 5);
        let dx = pool::max_pool2d_backward(&upload(&dev, &gy), &pos, &g).unwrap();
        assert_eq!(
            download(&dx),
            grads(&yc, &gy, &[&xl])[0],
            "max pool bwd {dtype:?}"
        );
        for include in [false, true] {
            let mut o = nn::AvgPool2dOptions::new([3, 3]);
            o.stride = Some([2, 2]);
            o.padding = [1, 1];
            o.count_include_pad = include;
            let g = PoolGeom::new(6, 9, 11, [3, 3], [2, 2], [1, 1], [1, 1]).unwrap();
            let mode = if include {
                AvgPoolMode::FixedCountPad
            } else {
                AvgPoolMode::Fixed
            };
            let xl = leaf(&x);
            let yc = nn::avg_pool2d(&xl, &o).unwrap();
            let y = pool::avg_pool2d_forward(&gx, &g, mode).unwrap();
            assert_eq!(download(&y), vals(&yc), "avg pool {dtype:?} {include}");
            let gy = cpu_rand(yc.shape(), -1.0, 1.0, dtype, 6);
            let dx = pool::avg_pool2d_backward(&upload(&dev, &gy), &g, mode).unwrap();
            assert_eq!(
                download(&dx),
                grads(&yc, &gy, &[&xl])[0],
                "avg bwd {dtype:?}"
            );
        }
        let g = PoolGeom::adaptive(6, 9, 11, 4, 3).unwrap();
        let xl = leaf(&x);
        let yc = nn::adaptive_avg_pool2d(&xl, [4, 3]).unwrap();
        let y = pool::avg_pool2d_forward(&gx, &g, AvgPoolMode::Adaptive).unwrap();
        assert_eq!(download(&y), vals(&yc), "adaptive {dtype:?}");
        let gy = cpu_rand(yc.shape(), -1.0, 1.0, dtype, 7);
        let dx = pool::avg_pool2d_backward(&upload(&dev, &gy), &g, AvgPoolMode::Adaptive).unwrap();
        assert_eq!(
            download(&dx),
            grads(&yc, &gy, &[&xl])[0],
            "adaptive bwd {dtype:?}"
        );
    }
}

#[test]
fn embedding_matches_the_cpu_bit_for_bit() {
    let dev = cuda_or_skip!("embedding");
    let idx = [3usize, 1, 3, 0, 5, 3, 1, 2];
    let it = Tensor::from_vec(
        idx.iter().map(|&i| i as i64).collect(),
        &[2, 4],
        Device::Cpu,
    )
    .unwrap();
    for dtype in FLOATS {
        let w = cpu_rand(&[6, 5], -1.0, 1.0, dtype, 22);
        let wl = leaf(&w);
        let yc = nn::embedding(&wl, &it, Some(1)).unwrap();
        let y = misc::embedding_forward(&upload(&dev, &w), 6, 5, &idx).unwrap();
        assert_eq!(download(&y), vals(&yc), "embedding {dtype:?}");
        let gy = cpu_rand(yc.shape(), -1.0, 1.0, dtype, 23);
        let dw = misc::embedding_backward(&upload(&dev, &gy), &idx, 6, 5, Some(1)).unwrap();
        assert_eq!(
            download(&dw),
            grads(&yc, &gy, &[&wl])[0],
            "embedding bwd {dtype:?}"
        );
    }
    assert!(misc::embedding_forward(
        &upload(&dev, &cpu_rand(&[6, 5], 0.0, 1.0, DType::F32, 1)),
        6,
        5,
        &[6]
    )
    .is_err());
}

#[test]
fn attention_softmax_matches_a_reference() {
    let dev = cuda_or_skip!("attention");
    let (rows, lq, lk, scale) = (2 * 3usize, 3usize, 4usize, 0.5);
    for dtype in FLOATS {
        let t = tol(dtype) * 4.0;
        let s = cpu_rand(&[rows, lk], -2.0, 2.0, dtype, 24);
        let sv = vals(&s);
        let mask = cpu_rand(&[lq, lk], -1.0, 0.0, dtype, 25);
        let mv = vals(&mask);
        let gs = upload(&dev, &s);
        let gm = upload(&dev, &mask);
        for causal in [false, true] {
            let (p, lse) =
                misc::attention_probs(&gs, lq, lk, scale, causal, AttnMask::Float(&gm, lq), None)
                    .unwrap();
            let mut want = vec![0.0; rows * lk];
            for r in 0..rows {
                let x: Vec<f64> = (0..lk)
                    .map(|j| {
                        if causal && j > r % lq {
                            f64::NEG_INFINITY
                        } else {
                            scale * sv[r * lk + j] + mv[r % lq * lk + j]
                        }
                    })
                    .collect();
                let mx = x.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let sum: f64 = x.iter().map(|v| (v - mx).exp()).sum();
                for j in 0..lk {
                    want[r * lk + j] = (x[j] - mx).exp() / sum;
                }
            }
            assert_close("attention P", &download(&p), &want, t);
            let (p2, _) = misc::attention_probs(
                &gs,
                lq,
                lk,
                scale,
                causal,
                AttnMask::Float(&gm, lq),
                Some(lse),
            )
            .unwrap();
            assert_eq!(download(&p2), download(&p), "P recomputed from lse");
            let dp = cpu_rand(&[rows, lk], -1.0, 1.0, dtype, 26);
            let ds = misc::attention_softmax_grad(&p, &upload(&dev, &dp), lk, scale).unwrap();
            let (pv, dv) = (download(&p), vals(&dp));
            let want: Vec<f64> = (0..rows * lk)
                .map(|k| {
                    let r = k / lk;
                    let dot: f64 = (0..lk).map(|j| pv[r * lk + j] * dv[r * lk + j]).sum();
                    scale * pv[k] * (dv[k] - dot)
                })
                .collect();
            assert_close("attention dS", &download(&ds), &want, t);
        }
    }
}
