//! Reductions, softmax/log_softmax and losses: values, gradients, what is
//! saved, and errors.
mod common;
use common::*;
use leangrad::memory::{Category, Ledger};
use leangrad::ops::{CrossEntropyOptions, Reduction};
use leangrad::{DType, Device, Error, Tensor};

fn f64s(v: Vec<f64>, shape: &[usize]) -> Tensor {
    Tensor::from_vec(v, shape, Device::Cpu).unwrap()
}

fn i64s(v: Vec<i64>, shape: &[usize]) -> Tensor {
    Tensor::from_vec(v, shape, Device::Cpu).unwrap()
}

/// The values of a result, as f64.
fn vals(t: leangrad::Result<Tensor>) -> Vec<f64> {
    t.unwrap().to_f64_vec().unwrap()
}

/// The single value of a result.
fn one(t: leangrad::Result<Tensor>) -> f64 {
    t.unwrap().to_scalar().unwrap()
}

/// Sum of a row-major `shape` array over the dims in `mask`, naively.
fn naive_sum(v: &[f64], shape: &[usize], mask: &[bool]) -> Vec<f64> {
    let out_shape: Vec<usize> = shape
        .iter()
        .zip(mask)
        .map(|(&d, &m)| if m { 1 } else { d })
        .collect();
    let mut out = vec![0.0; out_shape.iter().product()];
    for (i, x) in v.iter().enumerate() {
        let (mut rem, mut o, mut stride) = (i, 0, 1);
        for d in (0..shape.len()).rev() {
            let idx = rem % shape[d];
            rem /= shape[d];
            if !mask[d] {
                o += idx * stride;
                stride *= shape[d];
            }
        }
        out[o] += x;
    }
    out
}

#[test]
fn sum_and_mean_values() {
    let x = Tensor::arange(24, DType::F32, Device::Cpu)
        .unwrap()
        .reshape(&[2, 3, 4])
        .unwrap();
    let s = x.sum(&[1], false).unwrap();
    assert_eq!(s.shape(), &[2, 4]);
    assert_eq!(
        s.to_vec::<f32>().unwrap(),
        vec![12., 15., 18., 21., 48., 51., 54., 57.]
    );
    assert_eq!(x.sum(&[-1], true).unwrap().shape(), &[2, 3, 1]);
    assert_eq!(vals(x.sum(&[0, 2], false)), vec![60., 92., 124.]);
    assert_eq!(x.sum_all().unwrap().shape(), &[] as &[usize]);
    assert_eq!(one(x.sum_all()), 276.0);
    assert_eq!(one(x.mean_all()), 11.5);
    assert_eq!(vals(x.mean(&[0], false))[..3], [6., 7., 8.]);
    assert_eq!(
        vals(x.transpose(0, 2).unwrap().sum(&[0], false)),
        vec![6., 54., 22., 70., 38., 86.]
    );
}

#[test]
fn sum_fast_paths_match_naive() {
    // Large enough for the parallel paths; every block pattern plus the
    // general walk (split blocks, non-contiguous input).
    let shape = [6, 50, 7, 40];
    let x = rand64(&shape, 3);
    let v = x.to_f64_vec().unwrap();
    let cases: [&[isize]; 7] = [&[], &[3], &[2, 3], &[0], &[0, 1], &[1, 2], &[0, 2]];
    for dims in cases {
        let mut mask = vec![dims.is_empty(); 4];
        dims.iter().for_each(|&d| mask[d as usize] = true);
        let want = naive_sum(&v, &shape, &mask);
        assert_close(&vals(x.sum(dims, true)), &want, 1e-12);
        let count: usize = shape
            .iter()
            .zip(&mask)
            .filter(|(_, &m)| m)
            .map(|(&d, _)| d)
            .product();
        let means: Vec<f64> = want.iter().map(|s| s / count as f64).collect();
        assert_close(&vals(x.mean(dims, true)), &means, 1e-12);
    }
    let t = x.transpose(1, 3).unwrap();
    let tv = t.to_f64_vec().unwrap();
    let want = naive_sum(&tv, t.shape(), &[false, true, false, true]);
    assert_close(&vals(t.sum(&[1, 3], true)), &want, 1e-12);
    let f = Tensor::ones(&[1 << 16], DType::F32, Device::Cpu).unwrap();
    assert_eq!(one(f.sum_all()), 65536.0);
}

#[test]
fn max_min_argmax_values_and_gradients() {
    let x = f64s(vec![1., 3., 3., 5., 2., 5.], &[2, 3]);
    assert_eq!(vals(x.max(1, false)), vec![3., 5.]);
    assert_eq!(vals(x.min(0, true)), vec![1., 2., 3.]);
    assert_eq!(x.min(0, true).unwrap().shape(), &[1, 3]);
    assert_eq!(
        x.argmax(1, false).unwrap().to_vec::<i64>().unwrap(),
        vec![1, 0]
    );
    assert_eq!(
        x.argmin(-1, true).unwrap().to_vec::<i64>().unwrap(),
        vec![0, 1]
    );
    assert_eq!(x.argmax(1, true).unwrap().dtype(), DType::I64);
    let nan = f64s(vec![1., f64::NAN, 3.], &[3]);
    assert!(one(nan.max(0, false)).is_nan());
    assert_eq!(
        nan.argmax(0, false).unwrap().to_vec::<i64>().unwrap(),
        vec![1]
    );
    let ints = i64s(vec![4, 9, 2], &[3]);
    assert_eq!(
        ints.argmax(0, false).unwrap().to_vec::<i64>().unwrap(),
        vec![1]
    );
    // The gradient goes to the first extremal element only.
    let w = x.set_requires_grad(true).unwrap();
    w.max(1, false)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    assert_eq!(
        w.grad().unwrap().to_vec::<f64>().unwrap(),
        vec![0., 1., 0., 1., 0., 0.]
    );
}

#[test]
fn gradcheck_reductions() {
    let a = rand64(&[3, 4, 5], 1);
    check(|x| x[0].sum(&[0, 2], false), std::slice::from_ref(&a));
    check(|x| x[0].sum(&[-1], true), std::slice::from_ref(&a));
    check(|x| x[0].sum_all(), std::slice::from_ref(&a));
    check(|x| x[0].mean(&[1, 2], true), std::slice::from_ref(&a));
    check(|x| x[0].mean_all(), std::slice::from_ref(&a));
    check(
        |x| x[0].transpose(0, 2)?.sum(&[1], false),
        std::slice::from_ref(&a),
    );
    check(|x| x[0].max(1, false), std::slice::from_ref(&a));
    check(|x| x[0].min(-1, true), std::slice::from_ref(&a));
    check(|x| x[0].transpose(0, 1)?.max(2, true), &[a]);
}

#[test]
fn softmax_values_and_stability() {
    let x = f64s(vec![1., 2., 3., 1001., 1002., 1003.], &[2, 3]);
    let p = [0.09003057317038046, 0.24472847105479767, 0.6652409557748219];
    let want: Vec<f64> = p.iter().chain(&p).copied().collect();
    assert_close(&vals(x.softmax(1)), &want, 1e-12);
    let logs: Vec<f64> = want.iter().map(|v| v.ln()).collect();
    assert_close(&vals(x.log_softmax(-1)), &logs, 1e-12);
    // Along dim 0 of the transposed view: the same numbers.
    assert_close(
        &x.t()
            .unwrap()
            .softmax(0)
            .unwrap()
            .t()
            .unwrap()
            .to_f64_vec()
            .unwrap(),
        &want,
        1e-12,
    );
    let f = Tensor::from_vec(vec![-1e4f32, 0.0, 1e4], &[3], Device::Cpu).unwrap();
    assert_eq!(vals(f.softmax(0)), vec![0.0, 0.0, 1.0]);
    assert!(vals(f.log_softmax(0)).iter().all(|v| v.is_finite()));
}

#[test]
fn gradcheck_softmax() {
    let a = rand64_in(&[3, 4, 5], -3.0, 3.0, 2);
    for dim in [0, 1, -1] {
        check(|x| x[0].softmax(dim), std::slice::from_ref(&a));
        check(|x| x[0].log_softmax(dim), std::slice::from_ref(&a));
    }
    check(|x| x[0].transpose(0, 2)?.softmax(1), &[a]);
}

fn ce(reduction: Reduction, ignore_index: i64, label_smoothing: f64) -> CrossEntropyOptions {
    CrossEntropyOptions {
        reduction,
        ignore_index,
        label_smoothing,
    }
}

#[test]
fn cross_entropy_exact_values() {
    let logits = f64s(vec![1., 2., 3., 1., 1., 1.], &[2, 3]);
    let t = i64s(vec![2, 0], &[2]);
    let (l0, l1) = (0.40760596444438013, 1.0986122886681098);
    let loss = |o| vals(logits.cross_entropy(&t, o));
    assert!((loss(CrossEntropyOptions::default())[0] - 0.753109126556245).abs() < 1e-12);
    assert!((loss(ce(Reduction::Sum, -100, 0.0))[0] - (l0 + l1)).abs() < 1e-12);
    assert_close(&loss(ce(Reduction::None, -100, 0.0)), &[l0, l1], 1e-12);
    assert_close(
        &loss(ce(Reduction::None, -100, 0.1)),
        &[0.50760596444438, l1],
        1e-12,
    );
    // An ignored sample: no loss, and not counted in the mean.
    let ti = i64s(vec![2, -100], &[2]);
    let mean = logits
        .cross_entropy(&ti, CrossEntropyOptions::default())
        .unwrap();
    assert!((mean.to_scalar().unwrap() - l0).abs() < 1e-12);
    let ti = i64s(vec![2, 7], &[2]);
    let none = logits
        .cross_entropy(&ti, ce(Reduction::None, 7, 0.0))
        .unwrap();
    assert_close(&none.to_f64_vec().unwrap(), &[l0, 0.0], 1e-12);
    // f32 to 1e-6, and the gradient (p − onehot) / N.
    let lf = Tensor::from_vec(vec![1.0f32, 2., 3., 1., 1., 1.], &[2, 3], Device::Cpu).unwrap();
    let lf = lf.set_requires_grad(true).unwrap();
    let loss = lf
        .cross_entropy(&t, CrossEntropyOptions::default())
        .unwrap();
    assert!((loss.to_scalar().unwrap() - 0.753109126556245).abs() < 1e-6);
    loss.backward().unwrap();
    let p = [0.09003057317038046, 0.24472847105479767, 0.6652409557748219];
    let third = 1.0 / 3.0;
    let want = [
        p[0] / 2.,
        p[1] / 2.,
        (p[2] - 1.) / 2.,
        (third - 1.) / 2.,
        third / 2.,
        third / 2.,
    ];
    assert_close(&lf.grad().unwrap().to_f64_vec().unwrap(), &want, 1e-6);
    // Unbatched: [C] logits and a 0-d target.
    let one = f64s(vec![1., 2., 3.], &[3])
        .cross_entropy(&i64s(vec![2], &[]), CrossEntropyOptions::default());
    assert!((one.unwrap().to_scalar().unwrap() - l0).abs() < 1e-12);
}

#[test]
fn gradcheck_cross_entropy() {
    let logits = rand64_in(&[5, 4], -2.0, 2.0, 3);
    let t = i64s(vec![0, 3, -100, 1, 3], &[5]);
    for reduction in [Reduction::Mean, Reduction::Sum, Reduction::None] {
        for smoothing in [0.0, 0.2] {
            check(
                |x| x[0].cross_entropy(&x[1], ce(reduction, -100, smoothing)),
                &[logits.clone(), t.clone()],
            );
        }
    }
    // Spatial: [N, C, d1, d2] with [N, d1, d2] targets.
    let logits = rand64_in(&[2, 3, 2, 2], -2.0, 2.0, 4);
    let t = i64s(vec![0, 1, 2, 1, 2, 2, -1, 0], &[2, 2, 2]);
    check(
        |x| x[0].cross_entropy(&x[1], ce(Reduction::Mean, -1, 0.1)),
        &[logits.clone(), t.clone()],
    );
    check(
        |x| x[0].cross_entropy(&x[1], ce(Reduction::None, -1, 0.0)),
        &[logits, t],
    );
    // Through a non-contiguous view.
    let logits = rand64_in(&[4, 3], -2.0, 2.0, 5);
    let t = i64s(vec![2, 0, 1, 1], &[4]);
    check(
        |x| {
            x[0].t()?
                .t()?
                .cross_entropy(&x[1], CrossEntropyOptions::default())
        },
        &[logits.clone(), t.clone()],
    );
    check(
        |x| {
            x[0].t()?
                .cross_entropy(&x[1].narrow(0, 0, 3)?, CrossEntropyOptions::default())
        },
        &[logits, t],
    );
}

#[test]
fn cross_entropy_errors() {
    let logits = rand64(&[2, 3], 1);
    let opts = CrossEntropyOptions::default();
    assert!(matches!(
        logits.cross_entropy(&i64s(vec![0, 3], &[2]), opts),
        Err(Error::IndexOutOfRange {
            index: 3,
            size: 3,
            ..
        })
    ));
    assert!(matches!(
        logits.cross_entropy(&i64s(vec![-1, 0], &[2]), opts),
        Err(Error::IndexOutOfRange { index: -1, .. })
    ));
    assert!(matches!(
        logits.cross_entropy(&i64s(vec![0, 1, 2], &[3]), opts),
        Err(Error::ShapeMismatch { .. })
    ));
    assert!(matches!(
        logits.cross_entropy(&rand64(&[2], 2), opts),
        Err(Error::DTypeMismatch { .. })
    ));
    assert!(matches!(
        logits.cross_entropy(&i64s(vec![0, 1], &[2]), ce(Reduction::Mean, -100, 1.5)),
        Err(Error::InvalidArgument { .. })
    ));
}

#[test]
fn mse_values_and_gradients() {
    let a = f64s(vec![1., 2., 3., 4.], &[2, 2]);
    let b = f64s(vec![0., 2., 5., 1.], &[2, 2]);
    assert_eq!(one(a.mse_loss(&b, Reduction::Mean)), 3.5);
    assert_eq!(one(a.mse_loss(&b, Reduction::Sum)), 14.0);
    assert_eq!(vals(a.mse_loss(&b, Reduction::None)), vec![1., 0., 4., 9.]);
    assert!(matches!(
        a.mse_loss(&f64s(vec![1., 2.], &[2]), Reduction::Mean),
        Err(Error::ShapeMismatch { .. })
    ));
    let (x, y) = (rand64(&[3, 4], 5), rand64(&[3, 4], 6));
    for r in [Reduction::Mean, Reduction::Sum, Reduction::None] {
        check(|t| t[0].mse_loss(&t[1], r), &[x.clone(), y.clone()]);
    }
}

#[test]
fn dim_and_dtype_errors() {
    let x = rand64(&[2, 3], 1);
    assert!(matches!(
        x.sum(&[2], false),
        Err(Error::DimOutOfRange { .. })
    ));
    assert!(matches!(
        x.sum(&[0, -2], false),
        Err(Error::InvalidArgument { .. })
    ));
    assert!(matches!(x.max(-3, false), Err(Error::DimOutOfRange { .. })));
    assert!(matches!(
        x.argmin(2, false),
        Err(Error::DimOutOfRange { .. })
    ));
    assert!(matches!(x.softmax(2), Err(Error::DimOutOfRange { .. })));
    assert!(matches!(
        x.log_softmax(-3),
        Err(Error::DimOutOfRange { .. })
    ));
    let i = i64s(vec![1, 2], &[2]);
    assert!(matches!(i.sum_all(), Err(Error::UnsupportedDType { .. })));
    assert!(matches!(i.softmax(0), Err(Error::UnsupportedDType { .. })));
    let empty = Tensor::zeros(&[2, 0], DType::F32, Device::Cpu).unwrap();
    assert!(matches!(
        empty.max(1, false),
        Err(Error::InvalidArgument { .. })
    ));
}

#[test]
fn saved_bytes() {
    let ledger = Ledger::new();
    let _g = ledger.enter();
    let saved = || ledger.live_in(Device::Cpu, Category::Saved);
    let x = Tensor::rand(&[4, 10], DType::F32, Device::Cpu, 1)
        .unwrap()
        .set_requires_grad(true)
        .unwrap();
    let s = x.sum(&[1], false).unwrap();
    assert_eq!(saved(), 0, "sum saves only shapes");
    let m = x.max(1, false).unwrap();
    assert_eq!(saved(), 4, "max saves 4 U8 indices");
    drop(m);
    let big = Tensor::rand(&[2, 300], DType::F32, Device::Cpu, 2)
        .unwrap()
        .set_requires_grad(true)
        .unwrap();
    let bm = big.min(1, true).unwrap();
    assert_eq!(saved(), 8, "a dim of 300 needs U32 indices");
    drop(bm);
    let p = x.softmax(1).unwrap();
    assert_eq!(saved(), 160, "softmax saves its output");
    drop(p);
    let t = i64s(vec![0, 9, 3, 1], &[4]);
    let l = x.cross_entropy(&t, CrossEntropyOptions::default()).unwrap();
    assert_eq!(
        saved(),
        160 + 32,
        "cross_entropy saves probabilities and targets"
    );
    drop(l);
    let d = x
        .detach()
        .cross_entropy(&t, CrossEntropyOptions::default())
        .unwrap();
    assert_eq!(saved(), 0, "nothing when the logits need no grad");
    drop((d, s));
    let y = Tensor::rand(&[4, 10], DType::F32, Device::Cpu, 3).unwrap();
    let l = x.mse_loss(&y, Reduction::Mean).unwrap();
    assert_eq!(saved(), 160, "mse saves the difference");
    l.backward().unwrap();
    assert_eq!(saved(), 0);
    assert_eq!(x.grad().unwrap().shape(), &[4, 10]);
}
