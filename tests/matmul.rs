//! matmul: values against a naive loop for every float dtype and layout,
//! broadcasting, 1-d rules, gradients, what is saved, and errors.
mod common;
use common::*;
use leangrad::memory::{Category, Ledger};
use leangrad::{DType, Device, Error, Tensor};

/// torch.matmul computed naively in f64 from the operands' values.
fn naive(a: &Tensor, b: &Tensor) -> (Vec<usize>, Vec<f64>) {
    let (av, bv) = (a.to_f64_vec().unwrap(), b.to_f64_vec().unwrap());
    let mut ashape = a.shape().to_vec();
    let mut bshape = b.shape().to_vec();
    if ashape.len() == 1 {
        ashape.insert(0, 1);
    }
    if bshape.len() == 1 {
        bshape.push(1);
    }
    let (ra, rb) = (ashape.len(), bshape.len());
    let (m, k, n) = (ashape[ra - 2], ashape[ra - 1], bshape[rb - 1]);
    assert_eq!(k, bshape[rb - 2]);
    let nb = (ra - 2).max(rb - 2);
    let pad = |s: &[usize]| {
        let mut v = vec![1; nb + 2 - s.len()];
        v.extend_from_slice(&s[..s.len() - 2]);
        v
    };
    let (ba, bb) = (pad(&ashape), pad(&bshape));
    let batch: Vec<usize> = ba.iter().zip(&bb).map(|(&x, &y)| x.max(y)).collect();
    let total: usize = batch.iter().product();
    let mut out = Vec::new();
    for i in 0..total {
        // Unravel i over the batch, then ravel into each operand's batch.
        let (mut rem, mut ia, mut ib, mut sa, mut sb) = (i, 0, 0, 1, 1);
        for d in (0..nb).rev() {
            let idx = rem % batch[d];
            rem /= batch[d];
            ia += if ba[d] == 1 { 0 } else { idx * sa };
            ib += if bb[d] == 1 { 0 } else { idx * sb };
            sa *= ba[d];
            sb *= bb[d];
        }
        for r in 0..m {
            for c in 0..n {
                let s: f64 = (0..k)
                    .map(|j| av[ia * m * k + r * k + j] * bv[ib * k * n + j * n + c])
                    .sum();
                out.push(s);
            }
        }
    }
    let mut shape = batch;
    if a.rank() != 1 {
        shape.push(m);
    }
    if b.rank() != 1 {
        shape.push(n);
    }
    (shape, out)
}

fn rand(shape: &[usize], dtype: DType, seed: u64) -> Tensor {
    Tensor::rand_range(shape, -1.0, 1.0, dtype, Device::Cpu, seed).unwrap()
}

fn check_against_naive(a: &Tensor, b: &Tensor, tol: f64) {
    let out = a.matmul(b).unwrap();
    let (shape, want) = naive(a, b);
    assert_eq!(
        out.shape(),
        shape.as_slice(),
        "{:?} @ {:?}",
        a.shape(),
        b.shape()
    );
    assert_eq!(out.dtype(), a.dtype());
    assert_close(&out.to_f64_vec().unwrap(), &want, tol);
}

const DTYPES: [(DType, f64); 4] = [
    (DType::F64, 1e-12),
    (DType::F32, 1e-5),
    (DType::F16, 2e-2),
    (DType::BF16, 3e-2),
];

#[test]
fn two_d_all_dtypes_and_sizes() {
    for (dtype, tol) in DTYPES {
        for &(m, k, n) in &[
            (1, 1, 1),
            (3, 4, 5),
            (17, 33, 9),
            (64, 1, 7),
            (5, 0, 3),
            (0, 3, 2),
        ] {
            check_against_naive(&rand(&[m, k], dtype, 1), &rand(&[k, n], dtype, 2), tol);
        }
    }
    // Large enough for the multithreaded product.
    check_against_naive(
        &rand(&[96, 80, 72], DType::F32, 3)
            .narrow(0, 0, 1)
            .unwrap()
            .squeeze(0)
            .unwrap(),
        &rand(&[72, 130], DType::F32, 4),
        1e-5,
    );
    check_against_naive(
        &rand(&[128, 96], DType::F32, 5),
        &rand(&[96, 80], DType::F32, 6),
        1e-5,
    );
}

#[test]
fn non_contiguous_operands() {
    for (dtype, tol) in DTYPES {
        let a = rand(&[6, 4], dtype, 7).t().unwrap(); // [4, 6], column-major
        let b = rand(&[5, 6], dtype, 8).t().unwrap(); // [6, 5]
        check_against_naive(&a, &b, tol);
        // A narrowed window (row stride larger than the row).
        let a = rand(&[5, 10], dtype, 9).narrow(1, 2, 6).unwrap();
        check_against_naive(&a, &b, tol);
        // Neither stride is 1: copied before the product.
        let a = rand(&[4, 3, 6], dtype, 10).permute(&[2, 0, 1]).unwrap(); // [6, 4, 3], strides (1, 18, 6)
        check_against_naive(&a, &rand(&[3, 2], dtype, 11), tol);
        // A broadcast (stride-0) matrix.
        let b = rand(&[6, 1], dtype, 12).broadcast_to(&[6, 3]).unwrap();
        check_against_naive(&rand(&[2, 6], dtype, 13), &b, tol);
        // Batched, transposed.
        let a = rand(&[3, 5, 4], dtype, 14).transpose(1, 2).unwrap();
        let b = rand(&[5, 3, 2], dtype, 15).transpose(0, 1).unwrap(); // [3, 5, 2]
        check_against_naive(&a, &b, tol);
    }
}

#[test]
fn batched_with_broadcasting() {
    for (dtype, tol) in DTYPES {
        check_against_naive(
            &rand(&[2, 1, 3, 4], dtype, 16),
            &rand(&[5, 4, 2], dtype, 17),
            tol,
        );
        check_against_naive(&rand(&[4, 5, 6], dtype, 18), &rand(&[6, 3], dtype, 19), tol); // folds into one product
        check_against_naive(
            &rand(&[5, 6], dtype, 20),
            &rand(&[2, 3, 6, 4], dtype, 21),
            tol,
        );
        check_against_naive(
            &rand(&[1, 3, 4], dtype, 22),
            &rand(&[7, 4, 2], dtype, 23),
            tol,
        );
        // Batch not foldable (batch dims out of order).
        let a = rand(&[5, 4, 6], dtype, 24).transpose(0, 1).unwrap();
        check_against_naive(&a, &rand(&[6, 3], dtype, 25), tol);
    }
    // Many small products, split over threads.
    check_against_naive(
        &rand(&[64, 16, 16], DType::F32, 26),
        &rand(&[64, 16, 16], DType::F32, 27),
        1e-5,
    );
}

#[test]
fn one_d_rules() {
    for (dtype, tol) in DTYPES {
        let v = rand(&[4], dtype, 28);
        check_against_naive(&v, &rand(&[4], dtype, 29), tol); // dot: 0-d
        check_against_naive(&v, &rand(&[4, 5], dtype, 30), tol); // [5]
        check_against_naive(&rand(&[3, 4], dtype, 31), &v, tol); // [3]
        check_against_naive(&v, &rand(&[2, 4, 3], dtype, 32), tol); // [2, 3]
        check_against_naive(&rand(&[2, 3, 4], dtype, 33), &v, tol); // [2, 3]
        let strided = rand(&[8], dtype, 34).narrow(0, 1, 4).unwrap();
        check_against_naive(
            &rand(&[4, 8], dtype, 35).narrow(1, 0, 4).unwrap(),
            &strided,
            tol,
        );
    }
    let a = Tensor::from_vec(vec![1.0f64, 2.0, 3.0], &[3], Device::Cpu).unwrap();
    let b = Tensor::from_vec(vec![4.0f64, 5.0, 6.0], &[3], Device::Cpu).unwrap();
    let dot = a.matmul(&b).unwrap();
    assert_eq!(dot.shape(), &[] as &[usize]);
    assert_eq!(dot.to_scalar().unwrap(), 32.0);
}

#[test]
fn exact_small_values() {
    let a = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3], Device::Cpu).unwrap();
    let b = Tensor::from_vec(
        vec![7.0f32, 8.0, 9.0, 10.0, 11.0, 12.0],
        &[3, 2],
        Device::Cpu,
    )
    .unwrap();
    assert_eq!(
        a.matmul(&b).unwrap().to_vec::<f32>().unwrap(),
        vec![58.0, 64.0, 139.0, 154.0]
    );
}

#[test]
fn gradcheck_matmul() {
    check(
        |x| x[0].matmul(&x[1]),
        &[rand64(&[3, 4], 1), rand64(&[4, 2], 2)],
    );
    check(
        |x| x[0].matmul(&x[1]),
        &[rand64(&[2, 1, 3, 4], 3), rand64(&[5, 4, 2], 4)],
    );
    check(
        |x| x[0].matmul(&x[1]),
        &[rand64(&[4, 3, 5], 5), rand64(&[5, 2], 6)],
    );
    check(
        |x| x[0].matmul(&x[1]),
        &[rand64(&[3, 5], 7), rand64(&[2, 4, 5, 2], 8)],
    );
    check(
        |x| x[0].matmul(&x[1]),
        &[rand64(&[1, 3, 4], 9), rand64(&[2, 4, 3], 10)],
    );
    check(
        |x| x[0].matmul(&x[1]),
        &[rand64(&[4], 11), rand64(&[4], 12)],
    );
    check(
        |x| x[0].matmul(&x[1]),
        &[rand64(&[4], 13), rand64(&[2, 4, 3], 14)],
    );
    check(
        |x| x[0].matmul(&x[1]),
        &[rand64(&[2, 3, 4], 15), rand64(&[4], 16)],
    );
    check(
        |x| x[0].t()?.matmul(&x[1].t()?),
        &[rand64(&[4, 3], 17), rand64(&[2, 4], 18)],
    );
    check(
        |x| x[0].transpose(0, 1)?.matmul(&x[1]),
        &[rand64(&[5, 4, 6], 19), rand64(&[6, 3], 20)],
    );
}

/// A Linear layer's `x · wᵀ`: the weight's gradient arrives contiguous (the
/// weight's own layout, as PyTorch gives it) with the values of `gᵀ·x`
/// (summed over the batch dims), computed naively here.
#[test]
fn a_transposed_rhs_gets_its_gradient_in_its_own_layout() {
    use leangrad::autograd::{backward_with, CollectGrads};
    for x_shape in [vec![6, 5], vec![2, 4, 5]] {
        let x = rand(&x_shape, DType::F64, 1);
        let w = rand(&[3, 5], DType::F64, 2)
            .set_requires_grad(true)
            .unwrap();
        let y = x.matmul(&w.t().unwrap()).unwrap();
        let g = rand(y.shape(), DType::F64, 3);
        backward_with(&y, Some(g.clone()), &mut CollectGrads).unwrap();
        let gw = w.grad().unwrap();
        assert!(gw.is_contiguous(), "{x_shape:?}");
        assert_eq!(gw.shape(), &[3, 5]);
        let (xv, gv) = (x.to_f64_vec().unwrap(), g.to_f64_vec().unwrap());
        let rows = xv.len() / 5;
        let want: Vec<f64> = (0..15)
            .map(|e| {
                (0..rows)
                    .map(|r| gv[r * 3 + e / 5] * xv[r * 5 + e % 5])
                    .sum()
            })
            .collect();
        assert_close(&gw.to_f64_vec().unwrap(), &want, 1e-12);
    }
}

#[test]
fn saves_only_what_each_gradient_needs() {
    let ledger = Ledger::new();
    let _g = ledger.enter();
    let x = rand(&[8, 16], DType::F32, 1); // 512 bytes
    let w = rand(&[16, 4], DType::F32, 2)
        .set_requires_grad(true)
        .unwrap(); // 256 bytes
    let y = x.matmul(&w).unwrap();
    assert_eq!(
        ledger.live_in(Device::Cpu, Category::Saved),
        512,
        "only x, for grad_w"
    );
    drop(y);
    let xg = x.set_requires_grad(true).unwrap();
    let wd = w.detach();
    let y = xg.matmul(&wd).unwrap();
    assert_eq!(
        ledger.live_in(Device::Cpu, Category::Saved),
        256,
        "only w, for grad_x"
    );
    y.sum_all().unwrap().backward().unwrap();
    assert_eq!(ledger.live_in(Device::Cpu, Category::Saved), 0);
    let gx = xg.grad().unwrap();
    assert_eq!(gx.shape(), &[8, 16]);
    // d(sum(x·w))/dx[i, j] = Σ_c w[j, c]
    let wv = wd.to_f64_vec().unwrap();
    let want: Vec<f64> = (0..8 * 16)
        .map(|i| (0..4).map(|c| wv[(i % 16) * 4 + c]).sum())
        .collect();
    assert_close(&gx.to_f64_vec().unwrap(), &want, 1e-5);
}

#[test]
fn errors() {
    let a = rand(&[2, 3], DType::F32, 1);
    assert!(matches!(
        a.matmul(&rand(&[4, 2], DType::F32, 2)),
        Err(Error::ShapeMismatch { .. })
    ));
    assert!(matches!(
        a.matmul(&rand(&[4], DType::F32, 2)),
        Err(Error::ShapeMismatch { .. })
    ));
    let b = rand(&[2, 3, 4], DType::F32, 3);
    assert!(matches!(
        b.matmul(&rand(&[3, 4, 5], DType::F32, 4)),
        Err(Error::ShapeMismatch { .. })
    ));
    assert!(matches!(
        a.matmul(&rand(&[3, 2], DType::F64, 5)),
        Err(Error::DTypeMismatch { .. })
    ));
    let s = Tensor::scalar(1.0, DType::F32, Device::Cpu).unwrap();
    assert!(matches!(s.matmul(&a), Err(Error::InvalidArgument { .. })));
    let i = Tensor::zeros(&[2, 2], DType::I64, Device::Cpu).unwrap();
    assert!(matches!(i.matmul(&i), Err(Error::UnsupportedDType { .. })));
}
