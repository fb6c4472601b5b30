//! The reduction launch wrappers (sum, mean, max, min, arg-extrema over
//! any dims of any layout) against the CPU backend, NaN included (were
//! the reduction tests of `tests/cuda_reduce.rs`). Without a GPU:
//! `skipped: no CUDA device (…)`.

use crate::cuda::reduce;
use crate::cuda::testing::{
    assert_close, cpu_rand, cuda_or_skip, dense, download, tol, upload, FLOATS,
};
use crate::cuda::{CudaBuffer, Strided};
use crate::op_code::ReduceCode;
use crate::DType;

#[test]
fn sum_mean_max_min_over_dims_match_the_cpu() {
    let dev = cuda_or_skip!("reduce");
    let shape = [3, 37, 5, 2];
    let cases: [&[usize]; 5] = [&[1], &[0, 2], &[3], &[0, 1, 2, 3], &[2]];
    for dtype in FLOATS {
        let x = cpu_rand(&shape, -2.0, 2.0, dtype, 11);
        let gx = upload(&dev, &x);
        for dims in cases {
            let idims: Vec<isize> = dims.iter().map(|&d| d as isize).collect();
            let what = |op: &str| format!("{op} over {dims:?} {dtype:?}");
            let got = reduce::reduce(ReduceCode::Sum, &gx, &dense(&shape), dims).unwrap();
            let want = x.sum(&idims, false).unwrap().to_f64_vec().unwrap();
            assert_close(&what("sum"), &download(&got), &want, tol(dtype) * 4.0);
            let got = reduce::reduce(ReduceCode::Mean, &gx, &dense(&shape), dims).unwrap();
            let want = x.mean(&idims, false).unwrap().to_f64_vec().unwrap();
            assert_close(&what("mean"), &download(&got), &want, tol(dtype) * 4.0);
        }
        for dim in 0..4 {
            let d = dim as isize;
            let got = reduce::reduce(ReduceCode::Max, &gx, &dense(&shape), &[dim]).unwrap();
            assert_eq!(
                download(&got),
                x.max(d, false).unwrap().to_f64_vec().unwrap()
            );
            let got = reduce::reduce(ReduceCode::Min, &gx, &dense(&shape), &[dim]).unwrap();
            assert_eq!(
                download(&got),
                x.min(d, false).unwrap().to_f64_vec().unwrap()
            );
            let got = reduce::arg_reduce(&gx, &dense(&shape), dim, true).unwrap();
            assert_eq!(got.dtype(), DType::I64);
            assert_eq!(
                download(&got),
                x.argmax(d, false).unwrap().to_f64_vec().unwrap()
            );
            let got = reduce::arg_reduce(&gx, &dense(&shape), dim, false).unwrap();
            assert_eq!(
                download(&got),
                x.argmin(d, false).unwrap().to_f64_vec().unwrap()
            );
        }
        // A long run (many threads per output) read through a transpose.
        let y = cpu_rand(&[1000, 3], -1.0, 1.0, dtype, 12);
        let lt = Strided::new(&[3, 1000], &[1, 3], 0).unwrap();
        let got = reduce::reduce(ReduceCode::Sum, &upload(&dev, &y), &lt, &[1]).unwrap();
        let want = y.sum(&[0], false).unwrap().to_f64_vec().unwrap();
        assert_close(
            "sum of a transpose",
            &download(&got),
            &want,
            tol(dtype) * 20.0,
        );
    }
}

#[test]
fn nan_is_the_extremum_as_on_the_cpu() {
    let dev = cuda_or_skip!("reduce_nan");
    let v = [1.0, f64::NAN, 3.0, f64::NAN, -2.0, 5.0, 5.0, 0.0];
    for dtype in FLOATS {
        let x = crate::Tensor::from_f64_slice(&v, &[2, 4], dtype, crate::Device::Cpu).unwrap();
        let gx = upload(&dev, &x);
        for max in [true, false] {
            let want = if max {
                x.argmax(1, false)
            } else {
                x.argmin(1, false)
            };
            let got = reduce::arg_reduce(&gx, &dense(&[2, 4]), 1, max).unwrap();
            assert_eq!(
                download(&got),
                want.unwrap().to_f64_vec().unwrap(),
                "{dtype:?} max={max}"
            );
            let want = if max {
                x.max(1, false)
            } else {
                x.min(1, false)
            };
            let op = if max {
                ReduceCode::Max
            } else {
                ReduceCode::Min
            };
            let got = reduce::reduce(op, &gx, &dense(&[2, 4]), &[1]).unwrap();
            assert_close(
                "max/min with NaN",
                &download(&got),
                &want.unwrap().to_f64_vec().unwrap(),
                0.0,
            );
        }
    }
    let empty = CudaBuffer::alloc(&dev, DType::F32, 0).unwrap();
    assert!(reduce::arg_reduce(&empty, &dense(&[3, 0]), 1, true).is_err());
}
