//! Unary float ops and activations: values, gradients, and what they save.
mod common;
use common::*;
use leangrad::autograd::{backward_with, no_grad, CollectGrads};
use leangrad::memory::{Category, Ledger};
use leangrad::{DType, Device, Tensor};
use std::f64::consts::{E, LN_2};
use std::slice::from_ref;

fn t32(v: &[f32]) -> Tensor {
    Tensor::from_vec(v.to_vec(), &[v.len()], Device::Cpu).unwrap()
}

fn vals(t: &Tensor) -> Vec<f64> {
    t.to_f64_vec().unwrap()
}

const X: [f32; 5] = [-1.0, 0.0, 0.5, 1.0, 2.0];

#[test]
fn exact_values_f32() {
    let x = t32(&X);
    assert_eq!(
        x.neg().unwrap().to_vec::<f32>().unwrap(),
        vec![1.0, -0.0, -0.5, -1.0, -2.0]
    );
    assert_eq!(
        x.abs().unwrap().to_vec::<f32>().unwrap(),
        vec![1.0, 0.0, 0.5, 1.0, 2.0]
    );
    assert_eq!(
        x.square().unwrap().to_vec::<f32>().unwrap(),
        vec![1.0, 0.0, 0.25, 1.0, 4.0]
    );
    assert_eq!(
        x.relu().unwrap().to_vec::<f32>().unwrap(),
        vec![0.0, 0.0, 0.5, 1.0, 2.0]
    );
    assert_eq!(
        x.leaky_relu(0.5).unwrap().to_vec::<f32>().unwrap(),
        vec![-0.5, 0.0, 0.5, 1.0, 2.0]
    );
    assert_eq!(
        t32(&[0.5, 2.0, -4.0])
            .recip()
            .unwrap()
            .to_vec::<f32>()
            .unwrap(),
        vec![2.0, 0.5, -0.25]
    );
    assert_eq!(
        t32(&[0.0, 4.0, 9.0])
            .sqrt()
            .unwrap()
            .to_vec::<f32>()
            .unwrap(),
        vec![0.0, 2.0, 3.0]
    );
    assert_eq!(
        t32(&[2.0, 4.0]).powf(1.5).unwrap().to_vec::<f32>().unwrap()[1],
        8.0
    );
    let tol = 1e-6;
    assert_close(
        &vals(&x.exp().unwrap()),
        &[
            0.36787944117144233,
            1.0,
            1.6487212707001282,
            E,
            7.38905609893065,
        ],
        tol,
    );
    assert_close(
        &vals(&t32(&[1.0, 2.0, 0.5]).log().unwrap()),
        &[0.0, LN_2, -LN_2],
        tol,
    );
    assert_close(
        &vals(&x.sin().unwrap()),
        &[
            -0.8414709848078965,
            0.0,
            0.479425538604203,
            0.8414709848078965,
            0.9092974268256817,
        ],
        tol,
    );
    assert_close(
        &vals(&x.cos().unwrap()),
        &[
            0.5403023058681398,
            1.0,
            0.8775825618903728,
            0.5403023058681398,
            -0.4161468365471424,
        ],
        tol,
    );
    assert_close(
        &vals(&x.tanh().unwrap()),
        &[
            -0.7615941559557649,
            0.0,
            0.46211715726000974,
            0.7615941559557649,
            0.9640275800758169,
        ],
        tol,
    );
    assert_close(
        &vals(&x.sigmoid().unwrap()),
        &[
            0.2689414213699951,
            0.5,
            0.6224593312018546,
            0.7310585786300049,
            0.8807970779778823,
        ],
        tol,
    );
    assert_close(
        &vals(&x.silu().unwrap()),
        &[
            -0.2689414213699951,
            0.0,
            0.3112296656009273,
            0.7310585786300049,
            1.7615941559557646,
        ],
        tol,
    );
    assert_close(
        &vals(&x.gelu(false).unwrap()),
        &[
            -0.15865525393145707,
            0.0,
            0.34573123063700656,
            0.8413447460685429,
            1.9544997361036416,
        ],
        tol,
    );
    assert_close(
        &vals(&x.gelu(true).unwrap()),
        &[
            -0.15880800939172324,
            0.0,
            0.34571400982514394,
            0.8411919906082768,
            1.954597694087775,
        ],
        tol,
    );
    assert_close(
        &vals(&t32(&[4.0, 0.25]).powf(-0.5).unwrap()),
        &[0.5, 2.0],
        tol,
    );
}

#[test]
fn f64_gelu_is_accurate() {
    let x = Tensor::from_vec(vec![-3.5f64, 1.0, 4.5], &[3], Device::Cpu).unwrap();
    // x·Φ(x) with Φ(-3.5) = 2.3262907903552504e-4, Φ(4.5) = 1 - 3.3976731247300615e-6.
    let want = [
        -3.5 * 2.3262907903552504e-4,
        0.8413447460685429,
        4.5 * (1.0 - 3.3976731247300615e-6),
    ];
    assert_close(&vals(&x.gelu(false).unwrap()), &want, 1e-13);
}

#[test]
fn half_precision_and_strided_inputs() {
    let x =
        Tensor::from_f64_slice(&[-1.0, 0.5, 2.0, 3.0], &[2, 2], DType::F16, Device::Cpu).unwrap();
    let y = x.t().unwrap().relu().unwrap();
    assert_eq!(y.dtype(), DType::F16);
    assert_eq!(vals(&y), vec![0.0, 2.0, 0.5, 3.0]);
    let b = Tensor::from_f64_slice(&[0.0, 1.0], &[2], DType::BF16, Device::Cpu).unwrap();
    assert_close(&vals(&b.exp().unwrap()), &[1.0, E], 1e-2);
}

#[test]
fn gradcheck_unary() {
    let x = rand64(&[3, 4], 11);
    let pos = rand64_in(&[3, 4], 0.5, 2.0, 12);
    let wide = rand64_in(&[2, 5], -3.0, 3.0, 13);
    check(|t| t[0].neg(), from_ref(&x));
    check(|t| t[0].exp(), from_ref(&x));
    check(|t| t[0].log(), from_ref(&pos));
    check(|t| t[0].sqrt(), from_ref(&pos));
    check(|t| t[0].abs(), from_ref(&x));
    check(|t| t[0].square(), from_ref(&x));
    check(|t| t[0].recip(), from_ref(&pos));
    check(|t| t[0].sin(), from_ref(&wide));
    check(|t| t[0].cos(), from_ref(&wide));
    check(|t| t[0].tanh(), from_ref(&wide));
    check(|t| t[0].sigmoid(), from_ref(&wide));
    check(|t| t[0].gelu(false), from_ref(&wide));
    check(|t| t[0].gelu(true), from_ref(&wide));
    check(|t| t[0].silu(), from_ref(&wide));
    check(|t| t[0].powf(2.5), from_ref(&pos));
    check(|t| t[0].powf(-1.5), from_ref(&pos));
    check(|t| t[0].powf(3.0), from_ref(&x));
    check(|t| t[0].relu(), from_ref(&x));
    check(|t| t[0].leaky_relu(0.1), from_ref(&x));
    check(|t| t[0].leaky_relu(-0.3), from_ref(&wide));
    // Strided input and chained ops.
    check(|t| t[0].t()?.tanh()?.relu()?.exp(), from_ref(&x));
    check(
        |t| {
            t[0].narrow(1, 1, 3)?
                .gelu(false)?
                .mul(&t[0].narrow(1, 0, 3)?.sigmoid()?)
        },
        &[wide],
    );
}

#[test]
fn special_gradients() {
    // abs has gradient 0 at 0; powf(0) has gradient 0; relu has gradient 0 at 0.
    let x = Tensor::from_vec(vec![-2.0f64, 0.0, 3.0], &[3], Device::Cpu)
        .unwrap()
        .set_requires_grad(true)
        .unwrap();
    for (y, want) in [
        (x.abs().unwrap(), vec![-1.0, 0.0, 1.0]),
        (x.powf(0.0).unwrap(), vec![0.0, 0.0, 0.0]),
        (x.relu().unwrap(), vec![0.0, 0.0, 1.0]),
        (x.leaky_relu(0.25).unwrap(), vec![0.25, 0.25, 1.0]),
        (x.square().unwrap(), vec![-4.0, 0.0, 6.0]),
    ] {
        x.zero_grad();
        backward_with(
            &y,
            Some(Tensor::ones(&[3], DType::F64, Device::Cpu).unwrap()),
            &mut CollectGrads,
        )
        .unwrap();
        assert_eq!(vals(&x.grad().unwrap()), want);
    }
}

/// Saved bytes of relu / leaky_relu are exactly one bit per element,
/// rounded up to whole u32 words, and the gradient is right.
#[test]
fn relu_saves_a_packed_bitmask() {
    for slope in [None, Some(0.1)] {
        for n in [1usize, 31, 32, 33, 1000] {
            let ledger = Ledger::new();
            let _g = ledger.enter();
            let x = Tensor::rand_range(&[n], -1.0, 1.0, DType::F32, Device::Cpu, n as u64).unwrap();
            let xv = x.to_vec::<f32>().unwrap();
            let x = x.set_requires_grad(true).unwrap();
            let y = match slope {
                None => x.relu().unwrap(),
                Some(s) => x.leaky_relu(s).unwrap(),
            };
            assert_eq!(
                ledger.live_in(Device::Cpu, Category::Saved),
                4 * n.div_ceil(32),
                "n = {n}, slope {slope:?}"
            );
            let g = Tensor::rand_range(&[n], 0.5, 1.5, DType::F32, Device::Cpu, 7).unwrap();
            let gv = g.to_vec::<f32>().unwrap();
            backward_with(&y, Some(g), &mut CollectGrads).unwrap();
            assert_eq!(ledger.live_in(Device::Cpu, Category::Saved), 0);
            let want: Vec<f32> = xv
                .iter()
                .zip(&gv)
                .map(|(&x, &g)| {
                    if x > 0.0 {
                        g
                    } else {
                        g * slope.unwrap_or(0.0) as f32
                    }
                })
                .collect();
            assert_eq!(x.grad().unwrap().to_vec::<f32>().unwrap(), want, "n = {n}");
        }
    }
}

#[test]
fn what_other_unary_ops_save() {
    let ledger = Ledger::new();
    let _g = ledger.enter();
    let saved = || ledger.live_in(Device::Cpu, Category::Saved);
    let x = Tensor::rand_range(&[10], 0.5, 1.0, DType::F32, Device::Cpu, 3)
        .unwrap()
        .set_requires_grad(true)
        .unwrap();
    let y = x.exp().unwrap(); // saves its output: 40 bytes
    assert_eq!(saved(), 40);
    let z = x.log().unwrap(); // saves its input: 40 more bytes
    assert_eq!(saved(), 80);
    let w = x.neg().unwrap(); // saves nothing
    assert_eq!(saved(), 80);
    drop((y, z, w));
    assert_eq!(saved(), 0);
    {
        let _ng = no_grad();
        let _r = x.relu().unwrap();
        let _s = x.sigmoid().unwrap();
        assert_eq!(saved(), 0);
    }
    let plain = x.detach();
    let _r = plain.tanh().unwrap();
    assert_eq!(saved(), 0);
}

#[test]
fn saved_output_modified_in_place_is_detected() {
    let x = rand64(&[4], 5).set_requires_grad(true).unwrap();
    let y = x.exp().unwrap();
    assert_err!(y.add_scalar_(1.0), InPlaceOnRequiresGrad);
    {
        let _ng = no_grad();
        y.add_scalar_(1.0).unwrap();
    }
    let g = Tensor::ones(&[4], DType::F64, Device::Cpu).unwrap();
    assert_err!(
        backward_with(&y, Some(g), &mut CollectGrads),
        SavedTensorModified
    );
}

#[test]
fn unary_errors() {
    let i = Tensor::zeros(&[3], DType::I64, Device::Cpu).unwrap();
    assert_err!(i.exp(), UnsupportedDType);
    assert_err!(i.relu(), UnsupportedDType);
    let u = Tensor::zeros(&[3], DType::U8, Device::Cpu).unwrap();
    assert_err!(u.gelu(true), UnsupportedDType);
    assert_err!(u.leaky_relu(0.1), UnsupportedDType);
}

/// `sign` as `torch.sign` (values printed by PyTorch 2.x for this input):
/// −1, 0, +1; ±0 and NaN give 0 (PyTorch computes `(0 < x) − (x < 0)`);
/// ±∞ give ±1. Its gradient is zero everywhere and it saves nothing.
#[test]
fn sign_matches_torch_sign_and_has_a_zero_gradient() {
    let v = [
        -0.0f32,
        0.0,
        f32::NAN,
        -2.0,
        3.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        1e-30,
        -1e-30,
    ];
    let want = [0.0, 0.0, 0.0, -1.0, 1.0, 1.0, -1.0, 1.0, -1.0];
    for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16] {
        let x = t32(&v).to_dtype(dtype).unwrap();
        let y = x.sign().unwrap();
        assert_eq!(y.dtype(), dtype);
        let got = vals(&y);
        // 1e-30 underflows to ±0 in f16 only.
        let expect: Vec<f64> = if dtype == DType::F16 {
            want[..7].iter().copied().chain([0.0, 0.0]).collect()
        } else {
            want.to_vec()
        };
        assert_eq!(got, expect, "{dtype:?}");
        // Exactly +0, never −0 (as PyTorch).
        assert!(got.iter().all(|g| *g != 0.0 || g.is_sign_positive()));
    }
    let ledger = Ledger::new();
    let _l = ledger.enter();
    let x = Tensor::from_vec(v.to_vec(), &[3, 3], Device::Cpu)
        .unwrap()
        .set_requires_grad(true)
        .unwrap();
    let y = x.sign().unwrap().mul_scalar(3.0).unwrap();
    assert!(y.requires_grad());
    assert_eq!(ledger.live_in(Device::Cpu, Category::Saved), 0);
    y.sum_all().unwrap().backward().unwrap();
    let g = x.grad().unwrap();
    assert_eq!(g.shape(), &[3, 3]);
    assert_eq!(vals(&g), vec![0.0; 9]);
    assert!(t32(&[1.0]).to_dtype(DType::I64).unwrap().sign().is_err());
}
