//! The elementwise launch wrappers against the CPU backend: unary and
//! scalar maps, broadcasting binary ops, strided inputs, comparisons,
//! `where`, casts, strided copies (were `tests/cuda_elementwise.rs`), and
//! `fill` (was in `tests/cuda_buffers.rs`). Without a GPU: `skipped: no
//! CUDA device (…)`.

use crate::cuda::elementwise;
use crate::cuda::testing::{
    assert_close, cpu_rand, cuda_or_skip, dense, download, tol, upload, ALL, FLOATS,
};
use crate::cuda::{broadcast_strides, contiguous_strides, CudaBuffer, Strided};
use crate::op_code::{BinaryOp, CompareOp, UnaryOp};
use crate::{DType, Error, Result, Tensor};

type CpuUnary = fn(&Tensor) -> Result<Tensor>;
type CpuBinary = fn(&Tensor, &Tensor) -> Result<Tensor>;

#[test]
fn unary_and_scalar_ops_match_the_cpu() {
    let dev = cuda_or_skip!("unary");
    let cases: Vec<(UnaryOp, CpuUnary, bool)> = vec![
        (UnaryOp::Neg, |t| t.neg(), false),
        (UnaryOp::Exp, |t| t.exp(), false),
        (UnaryOp::Log, |t| t.log(), true),
        (UnaryOp::Sqrt, |t| t.sqrt(), true),
        (UnaryOp::Abs, |t| t.abs(), false),
        (UnaryOp::Square, |t| t.square(), false),
        (UnaryOp::Recip, |t| t.recip(), true),
        (UnaryOp::Sin, |t| t.sin(), false),
        (UnaryOp::Cos, |t| t.cos(), false),
        (UnaryOp::Tanh, |t| t.tanh(), false),
        (UnaryOp::Sigmoid, |t| t.sigmoid(), false),
        (UnaryOp::Gelu, |t| t.gelu(false), false),
        (UnaryOp::GeluTanh, |t| t.gelu(true), false),
        (UnaryOp::Silu, |t| t.silu(), false),
        (UnaryOp::Hardswish, |t| t.hardswish(), false),
        (UnaryOp::Hardsigmoid, |t| t.hardsigmoid(), false),
        (UnaryOp::Mish, |t| t.mish(), false),
        (UnaryOp::Relu, |t| t.relu(), false),
        (UnaryOp::Rsqrt, |t| t.sqrt()?.recip(), true),
        (UnaryOp::Powf(1.7), |t| t.powf(1.7), true),
        (UnaryOp::LeakyRelu(0.1), |t| t.leaky_relu(0.1), false),
        (UnaryOp::AddScalar(0.5), |t| t.add_scalar(0.5), false),
        (UnaryOp::MulScalar(-3.0), |t| t.mul_scalar(-3.0), false),
        (UnaryOp::DivScalar(7.0), |t| t.div_scalar(7.0), false),
        (UnaryOp::RSubScalar(2.0), |t| t.scalar_sub(2.0), false),
        (
            UnaryOp::MaxScalar(0.25),
            |t| t.clamp(0.25, f64::INFINITY),
            false,
        ),
        (
            UnaryOp::MinScalar(0.25),
            |t| t.clamp(f64::NEG_INFINITY, 0.25),
            false,
        ),
    ];
    for dtype in FLOATS {
        for (i, (op, cpu, positive)) in cases.iter().enumerate() {
            let (lo, hi) = if *positive { (0.2, 2.5) } else { (-3.0, 3.0) };
            let x = cpu_rand(&[5, 201], lo, hi, dtype, i as u64);
            let want = cpu(&x).unwrap().to_f64_vec().unwrap();
            let got = elementwise::unary(*op, &upload(&dev, &x), &dense(&[5, 201])).unwrap();
            assert_close(
                &format!("{op:?} {dtype:?}"),
                &download(&got),
                &want,
                tol(dtype),
            );
        }
    }
}

/// An in-place map (`relu_`, `sigmoid_`…) computes what the out-of-place
/// one does, bit for bit: the same formula, its intermediates rounded to
/// the element type the same way (f16/bf16 once rounded only at the end).
#[test]
fn in_place_maps_equal_out_of_place_bit_for_bit() {
    let dev = cuda_or_skip!("unary in place");
    let ops = [
        UnaryOp::Sigmoid,
        UnaryOp::Silu,
        UnaryOp::Hardswish,
        UnaryOp::Hardsigmoid,
        UnaryOp::Mish,
        UnaryOp::Tanh,
        UnaryOp::Gelu,
        UnaryOp::Relu,
        UnaryOp::Exp,
        UnaryOp::LeakyRelu(0.1),
        UnaryOp::Clamp(-0.3, 0.7),
        UnaryOp::Scale(0.3),
        UnaryOp::Sign,
    ];
    for dtype in FLOATS {
        for (i, op) in ops.iter().enumerate() {
            let x = cpu_rand(&[3, 77], -3.0, 3.0, dtype, 40 + i as u64);
            let out = elementwise::unary(*op, &upload(&dev, &x), &dense(&[3, 77])).unwrap();
            let mut inplace = upload(&dev, &x);
            elementwise::unary_inplace(*op, &mut inplace, 0..231).unwrap();
            let (got, want) = (download(&inplace), download(&out));
            let differ = got
                .iter()
                .zip(&want)
                .filter(|(g, w)| g.to_bits() != w.to_bits())
                .count();
            assert_eq!(
                differ, 0,
                "{op:?} {dtype:?}: {differ} of 231 elements differ"
            );
        }
    }
}

#[test]
fn binary_ops_broadcast_through_strides() {
    let dev = cuda_or_skip!("binary");
    let cases: [(BinaryOp, CpuBinary); 6] = [
        (BinaryOp::Add, |a, b| a.add(b)),
        (BinaryOp::Sub, |a, b| a.sub(b)),
        (BinaryOp::Mul, |a, b| a.mul(b)),
        (BinaryOp::Div, |a, b| a.div(b)),
        (BinaryOp::Max, |a, b| a.maximum(b)),
        (BinaryOp::Min, |a, b| a.minimum(b)),
    ];
    let (sa, sb, out) = ([3, 1, 33], [7, 33], [3, 7, 33]);
    for dtype in FLOATS {
        let a = cpu_rand(&sa, 0.5, 2.0, dtype, 1);
        let b = cpu_rand(&sb, 0.5, 2.0, dtype, 2);
        let (ga, gb) = (upload(&dev, &a), upload(&dev, &b));
        let la = broadcast_strides(&sa, &contiguous_strides(&sa), 0, &out).unwrap();
        let lb = broadcast_strides(&sb, &contiguous_strides(&sb), 0, &out).unwrap();
        for (op, cpu) in cases {
            let want = cpu(&a, &b).unwrap().to_f64_vec().unwrap();
            let got = elementwise::binary(op, &ga, &la, &gb, &lb).unwrap();
            assert_close(
                &format!("{op:?} {dtype:?}"),
                &download(&got),
                &want,
                tol(dtype),
            );
        }
    }
    // Mismatched output shapes are a typed error, not a launch.
    let x = upload(&dev, &cpu_rand(&[4], 0.0, 1.0, DType::F32, 3));
    let r = elementwise::binary(BinaryOp::Add, &x, &dense(&[4]), &x, &dense(&[2, 2]));
    assert!(r.is_err());
}

#[test]
fn nan_propagation_and_clamp_match_the_cpu() {
    let dev = cuda_or_skip!("nan");
    let va = [f64::NAN, 1.0, 2.0, -0.0, 0.1, f64::NAN];
    let vb = [0.0, f64::NAN, 2.0, 0.0, 0.7, f64::NAN];
    for dtype in FLOATS {
        let a = Tensor::from_f64_slice(&va, &[6], dtype, crate::Device::Cpu).unwrap();
        let b = Tensor::from_f64_slice(&vb, &[6], dtype, crate::Device::Cpu).unwrap();
        let (ga, gb, l) = (upload(&dev, &a), upload(&dev, &b), dense(&[6]));
        let cases: [(BinaryOp, CpuBinary); 2] = [
            (BinaryOp::Max, |a, b| a.maximum(b)),
            (BinaryOp::Min, |a, b| a.minimum(b)),
        ];
        for (op, cpu) in cases {
            let want = cpu(&a, &b).unwrap().to_f64_vec().unwrap();
            let got = download(&elementwise::binary(op, &ga, &l, &gb, &l).unwrap());
            assert_close(&format!("{op:?} {dtype:?}"), &got, &want, 0.0);
            // -0 vs +0 ties pick the CPU's operand.
            assert_eq!(got[3].is_sign_negative(), want[3].is_sign_negative());
        }
        // Bounds that are not f16/bf16 values are rounded as the CPU does.
        let want = a.clamp(0.05, 0.65).unwrap().to_f64_vec().unwrap();
        let got = elementwise::unary(UnaryOp::Clamp(0.05, 0.65), &ga, &l).unwrap();
        assert_close(&format!("clamp {dtype:?}"), &download(&got), &want, 0.0);
    }
}

#[test]
fn strided_views_copy_and_accumulate() {
    let dev = cuda_or_skip!("strided");
    for dtype in ALL {
        // The transpose of a [5, 9] matrix, read in place.
        let x = cpu_rand(&[5, 9], 0.0, 100.0, dtype, 4);
        let lt = Strided::new(&[9, 5], &[1, 9], 0).unwrap();
        let got = elementwise::copy_strided(&upload(&dev, &x), &lt).unwrap();
        let v = x.to_f64_vec().unwrap();
        let want: Vec<f64> = (0..45).map(|i| v[(i % 5) * 9 + i / 5]).collect();
        assert_eq!(download(&got), want, "{dtype:?}");
        // A narrowed window with an offset: rows 1..4, columns 2..7.
        let lw = Strided::new(&[3, 5], &[9, 1], 11).unwrap();
        let got = elementwise::copy_strided(&upload(&dev, &x), &lw).unwrap();
        let want: Vec<f64> = (0..15).map(|i| v[11 + (i / 5) * 9 + i % 5]).collect();
        assert_eq!(download(&got), want, "{dtype:?} window");
    }
    for dtype in FLOATS {
        let a = cpu_rand(&[6, 4], -1.0, 1.0, dtype, 5);
        let g = cpu_rand(&[4, 6], -1.0, 1.0, dtype, 6);
        let mut acc = upload(&dev, &a);
        let gt = Strided::new(&[6, 4], &[1, 6], 0).unwrap();
        elementwise::axpy(&mut acc, 1.0, &upload(&dev, &g), &gt).unwrap();
        let gv = g.to_f64_vec().unwrap();
        let want: Vec<f64> = a
            .to_f64_vec()
            .unwrap()
            .iter()
            .enumerate()
            .map(|(i, v)| v + gv[(i % 4) * 6 + i / 4])
            .collect();
        assert_close(
            &format!("axpy {dtype:?}"),
            &download(&acc),
            &want,
            tol(dtype),
        );
        // Contiguous x (the runs kernel; 1,001 elements: a partial run).
        let a = cpu_rand(&[1001], -1.0, 1.0, dtype, 7);
        let g = cpu_rand(&[1001], -1.0, 1.0, dtype, 8);
        let mut runs = upload(&dev, &a);
        let dense = Strided::contiguous(&[1001]).unwrap();
        elementwise::axpy(&mut runs, -0.5, &upload(&dev, &g), &dense).unwrap();
        let (av, gv) = (a.to_f64_vec().unwrap(), g.to_f64_vec().unwrap());
        let want: Vec<f64> = av.iter().zip(&gv).map(|(a, g)| a - 0.5 * g).collect();
        let what = format!("axpy dense {dtype:?}");
        assert_close(&what, &download(&runs), &want, tol(dtype));
    }
}

#[test]
fn comparisons_where_and_casts_match_the_cpu() {
    let dev = cuda_or_skip!("compare");
    let ops = [
        CompareOp::Eq,
        CompareOp::Ne,
        CompareOp::Lt,
        CompareOp::Le,
        CompareOp::Gt,
        CompareOp::Ge,
    ];
    for dtype in ALL {
        let a = cpu_rand(&[301], 0.0, 4.0, dtype, 7);
        let b = cpu_rand(&[301], 0.0, 4.0, dtype, 8);
        let (av, bv) = (a.to_f64_vec().unwrap(), b.to_f64_vec().unwrap());
        let (ga, gb, l) = (upload(&dev, &a), upload(&dev, &b), dense(&[301]));
        for op in ops {
            let f = |x: f64, y: f64| match op {
                CompareOp::Eq => x == y,
                CompareOp::Ne => x != y,
                CompareOp::Lt => x < y,
                CompareOp::Le => x <= y,
                CompareOp::Gt => x > y,
                CompareOp::Ge => x >= y,
            };
            let want: Vec<f64> = av
                .iter()
                .zip(&bv)
                .map(|(&x, &y)| f64::from(u8::from(f(x, y))))
                .collect();
            let got = elementwise::compare(op, &ga, &l, &gb, &l).unwrap();
            assert_eq!(download(&got), want, "{op:?} {dtype:?}");
            let want: Vec<f64> = av.iter().map(|&x| f64::from(u8::from(f(x, 2.0)))).collect();
            let got = elementwise::compare_scalar(op, &ga, &l, 2.0).unwrap();
            assert_eq!(download(&got), want, "{op:?} scalar {dtype:?}");
        }
        let cond = elementwise::compare(CompareOp::Lt, &ga, &l, &gb, &l).unwrap();
        let picked = elementwise::where_cond(&cond, &l, &ga, &l, &gb, &l).unwrap();
        let want: Vec<f64> = av
            .iter()
            .zip(&bv)
            .map(|(&x, &y)| if x < y { x } else { y })
            .collect();
        assert_eq!(download(&picked), want, "where {dtype:?}");
        for to in ALL {
            let x = cpu_rand(&[257], -300.0, 300.0, DType::F64, 9)
                .to_dtype(dtype)
                .unwrap();
            let want = x.to_dtype(to).unwrap().to_f64_vec().unwrap();
            let got = elementwise::cast(&upload(&dev, &x), &dense(&[257]), to).unwrap();
            assert_eq!(got.dtype(), to);
            assert_eq!(download(&got), want, "cast {dtype:?} -> {to:?}");
        }
    }
}

#[test]
fn fill_and_zeros_write_every_element() {
    let dev = cuda_or_skip!("fill_and_zeros");
    let z = CudaBuffer::zeros(&dev, DType::BF16, 1001).unwrap();
    assert!(download(&z).iter().all(|&v| v == 0.0));
    let mut b = CudaBuffer::alloc(&dev, DType::I64, 777).unwrap();
    elementwise::fill(&mut b, -5i64).unwrap();
    assert!(b.to_vec::<i64>().unwrap().iter().all(|&v| v == -5));
    let mut h = CudaBuffer::alloc(&dev, DType::F16, 3).unwrap();
    elementwise::fill(&mut h, half::f16::from_f32(1.5)).unwrap();
    assert_eq!(download(&h), vec![1.5; 3]);
    assert!(matches!(
        elementwise::fill(&mut h, 1.0f32),
        Err(Error::DTypeMismatch { .. })
    ));
}
