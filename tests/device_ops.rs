//! The foundation ops written once for every device: on each device from
//! `cuda_common::devices` (the CPU always, CUDA 0 when present) every op's
//! result equals the CPU's within per-dtype tolerances (f32 1e-5 relative,
//! f16/bf16 1e-2), Philox numbers are bit-identical, a small MLP's
//! gradients match, and the CUDA ledger's peak equals the CPU's byte for
//! byte. Without a GPU the CUDA half prints `skipped: no CUDA device`.

mod cuda_common;
mod device_common;

use device_common::{check, check_layer, check_layer_under, fresh_copy, input, FLOATS};
use leangrad::memory::Ledger;
use leangrad::ops::CrossEntropyOptions;
use leangrad::{DType, Device, Error, Result, Tensor};

/// A unary op under test.
type UnaryFn = fn(&Tensor) -> Result<Tensor>;

#[test]
fn creation_and_copies_match_the_cpu() {
    for dev in cuda_common::devices("creation") {
        for dtype in [DType::F32, DType::F64, DType::BF16, DType::I64, DType::U8] {
            let v: Vec<f64> = (0..37).map(|i| (i % 11) as f64).collect();
            let made = [
                Tensor::zeros(&[3, 5], dtype, dev).unwrap(),
                Tensor::ones(&[4], dtype, dev).unwrap(),
                Tensor::full(&[2, 3], 7.0, dtype, dev).unwrap(),
                Tensor::from_f64_slice(&v, &[37], dtype, dev).unwrap(),
                Tensor::arange(9, dtype, dev).unwrap(),
            ];
            let cpu = [
                Tensor::zeros(&[3, 5], dtype, Device::Cpu).unwrap(),
                Tensor::ones(&[4], dtype, Device::Cpu).unwrap(),
                Tensor::full(&[2, 3], 7.0, dtype, Device::Cpu).unwrap(),
                Tensor::from_f64_slice(&v, &[37], dtype, Device::Cpu).unwrap(),
                Tensor::arange(9, dtype, Device::Cpu).unwrap(),
            ];
            for (m, c) in made.iter().zip(&cpu) {
                assert_eq!(m.device(), dev);
                assert_eq!(m.to_f64_vec().unwrap(), c.to_f64_vec().unwrap());
            }
        }
        let x = Tensor::from_vec((0..24).map(|i| i as f32).collect(), &[2, 3, 4], dev).unwrap();
        // A strided view copied to the host and back keeps its values.
        let t = x.transpose(0, 2).unwrap();
        let back = t.to_device(Device::Cpu).unwrap().to_device(dev).unwrap();
        assert_eq!(back.to_vec::<f32>().unwrap(), t.to_vec::<f32>().unwrap());
        assert_eq!(back.to_device(Device::Cpu).unwrap().device(), Device::Cpu);
    }
}

#[test]
fn philox_numbers_are_bit_identical() {
    for dev in cuda_common::devices("philox") {
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            for n in [1usize, 7, 1000, 4099] {
                let u = Tensor::rand(&[n], dtype, dev, 42).unwrap();
                let c = Tensor::rand(&[n], dtype, Device::Cpu, 42).unwrap();
                assert_eq!(
                    u.to_f64_vec().unwrap(),
                    c.to_f64_vec().unwrap(),
                    "rand {dtype:?}"
                );
                let z = Tensor::randn(&[n], dtype, dev, 7).unwrap();
                let c = Tensor::randn(&[n], dtype, Device::Cpu, 7).unwrap();
                assert_eq!(
                    z.to_f64_vec().unwrap(),
                    c.to_f64_vec().unwrap(),
                    "randn {dtype:?}"
                );
            }
        }
    }
}

#[test]
fn host_access_and_mixed_devices_are_typed_errors() {
    for dev in cuda_common::devices("typed errors") {
        let x = Tensor::ones(&[3], DType::F32, dev).unwrap();
        if dev == Device::Cpu {
            continue;
        }
        assert!(x.storage().cpu().is_err(), "host read of device memory");
        let c = Tensor::ones(&[3], DType::F32, Device::Cpu).unwrap();
        assert!(matches!(x.add(&c), Err(Error::DeviceMismatch { .. })));
        // clamp runs on the device (it used to be NotOnCuda).
        let y = x.clamp(0.0, 0.5).unwrap();
        assert_eq!(y.device(), dev);
        assert_eq!(y.to_f64_vec().unwrap(), [0.5; 3]);
    }
}

#[test]
fn unary_and_scalar_ops() {
    for dtype in FLOATS {
        let x = input(&[3, 5, 17], dtype, 1, 0.1, 2.0);
        let xt = x.transpose(0, 2).unwrap();
        let ops: [(&str, UnaryFn); 14] = [
            ("neg", |t| t.neg()),
            ("exp", |t| t.exp()),
            ("log", |t| t.log()),
            ("sqrt", |t| t.sqrt()),
            ("square", |t| t.square()),
            ("tanh", |t| t.tanh()),
            ("sigmoid", |t| t.sigmoid()),
            ("silu", |t| t.silu()),
            ("gelu", |t| t.gelu(false)),
            ("powf", |t| t.powf(1.5)),
            ("add_scalar", |t| t.add_scalar(0.25)),
            ("mul_scalar", |t| t.mul_scalar(-3.0)),
            ("scalar_sub", |t| t.scalar_sub(1.0)),
            ("contiguous", |t| t.contiguous()),
        ];
        for (name, f) in ops {
            check(name, &[&x], |t| f(&t[0]));
            check(name, &[&xt], |t| f(&t[0]));
        }
    }
}

/// `sign` on every device equals the CPU's (which equals `torch.sign`),
/// including ±0, NaN and ±∞ (all 0 but ±∞), on a strided view too, and its
/// gradient is zero everywhere.
#[test]
fn sign_matches_the_cpu() {
    for dtype in FLOATS {
        let mut v = input(&[3, 5, 17], dtype, 4, -2.0, 2.0)
            .to_f64_vec()
            .unwrap();
        let specials = [0.0, -0.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY];
        for (i, s) in specials.iter().enumerate() {
            v[7 * i] = *s;
        }
        let x = Tensor::from_f64_slice(&v, &[3, 5, 17], dtype, Device::Cpu).unwrap();
        check("sign", &[&x], |t| t[0].sign());
        check("sign of a transpose", &[&x], |t| {
            t[0].transpose(0, 2)?.sign()
        });
        check_layer("sign", &[&x], |t| t[0].sign()?.add(&t[0]));
    }
}

/// `format!("{t}")` reads device values: the CPU's text plus PyTorch's
/// `device='cuda:0'` suffix.
#[test]
fn display_prints_device_values() {
    let x = input(&[2, 3], DType::F32, 5, -2.0, 2.0);
    let on_cpu = format!("{x}");
    for dev in cuda_common::devices("display") {
        let shown = format!("{}", x.to_device(dev).unwrap());
        let want = match dev {
            Device::Cpu => on_cpu.clone(),
            _ => format!("{}, device='{dev}')", on_cpu.strip_suffix(')').unwrap()),
        };
        assert_eq!(shown, want);
    }
}

#[test]
fn binary_ops_broadcast_and_assign() {
    for dtype in FLOATS {
        let a = input(&[4, 1, 9], dtype, 2, -1.0, 1.0);
        let b = input(&[3, 1], dtype, 3, 0.5, 1.5);
        let ab = [&a, &b];
        check("add", &ab, |t| t[0].add(&t[1]));
        check("sub", &ab, |t| t[0].sub(&t[1]));
        check("mul", &ab, |t| t[0].mul(&t[1]));
        check("div", &ab, |t| t[0].div(&t[1]));
        check("maximum", &ab, |t| t[0].maximum(&t[1]));
        let d = input(&[4, 3, 9], dtype, 4, -1.0, 1.0);
        let db = [&d, &b];
        check("add_", &db, |t| {
            let acc = t[0].contiguous()?.mul_scalar(1.0)?;
            acc.add_(&t[1])?;
            Ok(acc)
        });
        check("mul_", &db, |t| {
            let acc = t[0].mul_scalar(1.0)?;
            acc.mul_(&t[1])?;
            acc.add_scalar_(0.5)?;
            Ok(acc)
        });
    }
}

#[test]
fn compare_where_and_cast() {
    let a = input(&[5, 7], DType::F32, 5, -1.0, 1.0);
    let b = input(&[7], DType::F32, 6, -1.0, 1.0);
    check("lt", &[&a, &b], |t| t[0].lt(&t[1]));
    check("ge_scalar", &[&a], |t| t[0].ge_scalar(0.1));
    check("where", &[&a, &b], |t| {
        Tensor::where_cond(&t[0].gt(&t[1])?, &t[0], &t[1])
    });
    for to in [DType::F64, DType::BF16, DType::F16, DType::I64, DType::U8] {
        check("cast", &[&a.mul_scalar(50.0).unwrap()], |t| {
            t[0].to_dtype(to)
        });
    }
}

#[test]
fn reductions_and_argmax() {
    for dtype in FLOATS {
        let x = input(&[6, 5, 13], dtype, 7, -2.0, 2.0);
        check("sum", &[&x], |t| t[0].sum(&[0, 2], false));
        check("sum_all", &[&x], |t| t[0].sum_all());
        check("mean", &[&x], |t| t[0].mean(&[1], true));
        check("max", &[&x], |t| t[0].max(2, false));
        check("min", &[&x], |t| t[0].min(0, true));
        check("argmax", &[&x], |t| t[0].argmax(1, false));
        let xt = x.transpose(0, 1).unwrap();
        check("sum of a view", &[&xt], |t| t[0].sum(&[1], true));
        // Over the rows of a row-major matrix (a bias gradient): more rows
        // than a block has slices, columns not a multiple of its 8, and a
        // window that starts inside a row.
        let rows = input(&[300, 37], dtype, 9, -2.0, 2.0);
        check("sum over rows", &[&rows], |t| t[0].sum(&[0], false));
        check("max over rows", &[&rows], |t| t[0].max(0, false));
        check("mean over rows of a window", &[&rows], |t| {
            t[0].narrow(1, 3, 30)?.mean(&[0], true)
        });
    }
}

#[test]
fn softmax_and_cross_entropy() {
    for dtype in FLOATS {
        let x = input(&[9, 11], dtype, 8, -3.0, 3.0);
        check("softmax", &[&x], |t| t[0].softmax(1));
        check("log_softmax", &[&x], |t| t[0].log_softmax(0));
        let targets = Tensor::from_vec(
            (0..9).map(|i| (i * 5 % 11) as i64).collect::<Vec<_>>(),
            &[9],
            Device::Cpu,
        )
        .unwrap();
        check("cross_entropy", &[&x, &targets], |t| {
            t[0].cross_entropy(&t[1], CrossEntropyOptions::default())
        });
    }
}

/// Cross-entropy's three reductions with an ignored target and label
/// smoothing, values and gradients (a per-sample incoming gradient for no
/// reduction); and a target out of range: an error at the call on the CPU,
/// at the next read from the device on CUDA (which reads nothing back on
/// the way), the device usable afterwards.
#[test]
fn cross_entropy_reductions_and_a_bad_target() {
    use leangrad::ops::Reduction;
    let x = input(&[7, 5], DType::F32, 21, -2.0, 2.0);
    let t: Vec<i64> = (0..7).map(|i| if i == 2 { -1 } else { i % 5 }).collect();
    let targets = Tensor::from_vec(t, &[7], Device::Cpu).unwrap();
    for reduction in [Reduction::Mean, Reduction::Sum, Reduction::None] {
        let opts = CrossEntropyOptions {
            reduction,
            ignore_index: -1,
            label_smoothing: 0.1,
        };
        let tg = targets.clone();
        // The targets made in the ledger of each run, as the probabilities.
        check_layer(&format!("cross_entropy {reduction:?}"), &[&x], move |t| {
            t[0].cross_entropy(&fresh_copy(&tg, t[0].device()), opts)
        });
    }
    let bad = Tensor::from_vec(vec![0i64, 5, 1, 2, 3, 4, 0], &[7], Device::Cpu).unwrap();
    let opts = CrossEntropyOptions::default();
    assert!(matches!(
        x.cross_entropy(&bad, opts),
        Err(Error::IndexOutOfRange {
            index: 5,
            size: 5,
            ..
        })
    ));
    for dev in cuda_common::devices("cross_entropy_bad_target") {
        if dev == Device::Cpu {
            continue;
        }
        let (xd, bd) = (x.to_device(dev).unwrap(), bad.to_device(dev).unwrap());
        let loss = xd.cross_entropy(&bd, opts).unwrap();
        // Another thread's read is not told: the problem is this thread's.
        let other = xd.clone();
        let read = std::thread::spawn(move || other.sum_all().and_then(|s| s.to_scalar()));
        assert!(read.join().unwrap().is_ok());
        match loss.to_scalar() {
            Err(Error::IndexOutOfRange { op, index, size }) => {
                assert_eq!((op, index, size), ("cross_entropy", 5, 5))
            }
            other => panic!("a bad target on {dev}: expected IndexOutOfRange, got {other:?}"),
        }
        // Reported once; the device goes on.
        let fine = Tensor::from_vec(vec![0i64, 1, 2, 3, 4, 0, 1], &[7], dev).unwrap();
        let good = xd.cross_entropy(&fine, opts).unwrap();
        assert!(good.to_scalar().unwrap().is_finite());
    }
}

/// The fused head and loss on every device, in chunks of 4 rows (the last
/// chunk has 1): loss, the gradients of h, W and b, and the saved bytes
/// (h and the targets) equal the CPU's.
#[test]
fn linear_cross_entropy_in_chunks() {
    for dtype in [DType::F32, DType::F64] {
        let h = input(&[9, 6], dtype, 11, -1.0, 1.0);
        let w = input(&[13, 6], dtype, 12, -1.0, 1.0);
        let b = input(&[13], dtype, 13, -0.5, 0.5);
        let targets = Tensor::from_vec(
            (0..9)
                .map(|i| if i == 4 { -100 } else { (i * 5 % 13) as i64 })
                .collect::<Vec<_>>(),
            &[9],
            Device::Cpu,
        )
        .unwrap();
        let opts = CrossEntropyOptions {
            label_smoothing: 0.1,
            ..CrossEntropyOptions::default()
        };
        check_layer("linear_cross_entropy", &[&h, &w, &b], |t| {
            // In this run's ledger on every device (a CPU `to_device`
            // would share the outer tensor).
            let targets = fresh_copy(&targets, t[0].device());
            t[0].linear_cross_entropy_in_chunks(&t[1], Some(&t[2]), &targets, opts, 4)
        });
    }
}

#[test]
fn matmul_layouts() {
    for dtype in FLOATS {
        let a = input(&[7, 13], dtype, 9, -1.0, 1.0);
        let b = input(&[13, 5], dtype, 10, -1.0, 1.0);
        check("matmul", &[&a, &b], |t| t[0].matmul(&t[1]));
        let bt = input(&[5, 13], dtype, 11, -1.0, 1.0);
        check("matmul transposed", &[&a, &bt], |t| t[0].matmul(&t[1].t()?));
        let batched = input(&[3, 7, 13], dtype, 12, -1.0, 1.0);
        check("matmul batched, shared rhs", &[&batched, &b], |t| {
            t[0].matmul(&t[1])
        });
        let narrow = input(&[7, 20], dtype, 13, -1.0, 1.0);
        check("matmul of a narrowed view", &[&narrow, &b], |t| {
            t[0].narrow(1, 2, 13)?.matmul(&t[1])
        });
    }
}

/// One forward and backward of a small MLP (matmul, add, softmax, matmul,
/// cross-entropy + sum) in a fresh ledger on `dev`: the loss, the
/// parameters' gradients (on the host) and the ledger's peak on `dev`.
fn mlp_step(dev: Device) -> (f64, Vec<Vec<f64>>, usize) {
    let ledger = Ledger::new();
    let _guard = ledger.enter();
    let param = |shape: &[usize], seed| {
        Tensor::rand_range(shape, -0.4, 0.4, DType::F32, dev, seed)
            .and_then(|t| t.set_requires_grad(true))
            .unwrap()
    };
    let (w1, b1, w2, b2) = (
        param(&[13, 32], 1),
        param(&[32], 2),
        param(&[32, 5], 3),
        param(&[5], 4),
    );
    let x = Tensor::randn(&[9, 13], DType::F32, dev, 5).unwrap();
    let targets: Vec<i64> = (0..9).map(|i| i % 5).collect();
    let targets = Tensor::from_vec(targets, &[9], dev).unwrap();
    let h = x.matmul(&w1).unwrap().add(&b1).unwrap().softmax(1).unwrap();
    let logits = h.matmul(&w2).unwrap().add(&b2).unwrap();
    let ce = logits
        .cross_entropy(&targets, CrossEntropyOptions::default())
        .unwrap();
    let loss = ce
        .add(&logits.sum_all().unwrap().mul_scalar(0.01).unwrap())
        .unwrap();
    let value = loss.to_scalar().unwrap();
    loss.backward().unwrap();
    let grads = [&w1, &b1, &w2, &b2]
        .iter()
        .map(|p| p.grad().expect("a gradient").to_f64_vec().unwrap())
        .collect();
    (value, grads, ledger.peak(dev))
}

#[test]
fn mlp_gradients_and_ledger_peak_match_the_cpu() {
    let (loss, grads, peak) = mlp_step(Device::Cpu);
    assert!(peak > 0);
    for dev in cuda_common::devices("mlp") {
        let (l, g, p) = mlp_step(dev);
        assert!((l - loss).abs() <= 1e-5 * loss.abs(), "loss {l} vs {loss}");
        for (i, (a, b)) in grads.iter().zip(&g).enumerate() {
            let big = a.iter().fold(0.0f64, |m, v| m.max(v.abs()));
            for (x, y) in a.iter().zip(b) {
                assert!(
                    (x - y).abs() <= 1e-5 * big.max(1e-6),
                    "grad {i}: {x} vs {y} on {dev}"
                );
            }
        }
        assert_eq!(p, peak, "ledger peak on {dev} vs the CPU's");
    }
}

#[test]
fn index_select_gather_scatter_add() {
    for dtype in FLOATS {
        let x = input(&[5, 7, 3], dtype, 14, -1.0, 1.0);
        let sel = Tensor::from_vec(vec![4i64, 0, 0, 6, 2], &[5], Device::Cpu).unwrap();
        let sel32 = Tensor::from_vec(vec![2u32, 1, 2], &[3], Device::Cpu).unwrap();
        check("index_select", &[&x, &sel], |t| t[0].index_select(1, &t[1]));
        check("index_select u32", &[&x, &sel32], |t| {
            t[0].index_select(0, &t[1])
        });
        let idx: Vec<i64> = (0..5 * 4 * 3).map(|i| (i * 7 % 5) as i64).collect();
        let gi = Tensor::from_vec(idx, &[5, 4, 3], Device::Cpu).unwrap();
        check("gather", &[&x, &gi], |t| t[0].gather(0, &t[1]));
        let src = input(&[5, 4, 3], dtype, 15, -1.0, 1.0);
        check("scatter_add", &[&x, &gi, &src], |t| {
            t[0].scatter_add(0, &t[1], &t[2])
        });
        let y = input(&[5, 2, 3], dtype, 16, -1.0, 1.0);
        check("cat", &[&x, &y], |t| {
            Tensor::cat(&[&t[0], &t[1].narrow(1, 1, 1)?, &t[1]], 1)
        });
        check("cat dim 0", &[&x, &x], |t| {
            Tensor::cat(
                &[
                    &t[0],
                    &t[1].transpose(0, 1)?.contiguous()?.reshape(&[5, 7, 3])?,
                ],
                0,
            )
        });
        check("index_select backward", &[&x, &sel], |t| {
            let leaf = t[0].clone().set_requires_grad(true)?;
            let w = Tensor::arange(15, t[0].dtype(), t[0].device())?.reshape(&[5, 1, 3])?;
            leaf.index_select(1, &t[1])?
                .mul(&w)?
                .sum_all()?
                .backward()?;
            Ok(leaf.grad().expect("a gradient"))
        });
        check("gather backward", &[&x, &gi], |t| {
            let leaf = t[0].clone().set_requires_grad(true)?;
            leaf.gather(0, &t[1])?.sum_all()?.backward()?;
            Ok(leaf.grad().expect("a gradient"))
        });
    }
}

#[test]
fn relu_leaky_relu_and_dropout_layers() {
    for dtype in FLOATS {
        // 77 elements: a partial last mask word; a transposed view too.
        let x = input(&[7, 11], dtype, 21, -1.0, 1.0);
        check_layer("relu", &[&x], |t| t[0].relu());
        check_layer("relu of a transpose", &[&x], |t| t[0].t()?.relu());
        check_layer("leaky_relu", &[&x], |t| t[0].leaky_relu(0.1));
        check_layer("relu(relu)", &[&x], |t| {
            t[0].relu()?.mul_scalar(2.0)?.relu()
        });
        // Owned, unshared operands (one kernel on CUDA under the lean
        // policy where the result needs grad), and a leaf (the plain path).
        let y = input(&[7, 11], dtype, 22, -1.0, 1.0);
        check_layer("add_relu_owned", &[&x, &y], |t| {
            t[0].mul_scalar(2.0)?.add_relu_owned(&t[1].mul_scalar(0.5)?)
        });
        check_layer("add_relu_owned of a leaf", &[&x, &y], |t| {
            t[0].clone().add_relu_owned(&t[1])
        });
        check_layer("dropout", &[&x], |t| {
            leangrad::nn::dropout(&t[0], 0.3, 5, 17)
        });
        check_layer("dropout of a transpose", &[&x], |t| {
            leangrad::nn::dropout(&t[0].t()?, 0.5, 9, 0)
        });
    }
}

#[test]
fn pool_layers() {
    use leangrad::autograd::SavePolicy;
    use leangrad::nn::{adaptive_avg_pool2d, avg_pool2d, max_pool2d};
    use leangrad::nn::{AvgPool2dOptions, MaxPool2dOptions};
    let max = MaxPool2dOptions {
        kernel: [3, 2],
        stride: Some([2, 1]),
        padding: [1, 1],
        dilation: [1, 2],
        ceil_mode: false,
    };
    let mut avg = AvgPool2dOptions::new([3, 3]);
    avg.stride = Some([2, 2]);
    avg.padding = [1, 1];
    let mut avg_pad = avg;
    avg_pad.count_include_pad = !avg.count_include_pad;
    for dtype in FLOATS {
        let x = input(&[2, 3, 7, 6], dtype, 41, -1.0, 1.0);
        // SaveAll keeps i64 flat indices, read on the host only: lean here.
        check_layer_under("max_pool2d", &[SavePolicy::Lean], &[&x], |t| {
            max_pool2d(&t[0], &max)
        });
        check_layer("avg_pool2d", &[&x], |t| avg_pool2d(&t[0], &avg));
        check_layer("avg_pool2d (other divisor)", &[&x], |t| {
            avg_pool2d(&t[0], &avg_pad)
        });
        check_layer("adaptive_avg_pool2d", &[&x], |t| {
            adaptive_avg_pool2d(&t[0], [3, 4])
        });
    }
}

#[test]
fn embedding_layer() {
    for dtype in FLOATS {
        let w = input(&[9, 5], dtype, 51, -1.0, 1.0);
        let idx = Tensor::from_vec(vec![3i64, 0, 8, 3, 3, 1, 7, 0], &[2, 4], Device::Cpu).unwrap();
        for padding in [None, Some(3)] {
            let (idx, tied_idx) = (idx.clone(), idx.clone());
            // A fresh copy of the indices in the run's ledger on every
            // device (saved when the table trains; `to_device` onto the CPU
            // would share the caller's storage, counted outside the ledger).
            check_layer("embedding", &[&w], move |t| {
                let idx = fresh_copy(&idx, t[0].device());
                leangrad::nn::embedding(&t[0], &idx, padding)
            });
            // Tied to an output head (GPT-2's `wte`): the head's gradient
            // reaches the table first and the embedding adds into it.
            let idx = tied_idx.clone();
            check_layer("embedding tied to its head", &[&w], move |t| {
                let idx = fresh_copy(&idx, t[0].device());
                let h = leangrad::nn::embedding(&t[0], &idx, padding)?;
                h.matmul(&t[0].t()?)
            });
        }
    }
}
