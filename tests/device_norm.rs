//! Batch, layer, group and RMS norm written once for every device: on each
//! device from `cuda_common::devices` every layer's output, gradients and
//! saved bytes equal the CPU's for every requires-grad combination of input,
//! weight and bias under both save policies (f32, f16, bf16; odd sizes;
//! views; train and eval), and batch norm's running statistics after a
//! training step equal the CPU's (which equal a hand computation). Without
//! a GPU the CUDA half prints `skipped: no CUDA device`.

mod cuda_common;
mod device_common;

use device_common::{assert_close, check_layer, check_layer_with, input, FLOATS};
use leangrad::autograd::SavePolicy;
use leangrad::nn::{
    batch_norm, group_norm, layer_norm, rms_norm, BatchNorm, BatchNormOptions, GroupNorm,
    LayerNorm, Module, RMSNorm,
};
use leangrad::{DType, Device, Result, Tensor};

#[test]
fn layer_norm_matches_the_cpu() {
    for dtype in FLOATS {
        let x = input(&[3, 5, 7], dtype, 1, -2.0, 2.0);
        let w = input(&[7], dtype, 2, 0.5, 1.5);
        let b = input(&[7], dtype, 3, -0.5, 0.5);
        check_layer("layer_norm affine", &[&x, &w, &b], |t| {
            layer_norm(&t[0], &[7], Some(&t[1]), Some(&t[2]), 1e-5)
        });
        check_layer("layer_norm weight only", &[&x, &w], |t| {
            layer_norm(&t[0], &[7], Some(&t[1]), None, 1e-5)
        });
        check_layer("layer_norm no affine, 2 dims", &[&x], |t| {
            layer_norm(&t[0], &[5, 7], None, None, 1e-5)
        });
        // A transposed view of the input: copied densely on the way in.
        let xt = input(&[3, 7, 5], dtype, 4, -2.0, 2.0);
        check_layer("layer_norm of a view", &[&xt, &w, &b], |t| {
            layer_norm(&t[0].transpose(1, 2)?, &[7], Some(&t[1]), Some(&t[2]), 1e-5)
        });
        // The module (parameters are ones and zeros, made on the device).
        check_layer("LayerNorm module", &[&x], |t| {
            let m = LayerNorm::builder(&[7])
                .name("ln")
                .dtype(dtype)
                .build(&t[0].device())?;
            m.forward(&t[0])
        });
    }
}

#[test]
fn rms_norm_matches_the_cpu() {
    for dtype in FLOATS {
        let x = input(&[4, 9], dtype, 5, -2.0, 2.0);
        let w = input(&[9], dtype, 6, 0.5, 1.5);
        check_layer("rms_norm", &[&x, &w], |t| {
            rms_norm(&t[0], &[9], Some(&t[1]), Some(1e-6))
        });
        check_layer("rms_norm no weight, default eps", &[&x], |t| {
            rms_norm(&t[0], &[9], None, None)
        });
        // [3, 2, 5] seen as [2, 3, 5], normalised over its last two dims.
        let x3 = input(&[3, 2, 5], dtype, 7, -2.0, 2.0);
        let w2 = input(&[3, 5], dtype, 8, 0.5, 1.5);
        check_layer("rms_norm over 2 dims of a view", &[&x3, &w2], |t| {
            rms_norm(&t[0].transpose(0, 1)?, &[3, 5], Some(&t[1]), Some(1e-6))
        });
        check_layer("RMSNorm module", &[&x], |t| {
            let m = RMSNorm::builder(&[9])
                .name("rms")
                .eps(Some(1e-6))
                .dtype(dtype)
                .build(&t[0].device())?;
            m.forward(&t[0])
        });
    }
}

#[test]
fn group_norm_matches_the_cpu() {
    for dtype in FLOATS {
        let x = input(&[3, 6, 5], dtype, 9, -2.0, 2.0);
        let w = input(&[6], dtype, 10, 0.5, 1.5);
        let b = input(&[6], dtype, 11, -0.5, 0.5);
        check_layer("group_norm 3 groups", &[&x, &w, &b], |t| {
            group_norm(&t[0], 3, Some(&t[1]), Some(&t[2]), 1e-5)
        });
        let x4 = input(&[2, 4, 3, 3], dtype, 12, -2.0, 2.0);
        let w4 = input(&[4], dtype, 13, 0.5, 1.5);
        check_layer("group_norm 2d, weight only", &[&x4, &w4], |t| {
            group_norm(&t[0], 2, Some(&t[1]), None, 1e-5)
        });
        check_layer("group_norm no affine, one group per channel", &[&x4], |t| {
            group_norm(&t[0], 4, None, None, 1e-5)
        });
        check_layer("group_norm of a view", &[&x4, &w4], |t| {
            group_norm(&t[0].transpose(2, 3)?, 1, Some(&t[1]), None, 1e-5)
        });
        check_layer("GroupNorm module", &[&x], |t| {
            let m = GroupNorm::builder(3, 6)
                .name("gn")
                .dtype(dtype)
                .build(&t[0].device())?;
            m.forward(&t[0])
        });
    }
}

#[test]
fn f64_norms_match_the_cpu() {
    // f64 statistics (S = 8 bytes) on every device; sums in another order
    // than the CPU's leave ~1e-15 relative differences.
    let policies = [SavePolicy::Lean, SavePolicy::SaveAll];
    let x = input(&[3, 4, 5], DType::F64, 23, -2.0, 2.0);
    let w = input(&[4], DType::F64, 24, 0.5, 1.5);
    let b = input(&[4], DType::F64, 25, -0.5, 0.5);
    let w5 = input(&[5], DType::F64, 26, 0.5, 1.5);
    check_layer_with("layer_norm f64", &policies, &[&x, &w5], 1e-9, |t| {
        layer_norm(&t[0], &[5], Some(&t[1]), None, 1e-5)
    });
    check_layer_with("group_norm f64", &policies, &[&x, &w, &b], 1e-9, |t| {
        group_norm(&t[0], 2, Some(&t[1]), Some(&t[2]), 1e-5)
    });
    for train in [true, false] {
        check_layer_with("batch_norm f64", &policies, &[&x, &w, &b], 1e-9, |t| {
            let (rm, rv) = running(4, DType::F64, t[0].device())?;
            let (w, b) = (Some(&t[1]), Some(&t[2]));
            batch_norm(&t[0], Some(&rm), Some(&rv), w, b, train, 0.1, 1e-5)
        });
    }
}

#[test]
fn large_statistics_match_the_cpu() {
    // Statistics of more than 4096 elements are summed on CUDA in pieces
    // joined by a second kernel; rows whose length is not a multiple of 4
    // put pieces and runs across rows. f64 inputs far from zero check the
    // variance's join (squared deviations about each piece's own mean) at
    // a tight tolerance.
    let policies = [SavePolicy::Lean, SavePolicy::SaveAll];
    for (dtype, lo, t) in [(DType::F32, -2.0, 1e-5), (DType::F64, 1000.0, 1e-9)] {
        let hi = lo + 4.0;
        for shape in [[2, 3, 64, 64], [3, 2, 45, 45]] {
            let c = shape[1];
            let x = input(&shape, dtype, 31, lo, hi);
            let w = input(&[c], dtype, 32, 0.5, 1.5);
            let b = input(&[c], dtype, 33, -0.5, 0.5);
            for train in [true, false] {
                let name = format!("batch_norm {shape:?} {dtype:?} training {train}");
                check_layer_with(&name, &policies, &[&x, &w, &b], t, |t| {
                    let (rm, rv) = running(c, dtype, t[0].device())?;
                    let (w, b) = (Some(&t[1]), Some(&t[2]));
                    batch_norm(&t[0], Some(&rm), Some(&rv), w, b, train, 0.1, 1e-5)
                });
            }
            check_layer_with(
                &format!("group_norm {shape:?} {dtype:?}"),
                &policies,
                &[&x, &w],
                t,
                |t| group_norm(&t[0], 1, Some(&t[1]), None, 1e-5),
            );
        }
        let rows = input(&[2, 9001], dtype, 34, lo, hi);
        let wr = input(&[9001], dtype, 35, 0.5, 1.5);
        check_layer_with(
            &format!("layer_norm 9001 {dtype:?}"),
            &policies,
            &[&rows, &wr],
            t,
            |t| layer_norm(&t[0], &[9001], Some(&t[1]), None, 1e-5),
        );
        check_layer_with(
            &format!("rms_norm 9001 {dtype:?}"),
            &policies,
            &[&rows, &wr],
            t,
            |t| rms_norm(&t[0], &[9001], Some(&t[1]), Some(1e-6)),
        );
    }
}

/// Running statistics of `c` channels on `dev` (not requiring grad).
fn running(c: usize, dtype: DType, dev: Device) -> Result<(Tensor, Tensor)> {
    let m: Vec<f64> = (0..c).map(|i| 0.1 * i as f64 - 0.2).collect();
    let v: Vec<f64> = (0..c).map(|i| 0.5 + 0.25 * i as f64).collect();
    Ok((
        Tensor::from_f64_slice(&m, &[c], dtype, dev)?,
        Tensor::from_f64_slice(&v, &[c], dtype, dev)?,
    ))
}

#[test]
fn batch_norm_matches_the_cpu() {
    for dtype in FLOATS {
        // BatchNorm1d over [N, C], [N, C, L] and BatchNorm2d over [N, C, H, W].
        for shape in [vec![5, 3], vec![4, 3, 7], vec![3, 3, 5, 3]] {
            let x = input(&shape, dtype, 14, -2.0, 2.0);
            let w = input(&[3], dtype, 15, 0.5, 1.5);
            let b = input(&[3], dtype, 16, -0.5, 0.5);
            let name = |s: &str| format!("batch_norm {s} {shape:?}");
            for train in [true, false] {
                let mode = if train { "train" } else { "eval" };
                check_layer(&name(&format!("{mode} affine")), &[&x, &w, &b], |t| {
                    let (rm, rv) = running(3, dtype, t[0].device())?;
                    let (w, b) = (Some(&t[1]), Some(&t[2]));
                    batch_norm(&t[0], Some(&rm), Some(&rv), w, b, train, 0.1, 1e-5)
                });
                check_layer(&name(&format!("{mode} weight only")), &[&x, &w], |t| {
                    let (rm, rv) = running(3, dtype, t[0].device())?;
                    batch_norm(
                        &t[0],
                        Some(&rm),
                        Some(&rv),
                        Some(&t[1]),
                        None,
                        train,
                        0.1,
                        1e-5,
                    )
                });
                check_layer(&name(&format!("{mode} no affine")), &[&x], |t| {
                    let (rm, rv) = running(3, dtype, t[0].device())?;
                    batch_norm(&t[0], Some(&rm), Some(&rv), None, None, train, 0.1, 1e-5)
                });
            }
            check_layer(&name("train without running stats"), &[&x, &w, &b], |t| {
                batch_norm(&t[0], None, None, Some(&t[1]), Some(&t[2]), true, 0.1, 1e-5)
            });
        }
        // Channels last as a view of the input.
        let xv = input(&[2, 5, 4, 3], dtype, 17, -2.0, 2.0);
        let w = input(&[3], dtype, 18, 0.5, 1.5);
        check_layer("batch_norm of a view", &[&xv, &w], |t| {
            let x = t[0].permute(&[0, 3, 1, 2])?;
            batch_norm(&x, None, None, Some(&t[1]), None, true, 0.1, 1e-5)
        });
        // Modules: eval mode with model-state weight and running variance
        // saves nothing for the input gradient; train mode updates state.
        let x2 = input(&[3, 4, 5, 3], dtype, 19, -2.0, 2.0);
        for train in [true, false] {
            check_layer(
                &format!("BatchNorm2d module, training {train}"),
                &[&x2],
                |t| {
                    let opts = BatchNormOptions::default();
                    let mut m = BatchNorm::builder(4)
                        .name("bn")
                        .options(opts)
                        .dtype(dtype)
                        .build2d(&t[0].device())?;
                    m.set_training(train);
                    m.forward(&t[0])
                },
            );
        }
    }
}

/// Host reference of one train step's running statistics over `[N, C, S]`
/// values: `(1 − m)·r + m·mean` and `(1 − m)·v + m·unbiased var`.
fn expected_running(x: &[f64], shape: [usize; 3], rm: &[f64], rv: &[f64], m: f64) -> Vec<f64> {
    let [n, c, s] = shape;
    let cnt = (n * s) as f64;
    let mut out = Vec::new();
    for ch in 0..c {
        let vals: Vec<f64> = (0..n)
            .flat_map(|i| (0..s).map(move |j| (i * c + ch) * s + j))
            .map(|k| x[k])
            .collect();
        let mean = vals.iter().sum::<f64>() / cnt;
        let var = vals.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / (cnt - 1.0);
        out.push((1.0 - m) * rm[ch] + m * mean);
        out.push((1.0 - m) * rv[ch] + m * var);
    }
    out
}

#[test]
fn batch_norm_running_statistics_match_the_cpu() {
    for dtype in FLOATS {
        let x = input(&[4, 3, 5], dtype, 20, -2.0, 2.0);
        let tol = device_common::tol(dtype);
        let mut cpu: Option<(Tensor, Tensor)> = None;
        for dev in cuda_common::devices("batch_norm running statistics") {
            let (rm, rv) = running(3, dtype, dev).unwrap();
            let xd = x.to_device(dev).unwrap();
            batch_norm(&xd, Some(&rm), Some(&rv), None, None, true, 0.1, 1e-5).unwrap();
            let (rm, rv) = (
                rm.to_device(Device::Cpu).unwrap(),
                rv.to_device(Device::Cpu).unwrap(),
            );
            match &cpu {
                None => {
                    let (rm0, rv0) = running(3, dtype, Device::Cpu).unwrap();
                    let want = expected_running(
                        &x.to_f64_vec().unwrap(),
                        [4, 3, 5],
                        &rm0.to_f64_vec().unwrap(),
                        &rv0.to_f64_vec().unwrap(),
                        0.1,
                    );
                    let (gm, gv) = (rm.to_f64_vec().unwrap(), rv.to_f64_vec().unwrap());
                    for ch in 0..3 {
                        for (got, w) in [(gm[ch], want[2 * ch]), (gv[ch], want[2 * ch + 1])] {
                            assert!((got - w).abs() <= 2.0 * tol * w.abs(), "{got} vs {w}");
                        }
                    }
                    cpu = Some((rm, rv));
                }
                Some((cm, cv)) => {
                    assert_close(&format!("running mean on {dev}"), cm, &rm);
                    assert_close(&format!("running var on {dev}"), cv, &rv);
                }
            }
        }
    }
}

#[test]
fn batch_norm_module_state_matches_the_cpu() {
    // Two cumulative-average steps (momentum None) then an eval step: the
    // running statistics and `num_batches_tracked` equal the CPU's.
    let opts = BatchNormOptions {
        momentum: None,
        ..BatchNormOptions::default()
    };
    for dtype in FLOATS {
        let x1 = input(&[3, 2, 4, 3], dtype, 21, -2.0, 2.0);
        let x2 = input(&[3, 2, 4, 3], dtype, 22, -1.0, 3.0);
        let mut cpu: Option<Vec<Tensor>> = None;
        for dev in cuda_common::devices("BatchNorm module state") {
            let mut m = BatchNorm::builder(2)
                .name("bn")
                .options(opts)
                .dtype(dtype)
                .build2d(&dev)
                .unwrap();
            m.forward(&x1.to_device(dev).unwrap()).unwrap();
            m.forward(&x2.to_device(dev).unwrap()).unwrap();
            m.set_training(false);
            let y = m.forward(&x1.to_device(dev).unwrap()).unwrap();
            let state: Vec<Tensor> = [
                m.running_mean.clone().unwrap(),
                m.running_var.clone().unwrap(),
                m.num_batches_tracked.clone().unwrap(),
                y,
            ]
            .iter()
            .map(|t| t.to_device(Device::Cpu).unwrap())
            .collect();
            assert_eq!(
                state[2].to_f64_vec().unwrap(),
                vec![2.0],
                "batches on {dev}"
            );
            match &cpu {
                None => {
                    // The cumulative average of two steps: the mean of the
                    // two batch means (from zeros, factors 1 then 1/2).
                    let mean = |x: &Tensor| {
                        let v = x.to_f64_vec().unwrap();
                        (0..2)
                            .map(|ch| {
                                let s: f64 = (0..3)
                                    .flat_map(|i| (0..12).map(move |j| (i * 2 + ch) * 12 + j))
                                    .map(|k| v[k])
                                    .sum();
                                s / 36.0
                            })
                            .collect::<Vec<f64>>()
                    };
                    let (m1, m2) = (mean(&x1), mean(&x2));
                    let got = state[0].to_f64_vec().unwrap();
                    for ch in 0..2 {
                        let w = (m1[ch] + m2[ch]) / 2.0;
                        let t = 2.0 * device_common::tol(dtype);
                        assert!((got[ch] - w).abs() <= t * w.abs().max(0.1), "{got:?}");
                    }
                    cpu = Some(state);
                }
                Some(want) => {
                    for (i, (w, g)) in want.iter().zip(&state).enumerate() {
                        assert_close(&format!("state {i} on {dev}"), w, g);
                    }
                }
            }
        }
    }
}

/// One run of a BatchNorm(3) followed by a ReLU in place on a copy of `x`
/// on `dev` (see `batch_norm_with_relu_equals_the_two_ops`): the output,
/// the gradients of `sum(out · gy)` for the input, weight and bias where
/// they need grad (on the host), the bytes saved for backward and the
/// ledger's peak.
fn bn_relu_run(
    dev: Device,
    x: &Tensor,
    (train, params, x_grad): (bool, bool, bool),
    policy: SavePolicy,
    fused: bool,
) -> (Vec<f64>, Vec<Option<Vec<f64>>>, usize, usize) {
    use leangrad::autograd::{no_grad, with_buffer_reuse, with_save_policy};
    use leangrad::memory::{Category, Ledger};
    use leangrad::nn::ReLU;
    let ledger = Ledger::new();
    let _in = ledger.enter();
    let (_policy, _reuse) = (with_save_policy(policy), with_buffer_reuse(true));
    let values = x.to_f64_vec().unwrap();
    let leaf = Tensor::from_f64_slice(&values, x.shape(), x.dtype(), dev)
        .and_then(|t| t.set_requires_grad(x_grad))
        .unwrap();
    let mut bn = BatchNorm::builder(3)
        .name("bn")
        .dtype(x.dtype())
        .build2d(&dev)
        .unwrap();
    if !train {
        // Running statistics moved by one training pass.
        let _ng = no_grad();
        bn.forward(&leaf.mul_scalar(1.5).unwrap().add_scalar(0.25).unwrap())
            .unwrap();
        bn.set_training(false);
    }
    if !params {
        bn.weight = bn.weight.take().map(|w| w.detach());
        bn.bias = bn.bias.take().map(|b| b.detach());
    }
    // A tensor nothing else holds, as a convolution's output.
    let h = leaf.mul_scalar(2.0).unwrap();
    let out = if fused {
        bn.forward_relu_owned(h).unwrap()
    } else {
        ReLU { inplace: true }
            .forward_owned(bn.forward_owned(h).unwrap())
            .unwrap()
    };
    let saved = ledger.live_in(dev, Category::Saved);
    let gy = Tensor::rand_range(out.shape(), -1.0, 1.0, out.dtype(), Device::Cpu, 99)
        .and_then(|t| t.to_device(dev))
        .unwrap();
    out.mul(&gy).unwrap().sum_all().unwrap().backward().unwrap();
    let grad = |t: Option<&Tensor>| t.and_then(|t| t.grad()).map(|g| g.to_f64_vec().unwrap());
    let grads = vec![
        grad(Some(&leaf)),
        grad(bn.weight.as_ref()),
        grad(bn.bias.as_ref()),
    ];
    let peak = ledger.peak(dev);
    (out.to_f64_vec().unwrap(), grads, saved, peak)
}

/// `BatchNorm::forward_relu_owned` (on CUDA under the lean policy the norm's
/// kernel applies the ReLU and makes its mask) gives what a BatchNorm
/// followed by an in-place ReLU gives: on every device the same output and
/// gradients (input, weight, bias) bit for bit, the same saved bytes and
/// ledger peak as the two ops there and as the CPU, and the CPU's values
/// within tolerance. Train and eval mode, trainable and frozen weight and
/// bias, input needing grad or not, both policies, every float dtype;
/// 2·3·5·7 elements (a mask word and a run cut short).
#[test]
fn batch_norm_with_relu_equals_the_two_ops() {
    for dtype in [DType::F32, DType::F16, DType::BF16, DType::F64] {
        let x = input(&[2, 3, 5, 7], dtype, 31, -2.0, 2.0);
        for case in [
            (true, true, true),
            (true, true, false),
            (true, false, true),
            (false, true, true),
            (false, false, true),
            (false, true, false),
        ] {
            for policy in [SavePolicy::Lean, SavePolicy::SaveAll] {
                let what = format!("{dtype:?} (train, params, x) {case:?} {policy:?}");
                let (want, want_grads, want_saved, want_peak) =
                    bn_relu_run(Device::Cpu, &x, case, policy, true);
                assert_eq!(
                    want.iter().copied().fold(0.0, f64::min),
                    0.0,
                    "{what}: a ReLU"
                );
                for dev in cuda_common::devices(&what) {
                    let two = bn_relu_run(dev, &x, case, policy, false);
                    let one = bn_relu_run(dev, &x, case, policy, true);
                    assert_eq!(one.0, two.0, "{what} on {dev}: output");
                    assert_eq!(one.1, two.1, "{what} on {dev}: gradients");
                    assert_eq!(
                        (one.2, one.3),
                        (two.2, two.3),
                        "{what} on {dev}: saved, peak"
                    );
                    assert_eq!(
                        (one.2, one.3),
                        (want_saved, want_peak),
                        "{what} on {dev}: vs the CPU"
                    );
                    let t = device_common::tol(dtype) * 4.0;
                    let close = |w: &[f64], g: &[f64], part: &str| {
                        let big = w.iter().fold(0.0f64, |m, v| m.max(v.abs()));
                        for (i, (a, b)) in w.iter().zip(g).enumerate() {
                            let ok = (a - b).abs() <= t * a.abs().max(1e-3 * big);
                            assert!(ok, "{what} on {dev}: {part} {i}: cpu {a} vs {b}");
                        }
                    };
                    close(&want, &one.0, "output");
                    for (w, g) in want_grads.iter().zip(&one.1) {
                        assert_eq!(w.is_some(), g.is_some(), "{what} on {dev}: which grads");
                        if let (Some(w), Some(g)) = (w, g) {
                            close(w, g, "gradient");
                        }
                    }
                }
            }
        }
    }
}
