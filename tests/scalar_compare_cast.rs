//! Scalar arithmetic, clamp, maximum/minimum, comparisons, where_cond, casts.
mod common;
use common::*;
use leangrad::autograd::{backward_with, no_grad, CollectGrads};
use leangrad::memory::{Category, Ledger};
use leangrad::{DType, Device, Tensor};
use std::slice::from_ref;

fn t32(v: &[f32], shape: &[usize]) -> Tensor {
    Tensor::from_vec(v.to_vec(), shape, Device::Cpu).unwrap()
}

fn f32s(t: &Tensor) -> Vec<f32> {
    t.to_vec::<f32>().unwrap()
}

fn u8s(t: &Tensor) -> Vec<u8> {
    assert_eq!(t.dtype(), DType::U8);
    t.to_vec::<u8>().unwrap()
}

fn ones64(shape: &[usize]) -> Tensor {
    Tensor::ones(shape, DType::F64, Device::Cpu).unwrap()
}

#[test]
fn scalar_values() {
    let x = t32(&[1.0, -2.0, 3.0, 0.5], &[2, 2]);
    assert_eq!(f32s(&x.add_scalar(1.5).unwrap()), vec![2.5, -0.5, 4.5, 2.0]);
    assert_eq!(
        f32s(&x.sub_scalar(1.0).unwrap()),
        vec![0.0, -3.0, 2.0, -0.5]
    );
    assert_eq!(
        f32s(&x.mul_scalar(-2.0).unwrap()),
        vec![-2.0, 4.0, -6.0, -1.0]
    );
    assert_eq!(
        f32s(&x.div_scalar(4.0).unwrap()),
        vec![0.25, -0.5, 0.75, 0.125]
    );
    assert_eq!(f32s(&x.scalar_sub(1.0).unwrap()), vec![0.0, 3.0, -2.0, 0.5]);
    assert_eq!(
        f32s(&x.clamp(-1.0, 2.0).unwrap()),
        vec![1.0, -1.0, 2.0, 0.5]
    );
    // Transposed (strided) input.
    assert_eq!(
        f32s(&x.t().unwrap().add_scalar(1.0).unwrap()),
        vec![2.0, 4.0, -1.0, 1.5]
    );
}

#[test]
fn in_place_scalar_ops() {
    let x = t32(&[1.0, 2.0, 3.0], &[3]);
    x.add_scalar_(1.0).unwrap();
    x.mul_scalar_(0.5).unwrap();
    assert_eq!(f32s(&x), vec![1.0, 1.5, 2.0]);
    assert_eq!(x.version(), 2);
    let w = x.clone().into_parameter().unwrap();
    assert_err!(w.add_scalar_(1.0), InPlaceOnRequiresGrad);
    assert_err!(w.mul_scalar_(2.0), InPlaceOnRequiresGrad);
    assert_eq!(w.version(), 2);
    {
        let _ng = no_grad();
        w.mul_scalar_(2.0).unwrap();
    }
    assert_eq!(f32s(&w), vec![2.0, 3.0, 4.0]);
    assert_eq!(w.version(), 3);
    let i = Tensor::zeros(&[2], DType::I64, Device::Cpu).unwrap();
    assert_err!(i.add_scalar_(1.0), UnsupportedDType);
    let m = t32(&[1.0, 2.0, 3.0, 4.0], &[2, 2]).t().unwrap();
    assert_err!(m.mul_scalar_(2.0), InvalidArgument);
}

#[test]
fn maximum_minimum_values_and_ties() {
    let a = t32(&[1.0, 5.0, 3.0, -1.0, 0.0, 7.0], &[2, 3]);
    let b = t32(&[2.0, 5.0, 0.0], &[3]);
    assert_eq!(
        f32s(&a.maximum(&b).unwrap()),
        vec![2.0, 5.0, 3.0, 2.0, 5.0, 7.0]
    );
    assert_eq!(
        f32s(&a.minimum(&b).unwrap()),
        vec![1.0, 5.0, 0.0, -1.0, 0.0, 0.0]
    );
    let nan = t32(&[f32::NAN], &[1]);
    assert!(f32s(&nan.maximum(&b).unwrap()).iter().all(|v| v.is_nan()));
    // Ties split the gradient half/half.
    let a = Tensor::from_vec(vec![1.0f64, 2.0, 3.0], &[3], Device::Cpu)
        .unwrap()
        .set_requires_grad(true)
        .unwrap();
    let b = Tensor::from_vec(vec![2.0f64], &[1], Device::Cpu)
        .unwrap()
        .set_requires_grad(true)
        .unwrap();
    backward_with(
        &a.maximum(&b).unwrap(),
        Some(ones64(&[3])),
        &mut CollectGrads,
    )
    .unwrap();
    assert_eq!(a.grad().unwrap().to_f64_vec().unwrap(), vec![0.0, 0.5, 1.0]);
    assert_eq!(b.grad().unwrap().to_f64_vec().unwrap(), vec![1.5]);
    a.zero_grad();
    b.zero_grad();
    backward_with(
        &a.minimum(&b).unwrap(),
        Some(ones64(&[3])),
        &mut CollectGrads,
    )
    .unwrap();
    assert_eq!(a.grad().unwrap().to_f64_vec().unwrap(), vec![1.0, 0.5, 0.0]);
    assert_eq!(b.grad().unwrap().to_f64_vec().unwrap(), vec![1.5]);
}

#[test]
fn gradcheck_scalar_ops() {
    let x = rand64(&[3, 4], 21);
    let y = rand64(&[4], 22);
    check(|t| t[0].add_scalar(0.7), from_ref(&x));
    check(|t| t[0].sub_scalar(0.7), from_ref(&x));
    check(|t| t[0].mul_scalar(-1.3), from_ref(&x));
    check(|t| t[0].div_scalar(0.4), from_ref(&x));
    check(|t| t[0].scalar_sub(2.0), from_ref(&x));
    check(|t| t[0].clamp(-0.5, 0.3), from_ref(&x));
    check(
        |t| t[0].t()?.clamp(-0.2, 2.0)?.mul_scalar(3.0),
        from_ref(&x),
    );
    check(|t| t[0].maximum(&t[1]), &[x.clone(), y.clone()]);
    check(|t| t[0].minimum(&t[1]), &[x.clone(), y.clone()]);
    check(|t| t[1].maximum(&t[0]), &[x.clone(), rand64(&[3, 1], 23)]);
    check(
        |t| t[1].unsqueeze(1)?.minimum(&t[0]),
        &[rand64(&[1, 4], 24), rand64(&[3], 25)],
    );
    // Only one side requiring grad.
    let c = y.clone();
    check(move |t| t[0].maximum(&c), from_ref(&x));
}

#[test]
fn scalar_ops_save_nothing_clamp_saves_a_bit_mask_extremum_saves_both() {
    let ledger = Ledger::new();
    let _g = ledger.enter();
    let saved = || ledger.live_in(Device::Cpu, Category::Saved);
    let x = Tensor::rand_range(&[8], -1.0, 1.0, DType::F32, Device::Cpu, 1)
        .unwrap()
        .set_requires_grad(true)
        .unwrap();
    let other = Tensor::zeros(&[2, 8], DType::F32, Device::Cpu).unwrap();
    let ys = [
        x.add_scalar(1.0),
        x.sub_scalar(1.0),
        x.mul_scalar(2.0),
        x.div_scalar(2.0),
        x.scalar_sub(1.0),
    ];
    assert!(ys.iter().all(|y| y.as_ref().unwrap().requires_grad()));
    assert_eq!(saved(), 0);
    let c = x.clamp(0.0, 0.5).unwrap();
    assert_eq!(saved(), 4, "clamp keeps one mask word for 8 elements");
    drop(c);
    assert_eq!(saved(), 0);
    let m = x.maximum(&other).unwrap();
    assert_eq!(saved(), 32 + 64);
    drop(m);
    assert_eq!(saved(), 0);
}

#[test]
fn compare_values_all_dtypes() {
    let a = t32(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    let b = t32(&[2.0, 5.0, 3.0], &[3]);
    assert_eq!(u8s(&a.eq(&b).unwrap()), vec![0, 0, 1, 0, 1, 0]);
    assert_eq!(u8s(&a.ne(&b).unwrap()), vec![1, 1, 0, 1, 0, 1]);
    assert_eq!(u8s(&a.lt(&b).unwrap()), vec![1, 1, 0, 0, 0, 0]);
    assert_eq!(u8s(&a.le(&b).unwrap()), vec![1, 1, 1, 0, 1, 0]);
    assert_eq!(u8s(&a.gt(&b).unwrap()), vec![0, 0, 0, 1, 0, 1]);
    assert_eq!(u8s(&a.ge(&b).unwrap()), vec![0, 0, 1, 1, 1, 1]);
    assert_eq!(a.gt(&b).unwrap().shape(), &[2, 3]);
    assert_eq!(u8s(&a.eq_scalar(3.0).unwrap()), vec![0, 0, 1, 0, 0, 0]);
    assert_eq!(u8s(&a.ne_scalar(3.0).unwrap()), vec![1, 1, 0, 1, 1, 1]);
    assert_eq!(u8s(&a.lt_scalar(3.0).unwrap()), vec![1, 1, 0, 0, 0, 0]);
    assert_eq!(u8s(&a.le_scalar(3.0).unwrap()), vec![1, 1, 1, 0, 0, 0]);
    assert_eq!(u8s(&a.gt_scalar(3.0).unwrap()), vec![0, 0, 0, 1, 1, 1]);
    assert_eq!(u8s(&a.ge_scalar(3.0).unwrap()), vec![0, 0, 1, 1, 1, 1]);
    // Integers compare natively, also beyond what f32 holds exactly.
    let i = Tensor::from_vec(vec![-3i64, 16_777_217, 5], &[3], Device::Cpu).unwrap();
    let j = Tensor::from_vec(vec![-3i64, 16_777_216, 9], &[3], Device::Cpu).unwrap();
    assert_eq!(u8s(&i.eq(&j).unwrap()), vec![1, 0, 0]);
    assert_eq!(u8s(&i.gt(&j).unwrap()), vec![0, 1, 0]);
    assert_eq!(u8s(&i.lt_scalar(0.0).unwrap()), vec![1, 0, 0]);
    let u = Tensor::from_vec(vec![0u32, 7, u32::MAX], &[3, 1], Device::Cpu).unwrap();
    let v = Tensor::from_vec(vec![7u32, 1], &[2], Device::Cpu).unwrap();
    assert_eq!(u8s(&u.ge(&v).unwrap()), vec![0, 0, 1, 1, 1, 1]);
    assert_eq!(u8s(&u.eq_scalar(4294967295.0).unwrap()), vec![0, 0, 1]);
    let bytes = Tensor::from_vec(vec![0u8, 1, 255], &[3], Device::Cpu).unwrap();
    assert_eq!(u8s(&bytes.le_scalar(1.0).unwrap()), vec![1, 1, 0]);
    assert_eq!(u8s(&bytes.eq_scalar(0.5).unwrap()), vec![0, 0, 0]);
    // NaN: unequal to everything, itself included.
    let n = t32(&[f32::NAN, 1.0], &[2]);
    assert_eq!(u8s(&n.eq(&n).unwrap()), vec![0, 1]);
    assert_eq!(u8s(&n.ne(&n).unwrap()), vec![1, 0]);
    // Strided inputs.
    assert_eq!(
        u8s(&a.t().unwrap().gt_scalar(2.5).unwrap()),
        vec![0, 1, 0, 1, 1, 1]
    );
    // Results never require grad.
    let p = rand64(&[3], 1).set_requires_grad(true).unwrap();
    assert!(!p.gt_scalar(0.0).unwrap().requires_grad());
}

#[test]
fn where_cond_values_gradients_and_saving() {
    let cond = Tensor::from_vec(vec![1u8, 0, 2], &[3, 1], Device::Cpu).unwrap();
    let a = t32(&[1.0, 2.0], &[2]);
    let b = t32(&[-1.0], &[1]);
    let w = Tensor::where_cond(&cond, &a, &b).unwrap();
    assert_eq!(w.shape(), &[3, 2]);
    assert_eq!(f32s(&w), vec![1.0, 2.0, -1.0, -1.0, 1.0, 2.0]);
    let ia = Tensor::from_vec(vec![10i64, 20, 30], &[3], Device::Cpu).unwrap();
    let ib = Tensor::from_vec(vec![0i64], &[1], Device::Cpu).unwrap();
    let c3 = Tensor::from_vec(vec![1u8, 0, 1], &[3], Device::Cpu).unwrap();
    assert_eq!(
        Tensor::where_cond(&c3, &ia, &ib)
            .unwrap()
            .to_vec::<i64>()
            .unwrap(),
        vec![10, 0, 30]
    );

    check(
        |t| Tensor::where_cond(&t[0], &t[1], &t[2]),
        &[cond.clone(), rand64(&[3, 4], 31), rand64(&[4], 32)],
    );
    check(
        |t| Tensor::where_cond(&t[0], &t[1], &t[2]),
        &[c3.clone(), rand64(&[2, 1], 33), rand64(&[2, 3], 34)],
    );
    let mask = rand64(&[2, 3], 35).gt_scalar(0.0).unwrap();
    check(
        |t| Tensor::where_cond(&t[0].gt_scalar(0.0)?, &t[0], &t[0].mul_scalar(0.1)?),
        &[rand64(&[2, 3], 36)],
    );
    check(
        |t| Tensor::where_cond(&t[0], &t[1].exp()?, &t[1].square()?),
        &[mask, rand64(&[3], 37)],
    );

    // Saves only the condition, and only when a or b needs grad.
    let ledger = Ledger::new();
    let _g = ledger.enter();
    let saved = || ledger.live_in(Device::Cpu, Category::Saved);
    let cond = Tensor::from_vec(vec![1u8, 0, 1, 0, 1], &[5], Device::Cpu).unwrap();
    let a = Tensor::zeros(&[5], DType::F32, Device::Cpu).unwrap();
    let b = Tensor::ones(&[5], DType::F32, Device::Cpu)
        .unwrap()
        .set_requires_grad(true)
        .unwrap();
    let plain = Tensor::where_cond(&cond, &a, &a).unwrap();
    assert!(!plain.requires_grad());
    assert_eq!(saved(), 0);
    let y = Tensor::where_cond(&cond, &a, &b).unwrap();
    assert_eq!(saved(), 5);
    let g = Tensor::full(&[5], 3.0, DType::F32, Device::Cpu).unwrap();
    backward_with(&y, Some(g), &mut CollectGrads).unwrap();
    assert_eq!(saved(), 0);
    assert_eq!(f32s(&b.grad().unwrap()), vec![0.0, 3.0, 0.0, 3.0, 0.0]);
}

#[test]
fn casts() {
    let x = t32(&[1.7, -2.5, 300.0, f32::NAN], &[4]);
    assert_eq!(
        x.to_dtype(DType::I64).unwrap().to_vec::<i64>().unwrap(),
        vec![1, -2, 300, 0]
    );
    assert_eq!(
        x.to_dtype(DType::U8).unwrap().to_vec::<u8>().unwrap(),
        vec![1, 0, 255, 0]
    );
    assert_eq!(
        x.to_dtype(DType::U32).unwrap().to_vec::<u32>().unwrap(),
        vec![1, 0, 300, 0]
    );
    let h = x.to_dtype(DType::F16).unwrap();
    assert_eq!(h.dtype(), DType::F16);
    assert_eq!(h.to_f64_vec().unwrap()[..3], [1.7001953125, -2.5, 300.0]);
    let d = x.to_dtype(DType::F64).unwrap();
    assert_eq!(
        d.to_vec::<f64>().unwrap()[..3],
        [1.7f32 as f64, -2.5, 300.0]
    );
    let i = Tensor::from_vec(vec![-1i64, 7], &[2], Device::Cpu).unwrap();
    assert_eq!(
        i.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap(),
        vec![-1.0, 7.0]
    );
    assert_eq!(
        i.to_dtype(DType::U32).unwrap().to_vec::<u32>().unwrap(),
        vec![0, 7]
    );
    let u = Tensor::from_vec(vec![200u8, 3], &[2], Device::Cpu).unwrap();
    assert_eq!(
        u.to_dtype(DType::BF16).unwrap().to_f64_vec().unwrap(),
        vec![200.0, 3.0]
    );
    assert_eq!(
        u.to_dtype(DType::I64).unwrap().to_vec::<i64>().unwrap(),
        vec![200, 3]
    );
    // Strided input.
    let m = t32(&[1.0, 2.0, 3.0, 4.0], &[2, 2]).t().unwrap();
    assert_eq!(
        m.to_dtype(DType::I64).unwrap().to_vec::<i64>().unwrap(),
        vec![1, 3, 2, 4]
    );
    // Same dtype: a clone sharing storage.
    let same = x.to_dtype(DType::F32).unwrap();
    assert!(same.shares_storage_with(&x));
}

#[test]
fn cast_gradients() {
    let x = rand64(&[3], 41).set_requires_grad(true).unwrap();
    let y = x.to_dtype(DType::F32).unwrap();
    assert!(y.requires_grad());
    let z = y.mul_scalar(2.0).unwrap();
    backward_with(
        &z,
        Some(Tensor::ones(&[3], DType::F32, Device::Cpu).unwrap()),
        &mut CollectGrads,
    )
    .unwrap();
    let g = x.grad().unwrap();
    assert_eq!(g.dtype(), DType::F64);
    assert_eq!(g.to_f64_vec().unwrap(), vec![2.0; 3]);
    assert!(!x.to_dtype(DType::I64).unwrap().requires_grad());
    assert!(!x.to_dtype(DType::U8).unwrap().requires_grad());
    check(|t| t[0].to_dtype(DType::F64)?.exp(), &[rand64(&[4], 42)]);
    // A round trip through bf16 passes the gradient back unchanged.
    let x = rand64(&[2, 2], 43).set_requires_grad(true).unwrap();
    let y = x
        .to_dtype(DType::BF16)
        .unwrap()
        .to_dtype(DType::F64)
        .unwrap();
    backward_with(&y, Some(ones64(&[2, 2])), &mut CollectGrads).unwrap();
    assert_eq!(x.grad().unwrap().to_f64_vec().unwrap(), vec![1.0; 4]);
}

#[test]
fn error_cases() {
    let a = Tensor::zeros(&[2, 3], DType::F32, Device::Cpu).unwrap();
    let short = Tensor::zeros(&[4], DType::F32, Device::Cpu).unwrap();
    let f64s = Tensor::zeros(&[3], DType::F64, Device::Cpu).unwrap();
    let cond = Tensor::zeros(&[3], DType::U8, Device::Cpu).unwrap();
    let i = Tensor::zeros(&[3], DType::I64, Device::Cpu).unwrap();
    assert_err!(a.maximum(&short), ShapeMismatch);
    assert_err!(a.minimum(&f64s), DTypeMismatch);
    assert_err!(i.maximum(&i), UnsupportedDType);
    assert_err!(a.lt(&short), ShapeMismatch);
    assert_err!(a.eq(&f64s), DTypeMismatch);
    assert_err!(i.ge(&cond), DTypeMismatch);
    assert_err!(Tensor::where_cond(&a, &a, &a), DTypeMismatch);
    assert_err!(Tensor::where_cond(&cond, &a, &f64s), DTypeMismatch);
    assert_err!(Tensor::where_cond(&cond, &a, &short), ShapeMismatch);
    let long_cond = Tensor::zeros(&[4], DType::U8, Device::Cpu).unwrap();
    assert_err!(Tensor::where_cond(&long_cond, &a, &a), ShapeMismatch);
    assert_err!(a.clamp(1.0, -1.0), InvalidArgument);
    assert_err!(a.clamp(f64::NAN, 1.0), InvalidArgument);
    assert_err!(i.add_scalar(1.0), UnsupportedDType);
    assert_err!(cond.mul_scalar(2.0), UnsupportedDType);
    assert_err!(i.clamp(0.0, 1.0), UnsupportedDType);
}
