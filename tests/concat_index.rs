//! cat/stack/chunk/split and index_select/gather/scatter_add: values,
//! gradients, what they save, and errors.
mod common;
use common::*;
use leangrad::autograd::{backward_with, CollectGrads};
use leangrad::memory::Ledger;
use leangrad::{DType, Device, Error, Tensor};
use std::slice::from_ref;

fn f32t(v: &[f32], shape: &[usize]) -> Tensor {
    Tensor::from_vec(v.to_vec(), shape, Device::Cpu).unwrap()
}
fn i64t(v: &[i64], shape: &[usize]) -> Tensor {
    Tensor::from_vec(v.to_vec(), shape, Device::Cpu).unwrap()
}
fn vf(t: &Tensor) -> Vec<f32> {
    t.to_vec::<f32>().unwrap()
}
fn vi(t: &Tensor) -> Vec<i64> {
    t.to_vec::<i64>().unwrap()
}
/// Shape and f32 values of an op's result.
fn sv(r: leangrad::Result<Tensor>) -> (Vec<usize>, Vec<f32>) {
    let t = r.unwrap();
    (t.shape().to_vec(), vf(&t))
}
/// Backpropagates ones from `out`; gradients land in the leaves' `.grad`.
fn backward_ones(out: &Tensor) {
    backward_with(out, Some(out.ones_like().unwrap()), &mut CollectGrads).unwrap();
}

#[test]
fn cat_values() {
    let a = f32t(&[1., 2., 3., 4.], &[2, 2]);
    let b = f32t(&[5., 6.], &[2, 1]);
    let c = f32t(&[7., 8.], &[1, 2]);
    assert_eq!(
        sv(Tensor::cat(&[&a, &b], 1)),
        (vec![2, 3], vec![1., 2., 5., 3., 4., 6.])
    );
    assert_eq!(
        sv(Tensor::cat(&[&a, &b], -1)).1,
        vec![1., 2., 5., 3., 4., 6.]
    );
    let r = Tensor::cat(&[&a, &c, &a], 0).unwrap();
    assert_eq!(r.shape(), &[5, 2]);
    assert_eq!(vf(&r), vec![1., 2., 3., 4., 7., 8., 1., 2., 3., 4.]);
    // Non-contiguous input: a.t() = [[1, 3], [2, 4]].
    let r = Tensor::cat(&[&a.t().unwrap(), &b], 1).unwrap();
    assert_eq!(vf(&r), vec![1., 3., 5., 2., 4., 6.]);
    let r = Tensor::cat(&[&c, &a.t().unwrap()], 0).unwrap();
    assert_eq!(vf(&r), vec![7., 8., 1., 3., 2., 4.]);
    // Integers, and a 3-d cat in the middle dimension.
    let x = i64t(&[1, 2, 3, 4, 5, 6, 7, 8], &[2, 2, 2]);
    let y = i64t(&[-1, -2, -3, -4], &[2, 1, 2]);
    let r = Tensor::cat(&[&x, &y], 1).unwrap();
    assert_eq!(r.shape(), &[2, 3, 2]);
    assert_eq!(vi(&r), vec![1, 2, 3, 4, -1, -2, 5, 6, 7, 8, -3, -4]);
    let p = x.permute(&[2, 0, 1]).unwrap(); // [2,2,2], elements 1,3,5,7,2,4,6,8
    assert_eq!(
        vi(&Tensor::cat(&[&p], 0).unwrap()),
        vec![1, 3, 5, 7, 2, 4, 6, 8]
    );
    // A zero-sized part contributes nothing.
    let e = Tensor::zeros(&[2, 0], DType::F32, Device::Cpu).unwrap();
    assert_eq!(vf(&Tensor::cat(&[&e, &b, &e], 1).unwrap()), vec![5., 6.]);
}

#[test]
fn stack_values() {
    let a = f32t(&[1., 2., 3.], &[3]);
    let b = f32t(&[4., 5., 6.], &[3]);
    assert_eq!(
        sv(Tensor::stack(&[&a, &b], 0)),
        (vec![2, 3], vec![1., 2., 3., 4., 5., 6.])
    );
    assert_eq!(
        sv(Tensor::stack(&[&a, &b], 1)),
        (vec![3, 2], vec![1., 4., 2., 5., 3., 6.])
    );
    assert_eq!(
        sv(Tensor::stack(&[&a, &b], -1)).1,
        vec![1., 4., 2., 5., 3., 6.]
    );
    let m = i64t(&[1, 2, 3, 4], &[2, 2]);
    let mt = m.t().unwrap(); // [[1, 3], [2, 4]]
    let r = Tensor::stack(&[&m, &mt], 1).unwrap();
    assert_eq!(r.shape(), &[2, 2, 2]);
    assert_eq!(vi(&r), vec![1, 2, 1, 3, 3, 4, 2, 4]);
    let r = Tensor::stack(&[&m, &mt, &m], 2).unwrap();
    assert_eq!(r.shape(), &[2, 2, 3]);
    assert_eq!(vi(&r), vec![1, 1, 1, 2, 3, 2, 3, 2, 3, 4, 4, 4]);
}

#[test]
fn chunk_and_split_values() {
    let x = Tensor::arange(5, DType::I64, Device::Cpu).unwrap();
    let parts: Vec<Vec<i64>> = x.chunk(2, 0).unwrap().iter().map(vi).collect();
    assert_eq!(parts, vec![vec![0, 1, 2], vec![3, 4]]);
    let parts: Vec<Vec<i64>> = x.chunk(3, 0).unwrap().iter().map(vi).collect();
    assert_eq!(parts, vec![vec![0, 1], vec![2, 3], vec![4]]);
    // More chunks than elements: fewer chunks come back.
    assert_eq!(x.chunk(8, 0).unwrap().len(), 5);
    let parts: Vec<Vec<i64>> = x.split(&[1, 3, 0, 1], -1).unwrap().iter().map(vi).collect();
    assert_eq!(parts, vec![vec![0], vec![1, 2, 3], vec![], vec![4]]);
    // Views of a 2-d tensor along dim 1, including a transposed input.
    let m = f32t(&[1., 2., 3., 4., 5., 6.], &[2, 3]);
    let c = m.chunk(2, 1).unwrap();
    assert_eq!(
        (c[0].shape(), vf(&c[0])),
        (&[2, 2][..], vec![1., 2., 4., 5.])
    );
    assert_eq!(vf(&c[1]), vec![3., 6.]);
    assert!(c[0].shares_storage_with(&m));
    let s = m.t().unwrap().split(&[1, 1], 1).unwrap(); // columns of m.t() are rows of m
    assert_eq!((vf(&s[0]), vf(&s[1])), (vec![1., 2., 3.], vec![4., 5., 6.]));
}

#[test]
fn index_select_values() {
    let x = f32t(&[1., 2., 3., 4., 5., 6.], &[3, 2]);
    assert_eq!(
        sv(x.index_select(0, &i64t(&[2, 0, 2], &[3]))),
        (vec![3, 2], vec![5., 6., 1., 2., 5., 6.])
    );
    let idx = Tensor::from_vec(vec![1u32, 1, 0], &[3], Device::Cpu).unwrap();
    assert_eq!(
        sv(x.index_select(-1, &idx)),
        (vec![3, 3], vec![2., 2., 1., 4., 4., 3., 6., 6., 5.])
    );
    // Non-contiguous input: x.t() = [[1, 3, 5], [2, 4, 6]].
    let r = x
        .t()
        .unwrap()
        .index_select(1, &i64t(&[2, 0], &[2]))
        .unwrap();
    assert_eq!(vf(&r), vec![5., 1., 6., 2.]);
    // Integers, 3-d, middle dim; an empty index.
    let y = Tensor::arange(12, DType::I64, Device::Cpu)
        .unwrap()
        .reshape(&[2, 3, 2])
        .unwrap();
    let r = y.index_select(1, &i64t(&[2, 2, 0], &[3])).unwrap();
    assert_eq!(vi(&r), vec![4, 5, 4, 5, 0, 1, 10, 11, 10, 11, 6, 7]);
    let r = y.index_select(0, &i64t(&[], &[0])).unwrap();
    assert_eq!(r.shape(), &[0, 3, 2]);
}

#[test]
fn gather_values() {
    let x = f32t(&[1., 2., 3., 4.], &[2, 2]);
    let r = x.gather(1, &i64t(&[0, 0, 1, 0], &[2, 2])).unwrap();
    assert_eq!(vf(&r), vec![1., 1., 4., 3.]);
    let r = x.gather(0, &i64t(&[0, 1, 1, 0], &[2, 2])).unwrap();
    assert_eq!(vf(&r), vec![1., 4., 3., 2.]);
    // Index smaller than the input and longer along dim; transposed input.
    let m = i64t(&[10, 20, 30, 40, 50, 60], &[2, 3]);
    let r = m.gather(1, &i64t(&[2, 2, 0, 1], &[1, 4])).unwrap();
    assert_eq!((r.shape(), vi(&r)), (&[1, 4][..], vec![30, 30, 10, 20]));
    let mt = m.t().unwrap(); // [[10, 40], [20, 50], [30, 60]]
    let r = mt.gather(0, &i64t(&[2, 0, 1, 1], &[2, 2])).unwrap();
    assert_eq!(vi(&r), vec![30, 40, 20, 50]);
}

#[test]
fn scatter_add_values() {
    let base = f32t(&[1.; 6], &[2, 3]);
    let index = i64t(&[0, 0, 2, 1, 1, 1], &[2, 3]);
    let src = f32t(&[1., 2., 3., 4., 5., 6.], &[2, 3]);
    let r = base.scatter_add(1, &index, &src).unwrap();
    assert_eq!(vf(&r), vec![4., 1., 4., 1., 16., 1.]);
    assert_eq!(vf(&base), vec![1.; 6], "the input is left unchanged");
    // src larger than the index: only the covered corner is used.
    let z = Tensor::zeros(&[2, 3], DType::I64, Device::Cpu).unwrap();
    let src = i64t(&[10, 20, 30, 40, 50, 60], &[2, 3]);
    let r = z.scatter_add(0, &i64t(&[1, 0, 1], &[1, 3]), &src).unwrap();
    assert_eq!(vi(&r), vec![0, 20, 0, 10, 0, 30]);
    // Transposed self and src: self.t() = [[0, 0], [0, 0], [0, 0]] + ...
    let s = i64t(&[1, 2, 3, 4, 5, 6], &[2, 3]).t().unwrap(); // [[1, 4], [2, 5], [3, 6]]
    let r = z
        .t()
        .unwrap()
        .scatter_add(1, &i64t(&[1, 1, 0, 0, 1, 0], &[3, 2]), &s)
        .unwrap();
    assert_eq!(vi(&r), vec![0, 5, 7, 0, 6, 3]);
}

#[test]
fn repeated_indices_accumulate_gradients() {
    let x = f32t(&[1., 2., 3., 4., 5., 6.], &[3, 2])
        .set_requires_grad(true)
        .unwrap();
    let y = x.index_select(0, &i64t(&[0, 0, 2, 0], &[4])).unwrap();
    backward_ones(&y);
    assert_eq!(vf(&x.grad().unwrap()), vec![3., 3., 0., 0., 1., 1.]);

    let x = f32t(&[1., 2., 3., 4., 5., 6.], &[2, 3])
        .set_requires_grad(true)
        .unwrap();
    let y = x
        .gather(1, &i64t(&[0, 0, 0, 2, 2, 1, 2, 2], &[2, 4]))
        .unwrap();
    backward_ones(&y);
    assert_eq!(vf(&x.grad().unwrap()), vec![3., 0., 1., 0., 1., 3.]);

    // scatter_add: self gets the gradient as is, src a gather of it.
    let w = f32t(&[1., 2., 3.], &[1, 3]);
    let base = Tensor::zeros(&[2, 3], DType::F32, Device::Cpu)
        .unwrap()
        .set_requires_grad(true)
        .unwrap();
    let src = f32t(&[1., 1., 1., 1.], &[2, 2])
        .set_requires_grad(true)
        .unwrap();
    let out = base
        .scatter_add(1, &i64t(&[2, 2], &[1, 2]), &src)
        .unwrap()
        .mul(&w)
        .unwrap();
    backward_ones(&out);
    assert_eq!(vf(&base.grad().unwrap()), vec![1., 2., 3., 1., 2., 3.]);
    assert_eq!(vf(&src.grad().unwrap()), vec![3., 3., 0., 0.]);
}

#[test]
fn cat_and_stack_gradients_go_to_each_input() {
    let a = f32t(&[1., 2., 3., 4.], &[2, 2])
        .set_requires_grad(true)
        .unwrap();
    let b = f32t(&[5., 6.], &[2, 1]);
    let c = f32t(&[7., 8.], &[2, 1]).set_requires_grad(true).unwrap();
    let w = Tensor::arange(12, DType::F32, Device::Cpu)
        .unwrap()
        .reshape(&[2, 6])
        .unwrap();
    let out = Tensor::cat(&[&a, &b, &c, &a], 1).unwrap().mul(&w).unwrap();
    backward_ones(&out);
    assert_eq!(
        vf(&a.grad().unwrap()),
        vec![0. + 4., 1. + 5., 6. + 10., 7. + 11.]
    );
    assert_eq!(vf(&c.grad().unwrap()), vec![3., 9.]);

    let a = f32t(&[1., 2.], &[2]).set_requires_grad(true).unwrap();
    let w = f32t(&[1., 2., 3., 4., 5., 6.], &[2, 3]);
    let out = Tensor::stack(&[&a, &b.reshape(&[2]).unwrap(), &a], 1)
        .unwrap()
        .mul(&w)
        .unwrap();
    backward_ones(&out);
    assert_eq!(vf(&a.grad().unwrap()), vec![1. + 3., 4. + 6.]);
}

#[test]
fn gradcheck_concat_ops() {
    let (a, b, c) = (rand64(&[2, 3], 1), rand64(&[2, 1], 2), rand64(&[3, 2], 3));
    check(
        |x| Tensor::cat(&[&x[0], &x[1], &x[0]], 1),
        &[a.clone(), b.clone()],
    );
    check(
        |x| Tensor::cat(&[&x[0], &x[1].t()?], 0),
        &[c.clone(), a.clone()],
    );
    // An input that needs no grad (not f64 differentiated: passed as a constant).
    let k = rand64(&[2, 2], 4);
    check(|x| Tensor::cat(&[&k, &x[0]], -1), from_ref(&a));
    check(
        |x| Tensor::stack(&[&x[0], &x[1].t()?, &x[0]], 1),
        &[a.clone(), c.clone()],
    );
    check(
        |x| Tensor::stack(&[&x[0], &k.narrow(1, 0, 1)?], -1),
        from_ref(&b),
    );
    check(
        |x| x[0].chunk(2, 1)?[1].mul(&x[0].chunk(2, 1)?[1]),
        from_ref(&a),
    );
    check(|x| x[0].split(&[1, 2], 0)?[1].t()?.contiguous(), &[c]);
}

#[test]
fn gradcheck_index_ops() {
    let x = rand64(&[3, 4], 5);
    let sel = i64t(&[2, 0, 2, 1, 2], &[5]);
    check(|t| t[0].index_select(0, &sel), from_ref(&x));
    check(
        |t| t[0].t()?.index_select(-1, &t[1]),
        &[x.clone(), sel.clone()],
    );
    let gidx = i64t(&[3, 3, 0, 1, 1, 2, 0, 0, 3, 2, 2, 2], &[3, 4]);
    check(|t| t[0].gather(1, &t[1]), &[x.clone(), gidx.clone()]);
    let gidx0 = i64t(&[2, 2, 0, 1, 1, 2], &[2, 3]);
    check(|t| t[0].gather(0, &gidx0), from_ref(&x));
    let src = rand64(&[3, 4], 6);
    check(
        |t| t[0].scatter_add(1, &gidx, &t[1]),
        &[x.clone(), src.clone()],
    );
    check(
        |t| t[0].scatter_add(0, &gidx0, &t[1]),
        &[x.clone(), src.clone()],
    );
    // Only one of self / src differentiated.
    let xc = x.clone();
    check(|t| xc.scatter_add(0, &gidx0, &t[0]), from_ref(&src));
    check(|t| t[0].scatter_add(0, &gidx0, &src), &[x]);
}

#[test]
fn saves_only_the_index_and_only_when_needed() {
    let ledger = Ledger::new();
    let _in = ledger.enter();
    let saved = || -> Vec<(String, usize)> {
        let mut v = ledger.saved_by_layer(Device::Cpu);
        v.sort();
        v
    };
    let x = Tensor::rand(&[4, 3], DType::F32, Device::Cpu, 7).unwrap();
    let xg = x.clone().set_requires_grad(true).unwrap();
    let idx = i64t(&[0, 3, 3], &[3]);
    let gidx = i64t(&[0, 1, 2, 3, 0, 1], &[2, 3]);

    let _y = x.index_select(0, &idx).unwrap();
    let _z = x.gather(0, &gidx).unwrap();
    let _s = xg
        .scatter_add(0, &gidx, &x.narrow(0, 0, 2).unwrap())
        .unwrap();
    let _c = Tensor::cat(&[&xg, &x], 0).unwrap();
    let _t = Tensor::stack(&[&xg, &x], 0).unwrap();
    assert!(saved().is_empty(), "nothing saved: {:?}", saved());

    let y = xg.index_select(0, &idx).unwrap();
    assert_eq!(saved(), vec![("index_select".to_string(), 24)]);
    drop(y);
    let z = xg.gather(0, &gidx).unwrap();
    assert_eq!(saved(), vec![("gather".to_string(), 48)]);
    drop(z);
    let src = x.narrow(0, 0, 2).unwrap().set_requires_grad(true).unwrap();
    let sidx = i64t(&[3, 3, 3, 0, 0, 0], &[2, 3]);
    let s = x.scatter_add(0, &sidx, &src).unwrap();
    assert_eq!(saved(), vec![("scatter_add".to_string(), 48)]);
    drop(s);
    assert!(saved().is_empty());
}

/// The kind and op of an expected error.
fn err<T: std::fmt::Debug>(r: leangrad::Result<T>) -> (&'static str, &'static str) {
    match r {
        Err(Error::ShapeMismatch { op, .. }) => ("shape", op),
        Err(Error::DTypeMismatch { op, .. }) => ("dtype", op),
        Err(Error::InvalidArgument { op, .. }) => ("arg", op),
        Err(Error::DimOutOfRange { op, .. }) => ("dim", op),
        Err(Error::IndexOutOfRange { op, .. }) => ("index", op),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn concat_errors() {
    let a = f32t(&[1., 2., 3., 4.], &[2, 2]);
    let b = f32t(&[1., 2., 3.], &[1, 3]);
    let (i, v) = (i64t(&[1, 2], &[2]), f32t(&[1., 2.], &[2]));
    assert_eq!(err(Tensor::cat(&[&a, &b], 0)), ("shape", "cat"));
    assert_eq!(err(Tensor::cat(&[&a, &i], 0)), ("dtype", "cat"));
    assert_eq!(err(Tensor::cat(&[&a, &v], 0)), ("shape", "cat"));
    assert_eq!(err(Tensor::cat(&[], 0)), ("arg", "cat"));
    assert_eq!(err(Tensor::cat(&[&a, &a], 2)), ("dim", "cat"));
    assert_eq!(err(Tensor::cat(&[&a, &a], -3)), ("dim", "cat"));
    assert_eq!(err(Tensor::stack(&[&a, &b], 0)), ("shape", "stack"));
    assert_eq!(err(Tensor::stack(&[&a, &a], 3)), ("dim", "stack"));
    assert_eq!(err(Tensor::stack(&[], 0)), ("arg", "stack"));
    assert_eq!(err(a.chunk(0, 0)), ("arg", "chunk"));
    assert_eq!(err(a.chunk(2, 2)), ("dim", "chunk"));
    assert_eq!(err(a.split(&[1, 2], 0)), ("arg", "split"));
    assert_eq!(err(a.split(&[usize::MAX, 3], 0)), ("arg", "split"));
}

#[test]
fn index_errors() {
    let a = f32t(&[1., 2., 3., 4.], &[2, 2]);
    let oob = |r: leangrad::Result<Tensor>, want_op: &str, want: i64| match r {
        Err(Error::IndexOutOfRange { op, index, size }) => {
            assert_eq!((op, index, size), (want_op, want, 2))
        }
        other => panic!("expected IndexOutOfRange, got {other:?}"),
    };
    oob(a.index_select(0, &i64t(&[0, 2], &[2])), "index_select", 2);
    oob(a.index_select(1, &i64t(&[-1], &[1])), "index_select", -1);
    oob(a.gather(1, &i64t(&[0, 1, 5, 0], &[2, 2])), "gather", 5);
    oob(a.gather(0, &i64t(&[-2], &[1, 1])), "gather", -2);
    oob(
        a.scatter_add(0, &i64t(&[3, 0], &[1, 2]), &a),
        "scatter_add",
        3,
    );
    let big = Tensor::from_vec(vec![7u32], &[1], Device::Cpu).unwrap();
    oob(a.index_select(0, &big), "index_select", 7);

    // Wrong index dtype.
    let (fidx, fidx2) = (f32t(&[0., 1.], &[2]), f32t(&[0., 1., 0., 1.], &[2, 2]));
    assert_eq!(err(a.index_select(0, &fidx)), ("dtype", "index_select"));
    assert_eq!(err(a.gather(0, &fidx2)), ("dtype", "gather"));
    assert_eq!(err(a.scatter_add(0, &fidx2, &a)), ("dtype", "scatter_add"));
    // Wrong ranks, shapes, dims and src dtype.
    let (i, idx2) = (i64t(&[1, 0], &[2]), i64t(&[0, 1, 0, 1], &[2, 2]));
    assert_eq!(err(a.index_select(0, &idx2)), ("arg", "index_select"));
    assert_eq!(err(a.index_select(2, &i)), ("dim", "index_select"));
    assert_eq!(err(a.gather(0, &i)), ("arg", "gather"));
    assert_eq!(
        err(a.gather(1, &i64t(&[0; 3], &[3, 1]))),
        ("shape", "gather")
    );
    assert_eq!(err(a.gather(-3, &idx2)), ("dim", "gather"));
    let small = f32t(&[1.], &[1, 1]);
    assert_eq!(
        err(a.scatter_add(0, &idx2, &small)),
        ("shape", "scatter_add")
    );
    let isrc = i64t(&[1, 2, 3, 4], &[2, 2]);
    assert_eq!(
        err(a.scatter_add(0, &idx2, &isrc)),
        ("dtype", "scatter_add")
    );
    assert_eq!(err(a.scatter_add(2, &idx2, &a)), ("dim", "scatter_add"));
}
