//! Elementwise binary ops: values, broadcasting, gradients.
mod common;
use common::*;
use leangrad::{DType, Device, Error, Tensor};

#[test]
fn broadcast_values() {
    let a = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3], Device::Cpu).unwrap();
    let b = Tensor::from_vec(vec![10.0f32, 20.0, 30.0], &[3], Device::Cpu).unwrap();
    assert_eq!(
        a.add(&b).unwrap().to_vec::<f32>().unwrap(),
        vec![11., 22., 33., 14., 25., 36.]
    );
    assert_eq!(
        a.sub(&b).unwrap().to_vec::<f32>().unwrap(),
        vec![-9., -18., -27., -6., -15., -24.]
    );
    assert_eq!(
        a.mul(&b).unwrap().to_vec::<f32>().unwrap(),
        vec![10., 40., 90., 40., 100., 180.]
    );
    let c = Tensor::from_vec(vec![2.0f32, 4.0], &[2, 1], Device::Cpu).unwrap();
    assert_eq!(
        a.div(&c).unwrap().to_vec::<f32>().unwrap(),
        vec![0.5, 1.0, 1.5, 1.0, 1.25, 1.5]
    );
}

#[test]
fn shape_and_dtype_errors() {
    let a = Tensor::zeros(&[2, 3], DType::F32, Device::Cpu).unwrap();
    let b = Tensor::zeros(&[4], DType::F32, Device::Cpu).unwrap();
    assert!(matches!(a.add(&b), Err(Error::ShapeMismatch { .. })));
    let c = Tensor::zeros(&[3], DType::F64, Device::Cpu).unwrap();
    assert!(matches!(a.mul(&c), Err(Error::DTypeMismatch { .. })));
    let i = Tensor::zeros(&[3], DType::I64, Device::Cpu).unwrap();
    assert!(matches!(i.add(&i), Err(Error::UnsupportedDType { .. })));
}

#[test]
fn gradcheck_binary_with_broadcasting() {
    let a = rand64(&[3, 4], 1);
    let b = rand64(&[4], 2);
    let pos = rand64_in(&[3, 1], 0.5, 2.0, 3);
    check(|x| x[0].add(&x[1]), &[a.clone(), b.clone()]);
    check(|x| x[0].sub(&x[1]), &[a.clone(), b.clone()]);
    check(|x| x[0].mul(&x[1]), &[a.clone(), b.clone()]);
    check(|x| x[0].div(&x[1]), &[a.clone(), pos.clone()]);
    check(|x| x[1].div(&x[0]), &[pos, b]);
}

#[test]
fn gradcheck_views() {
    let a = rand64(&[2, 3, 4], 4);
    check(
        |x| x[0].transpose(0, 2)?.mul(&x[0].transpose(0, 2)?),
        std::slice::from_ref(&a),
    );
    check(
        |x| x[0].narrow(1, 1, 2)?.reshape(&[4, 4]),
        std::slice::from_ref(&a),
    );
    check(
        |x| x[0].permute(&[1, 2, 0])?.reshape(&[12, 2]),
        std::slice::from_ref(&a),
    );
    check(
        |x| x[0].unsqueeze(1)?.broadcast_to(&[2, 5, 3, 4]),
        std::slice::from_ref(&a),
    );
    check(
        |x| x[0].narrow(2, 0, 1)?.squeeze(2)?.flatten(0, 1),
        std::slice::from_ref(&a),
    );
    check(|x| x[0].t()?.contiguous(), &[a]);
}

#[test]
fn in_place_ops_refuse_tensors_requiring_grad() {
    let w = Tensor::ones(&[3], DType::F32, Device::Cpu)
        .unwrap()
        .into_parameter()
        .unwrap();
    let one = Tensor::ones(&[3], DType::F32, Device::Cpu).unwrap();
    assert!(matches!(
        w.add_(&one),
        Err(Error::InPlaceOnRequiresGrad { .. })
    ));
    {
        let _ng = leangrad::autograd::no_grad();
        w.add_(&one).unwrap();
    }
    assert_eq!(w.to_vec::<f32>().unwrap(), vec![2.0; 3]);
    assert_eq!(w.version(), 1);
}

/// Elementwise maps over permuted, narrowed and broadcast views (rows of
/// one element, short strided rows, long rows split into blocks, and
/// enough elements to run in parallel chunks) equal the same maps over the
/// views' elements read one by one.
#[test]
fn strided_and_broadcast_views_map_like_their_elements() {
    let x = Tensor::randn(&[6, 70, 130], DType::F32, Device::Cpu, 3).unwrap();
    let y = Tensor::randn(&[130, 70, 6], DType::F32, Device::Cpu, 4).unwrap();
    let row = Tensor::randn(&[130], DType::F32, Device::Cpu, 5).unwrap();
    let col = Tensor::randn(&[6, 1, 1], DType::F32, Device::Cpu, 6).unwrap();
    let cases: Vec<(Tensor, Tensor)> = vec![
        (x.clone(), row.clone()),
        (x.clone(), col.clone()),
        (x.clone(), y.permute(&[2, 1, 0]).unwrap()),
        (y.permute(&[2, 1, 0]).unwrap(), col.clone()),
        (
            x.narrow(2, 3, 100).unwrap(),
            y.permute(&[2, 1, 0]).unwrap().narrow(2, 7, 100).unwrap(),
        ),
        (
            row.broadcast_to(&[6, 70, 130]).unwrap(),
            x.permute(&[0, 2, 1]).unwrap().permute(&[0, 2, 1]).unwrap(),
        ),
        (x.narrow(1, 5, 1).unwrap(), row.clone()),
    ];
    for (i, (a, b)) in cases.iter().enumerate() {
        let (va, vb) = (
            a.to_vec::<f32>().unwrap(),
            b.broadcast_to(a.shape()).unwrap().to_vec::<f32>().unwrap(),
        );
        let sum: Vec<f32> = va.iter().zip(&vb).map(|(p, q)| p + q).collect();
        let prod: Vec<f32> = va.iter().zip(&vb).map(|(p, q)| p * q).collect();
        assert_eq!(
            a.add(b).unwrap().to_vec::<f32>().unwrap(),
            sum,
            "case {i}: add"
        );
        assert_eq!(
            a.mul(b).unwrap().to_vec::<f32>().unwrap(),
            prod,
            "case {i}: mul"
        );
        assert_eq!(
            b.broadcast_to(a.shape())
                .unwrap()
                .contiguous()
                .unwrap()
                .to_vec::<f32>()
                .unwrap(),
            vb,
            "case {i}: copy"
        );
        let gelu_dense = Tensor::from_vec(va.clone(), a.shape(), Device::Cpu)
            .unwrap()
            .gelu(false)
            .unwrap();
        assert_eq!(
            a.gelu(false).unwrap().to_vec::<f32>().unwrap(),
            gelu_dense.to_vec::<f32>().unwrap(),
            "case {i}: gelu"
        );
        // In place: the destination is dense, the source a view.
        let d = Tensor::from_vec(va.clone(), a.shape(), Device::Cpu).unwrap();
        d.add_(b).unwrap();
        assert_eq!(d.to_vec::<f32>().unwrap(), sum, "case {i}: add in place");
    }
}
