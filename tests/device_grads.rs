//! The backwards of the foundation ops written once for every device (a
//! companion of `tests/device_ops.rs`, split off to keep files small): the
//! gradient kernels of the unary ops, clamp, maximum/minimum (NaN, ties,
//! broadcasting), max/min along a dim (ties, U8 and U32 indices),
//! scatter_add's source gradient, mse_loss and mean. `check_layer` compares
//! every device with the CPU (outputs, gradients, saved bytes, both save
//! policies); the `*_values` tests assert exact values on every device.
//! Without a GPU the CUDA half prints `skipped: no CUDA device`.

mod cuda_common;
mod device_common;

use device_common::{check, check_layer, fresh_copy, input, FLOATS};
use leangrad::ops::Reduction;
use leangrad::{DType, Device, Result, Tensor};

/// A unary op under test.
type UnaryFn = fn(&Tensor) -> Result<Tensor>;

/// `values` as a CPU tensor of `shape` and `dtype`.
fn from(values: &[f64], shape: &[usize], dtype: DType) -> Tensor {
    Tensor::from_f64_slice(values, shape, dtype, Device::Cpu).unwrap()
}

/// Small integers (so that many elements tie), `n` of them from `seed`.
fn ties(n: usize, seed: usize) -> Vec<f64> {
    (0..n).map(|i| ((i * 7 + seed) % 5) as f64 - 2.0).collect()
}

/// The gradient of `sum(f(x))` w.r.t. `x` on `dev`, on the host.
fn grad_of(x: &Tensor, dev: Device, f: impl Fn(&Tensor) -> Result<Tensor>) -> Vec<f64> {
    let leaf = x.to_device(dev).unwrap().set_requires_grad(true).unwrap();
    f(&leaf).unwrap().sum_all().unwrap().backward().unwrap();
    leaf.grad().expect("a gradient").to_f64_vec().unwrap()
}

#[test]
fn unary_backwards_run_their_grad_kernels() {
    let on_positive: [(&str, UnaryFn); 7] = [
        ("sqrt", |t| t.sqrt()),
        ("log", |t| t.log()),
        ("recip", |t| t.recip()),
        ("powf 1.5", |t| t.powf(1.5)),
        ("powf -0.7", |t| t.powf(-0.7)),
        ("powf 0", |t| t.powf(0.0)),
        ("powf 0.1 (not a half value)", |t| t.powf(0.1)),
    ];
    let on_any: [(&str, UnaryFn); 13] = [
        ("neg", |t| t.neg()),
        ("exp", |t| t.exp()),
        ("abs", |t| t.abs()),
        ("square", |t| t.square()),
        ("sin", |t| t.sin()),
        ("cos", |t| t.cos()),
        ("tanh", |t| t.tanh()),
        ("sigmoid", |t| t.sigmoid()),
        ("silu", |t| t.silu()),
        ("gelu", |t| t.gelu(false)),
        ("gelu tanh", |t| t.gelu(true)),
        ("powf 2", |t| t.powf(2.0)),
        ("tanh(sigmoid)", |t| t.sigmoid()?.tanh()),
    ];
    for dtype in FLOATS {
        // 65 elements (odd), and their transposes read in place.
        let pos = input(&[5, 13], dtype, 61, 0.2, 2.0);
        let any = input(&[5, 13], dtype, 62, -3.0, 3.0);
        for (x, ops) in [(&pos, &on_positive[..]), (&any, &on_any[..])] {
            for &(name, f) in ops {
                check_layer(name, &[x], |t| f(&t[0]));
                check_layer(&format!("{name} of a transpose"), &[x], |t| f(&t[0].t()?));
            }
        }
    }
}

#[test]
fn unary_gradient_values() {
    for dev in cuda_common::devices("unary gradient values") {
        // abs: gradient 0 at ±0, the sign elsewhere.
        let x = from(&[-1.5, 0.0, 2.0, -0.0, 0.25], &[5], DType::F32);
        let g = grad_of(&x, dev, |t| t.abs());
        assert_eq!(g, [-1.0, 0.0, 1.0, 0.0, 1.0], "abs on {dev}");
        // powf(0): gradient exactly 0, even at 0.
        let g = grad_of(&x, dev, |t| t.powf(0.0));
        assert_eq!(g, [0.0; 5], "powf 0 on {dev}");
        // square and sqrt: 2x and 1/(2√x), exact in f32 here.
        let g = grad_of(&x, dev, |t| t.square());
        assert_eq!(g, [-3.0, 0.0, 4.0, -0.0, 0.5], "square on {dev}");
        let y = from(&[4.0, 0.25, 1.0], &[3], DType::F32);
        assert_eq!(grad_of(&y, dev, |t| t.sqrt()), [0.25, 1.0, 0.5]);
        // gelu'(0) = 1/2 in both forms; tanh'(0) = 1.
        let z = from(&[0.0], &[1], DType::F64);
        assert_eq!(grad_of(&z, dev, |t| t.gelu(false)), [0.5]);
        assert_eq!(grad_of(&z, dev, |t| t.gelu(true)), [0.5]);
        assert_eq!(grad_of(&z, dev, |t| t.tanh()), [1.0]);
    }
}

#[test]
fn clamp_forward_with_nan_and_rounded_bounds() {
    for dtype in FLOATS {
        let mut v = input(&[3, 11], dtype, 63, -1.0, 1.0).to_f64_vec().unwrap();
        v[4] = f64::NAN;
        v[20] = 40.0; // (the harness compares finite values or NaN)
        let x = from(&v, &[3, 11], dtype);
        // Bounds that round differently in f16/bf16 than in f32.
        check("clamp", &[&x], |t| t[0].clamp(-0.3, 0.7));
        check("clamp of a transpose", &[&x], |t| t[0].t()?.clamp(0.1, 0.1));
        check("clamp, one side", &[&x], |t| {
            t[0].clamp(f64::NEG_INFINITY, 0.3)
        });
        check("clamp, other side", &[&x], |t| {
            t[0].clamp(-0.2, f64::INFINITY)
        });
    }
    for dev in cuda_common::devices("clamp values") {
        let x = Tensor::from_f64_slice(&[f64::NAN, -2.0, 0.5, 3.0], &[4], DType::F32, dev);
        let y = x.unwrap().clamp(0.0, 1.0).unwrap().to_f64_vec().unwrap();
        assert!(y[0].is_nan(), "NaN passes through clamp on {dev}");
        assert_eq!(&y[1..], [0.0, 0.5, 1.0], "clamp on {dev}");
    }
}

#[test]
fn maximum_minimum_with_ties_nan_and_broadcasting() {
    for dtype in FLOATS {
        let mut va = ties(4 * 9, 1);
        va[3] = f64::NAN;
        let mut vb = ties(3, 2);
        vb[1] = f64::NAN;
        let a = from(&va, &[4, 1, 9], dtype);
        let b = from(&vb, &[3, 1], dtype);
        let c = from(&ties(9 * 4, 3), &[9, 4], dtype);
        check_layer("maximum", &[&a, &b], |t| t[0].maximum(&t[1]));
        check_layer("minimum", &[&a, &b], |t| t[0].minimum(&t[1]));
        check_layer("maximum of a transpose", &[&a, &c], |t| {
            t[0].maximum(&t[1].t()?.reshape(&[4, 1, 9])?)
        });
        check_layer("minimum, same shape", &[&c, &c], |t| {
            t[0].minimum(&t[1].mul_scalar(0.5)?)
        });
    }
    for dev in cuda_common::devices("maximum values") {
        let a = [f64::NAN, 1.0, 2.0, -0.0, 5.0];
        let b = [0.0, f64::NAN, 2.0, 0.0, -1.0];
        let (a, b) = (from(&a, &[5], DType::F32), from(&b, &[5], DType::F32));
        let (a, b) = (a.to_device(dev).unwrap(), b.to_device(dev).unwrap());
        let hi = a.maximum(&b).unwrap().to_f64_vec().unwrap();
        let lo = a.minimum(&b).unwrap().to_f64_vec().unwrap();
        assert!(
            hi[0].is_nan() && hi[1].is_nan(),
            "maximum propagates NaN on {dev}"
        );
        assert!(
            lo[0].is_nan() && lo[1].is_nan(),
            "minimum propagates NaN on {dev}"
        );
        assert_eq!((hi[2], hi[4], lo[2], lo[4]), (2.0, 5.0, 2.0, -1.0));
        // Ties of -0 and +0: maximum keeps a (-0), minimum keeps b (+0).
        assert!(
            hi[3] == 0.0 && hi[3].is_sign_negative(),
            "max(-0, 0) on {dev}"
        );
        assert!(
            lo[3] == 0.0 && lo[3].is_sign_positive(),
            "min(-0, 0) on {dev}"
        );
        // A tie splits the gradient in halves; NaN sends it all to b.
        let x = a.set_requires_grad(true).unwrap();
        x.maximum(&b)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        let g = x.grad().expect("a gradient").to_f64_vec().unwrap();
        assert_eq!(g, [0.0, 0.0, 0.5, 0.5, 1.0], "maximum's gradient on {dev}");
    }
}

#[test]
fn max_min_along_a_dim_with_ties() {
    for dtype in FLOATS {
        let x = from(&ties(4 * 7 * 5, 4), &[4, 7, 5], dtype);
        check_layer("max dim 1", &[&x], |t| t[0].max(1, false));
        check_layer("min dim 2 keepdim", &[&x], |t| t[0].min(2, true));
        check_layer("max dim 0 of a transpose", &[&x], |t| {
            t[0].transpose(0, 2)?.max(0, false)
        });
        check_layer("min of a 1-d tensor", &[&x], |t| {
            t[0].reshape(&[140])?.min(0, false)
        });
        // Lanes of 300 (U32 indices).
        let long = from(&ties(3 * 300, 5), &[3, 300], dtype);
        check_layer("max over 300", &[&long], |t| t[0].max(1, true));
    }
    // Integer tensors: values and indices exactly as on the CPU.
    for dtype in [DType::U8, DType::U32, DType::I64] {
        let v: Vec<f64> = ties(4 * 7 * 5, 6).iter().map(|t| t + 2.0).collect();
        let x = from(&v, &[4, 7, 5], dtype);
        check("argmax of integers", &[&x], |t| t[0].argmax(1, false));
        check("argmin of integers", &[&x], |t| t[0].argmin(2, true));
        check("max of integers", &[&x], |t| t[0].max(0, false));
        check("min of a transpose", &[&x], |t| {
            t[0].transpose(0, 2)?.min(1, true)
        });
    }
    for dev in cuda_common::devices("max along a dim values") {
        // u32/i64 values that a float would round together.
        for dtype in [DType::U32, DType::I64] {
            let x = Tensor::from_f64_slice(&[16_777_216.0, 16_777_217.0, 3.0], &[3], dtype, dev);
            let x = x.unwrap();
            assert_eq!(x.argmax(0, false).unwrap().to_f64_vec().unwrap(), [1.0]);
            assert_eq!(
                x.max(0, false).unwrap().to_f64_vec().unwrap(),
                [16_777_217.0]
            );
        }
        // The value is the chosen element itself: -0 stays -0, NaN wins.
        let z = Tensor::from_f64_slice(&[-0.0, 0.0, f64::NAN, 1.0], &[2, 2], DType::F32, dev);
        let z = z.unwrap().max(1, false).unwrap().to_f64_vec().unwrap();
        assert!(
            z[0] == 0.0 && z[0].is_sign_negative(),
            "max(-0, 0) on {dev}"
        );
        assert!(z[1].is_nan(), "a NaN is the maximum on {dev}");
        let x = from(
            &[1.0, 3.0, 3.0, 2.0, 4.0, 4.0, 0.0, 4.0],
            &[2, 4],
            DType::F32,
        );
        // The first of tied maxima gets the whole gradient.
        let g = grad_of(&x, dev, |t| t.max(1, false));
        assert_eq!(g, [0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0], "max on {dev}");
        let g = grad_of(&x, dev, |t| t.min(0, false));
        assert_eq!(g, [1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0], "min on {dev}");
    }
}

#[test]
fn scatter_add_source_gradient() {
    let idx: Vec<i64> = (0..5 * 4 * 3).map(|i| (i * 7 % 5) as i64).collect();
    let gi = Tensor::from_vec(idx, &[5, 4, 3], Device::Cpu).unwrap();
    let idx1: Vec<u32> = (0..5 * 2 * 3).map(|i| (i * 3 % 7) as u32).collect();
    let gi1 = Tensor::from_vec(idx1, &[5, 2, 3], Device::Cpu).unwrap();
    for dtype in FLOATS {
        let x = input(&[5, 7, 3], dtype, 64, -1.0, 1.0);
        let src = input(&[5, 4, 3], dtype, 65, -1.0, 1.0);
        let wide = input(&[6, 5, 4], dtype, 66, -1.0, 1.0);
        let gi = &gi;
        // The index is made inside each run, a fresh copy in the run's
        // ledger on every device: scatter_add saves it for the source's
        // gradient, and `to_device` onto the CPU would share the caller's
        // storage (counted outside the ledger) while CUDA uploads a copy.
        check_layer("scatter_add", &[&x, &src], move |t| {
            t[0].scatter_add(0, &fresh_copy(gi, t[0].device()), &t[1])
        });
        // src larger than the index: the uncovered part gets zeros.
        check_layer("scatter_add, src larger", &[&x, &wide], move |t| {
            t[0].scatter_add(0, &fresh_copy(gi, t[0].device()), &t[1])
        });
        let gi1 = &gi1;
        let tall = input(&[4, 5, 5], dtype, 69, -1.0, 1.0);
        check_layer(
            "scatter_add dim 1, u32, transposed src",
            &[&x, &tall],
            move |t| {
                let s = t[1].transpose(0, 2)?;
                t[0].scatter_add(1, &fresh_copy(gi1, t[0].device()), &s)
            },
        );
    }
    for dev in cuda_common::devices("scatter_add gradient values") {
        let x = Tensor::zeros(&[2, 3], DType::F32, dev).unwrap();
        let index = Tensor::from_vec(vec![2i64, 0], &[1, 2], dev).unwrap();
        let w = from(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3], DType::F32);
        let src = Tensor::ones(&[2, 3], DType::F32, dev).unwrap();
        let src = src.set_requires_grad(true).unwrap();
        let y = x.scatter_add(1, &index, &src).unwrap();
        y.mul(&w.to_device(dev).unwrap())
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        let g = src.grad().expect("a gradient").to_f64_vec().unwrap();
        assert_eq!(g, [3.0, 1.0, 0.0, 0.0, 0.0, 0.0], "on {dev}");
    }
}

#[test]
fn mse_loss_and_mean_backwards() {
    for dtype in FLOATS {
        let a = input(&[7, 9], dtype, 67, -1.0, 1.0);
        let b = input(&[9, 7], dtype, 68, -1.0, 1.0);
        for reduction in [Reduction::Mean, Reduction::Sum, Reduction::None] {
            check_layer(&format!("mse_loss {reduction:?}"), &[&a, &b], |t| {
                t[0].mse_loss(&t[1].t()?, reduction)
            });
        }
        check_layer("mean", &[&a], |t| t[0].mean(&[1], false));
        check_layer("mean of all", &[&b], |t| t[0].t()?.mean(&[], true));
    }
}

#[test]
fn narrow_backward_writes_a_strided_window() {
    for dtype in FLOATS {
        let x = input(&[5, 9], dtype, 71, -1.0, 1.0);
        // Columns 2..7 of each row: the gradient window is not contiguous.
        check_layer("narrow columns", &[&x], |t| t[0].narrow(1, 2, 5)?.exp());
        // Rows of a transpose: strided too.
        check_layer("narrow of a transpose", &[&x], |t| {
            t[0].t()?.narrow(0, 1, 3)?.mul_scalar(3.0)
        });
    }
}

#[test]
fn relu_family_keeps_nan() {
    for dtype in FLOATS {
        let x = from(
            &[f64::NAN, -1.5, 0.0, 2.0, f64::NAN, 3.0, -0.25],
            &[7],
            dtype,
        );
        check_layer("relu with NaN", &[&x], |t| t[0].relu());
        check_layer("leaky_relu with NaN", &[&x], |t| t[0].leaky_relu(0.1));
        let y = x.relu().unwrap().to_f64_vec().unwrap();
        assert!(
            y[0].is_nan() && y[4].is_nan(),
            "relu(NaN) is NaN on the CPU: {y:?}"
        );
    }
}
