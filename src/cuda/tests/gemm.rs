//! The cuBLAS GEMM wrapper against the CPU matmul: f32 (with and without
//! TF32), bf16, f16, f64; transposed operands without copies; strided
//! batches; beta = 1 accumulation (were `tests/cuda_gemm.rs`). Without a
//! GPU: `skipped: no CUDA device (…)`.

use crate::cuda::gemm::{self, GemmConfig, GemmShape};
use crate::cuda::testing::{assert_close, cpu_rand, cuda_or_skip, download, tol, upload};
use crate::{DType, Tensor};

/// The row-major transpose of a `[r, c]` matrix's values.
fn transpose(v: &[f64], r: usize, c: usize) -> Vec<f64> {
    (0..r * c).map(|i| v[(i % r) * c + i / r]).collect()
}

fn tensor(v: &[f64], shape: &[usize], dtype: DType) -> Tensor {
    Tensor::from_f64_slice(v, shape, dtype, crate::Device::Cpu).unwrap()
}

/// Tolerance for a length-`k` dot product in `dtype` (TF32 has a 10-bit mantissa).
fn gemm_tol(dtype: DType, k: usize, tf32: bool) -> f64 {
    let per = if tf32 { 1e-3 } else { tol(dtype) };
    per * (k as f64).sqrt().max(1.0)
}

#[test]
fn gemm_matches_the_cpu_with_transposes() {
    let dev = cuda_or_skip!("gemm");
    let sizes = [(1, 1, 1), (33, 65, 17), (128, 96, 200), (7, 300, 5)];
    for dtype in [DType::F32, DType::BF16, DType::F16, DType::F64] {
        for (i, &(m, n, k)) in sizes.iter().enumerate() {
            let a = cpu_rand(&[m, k], -1.0, 1.0, dtype, 31 + i as u64);
            let b = cpu_rand(&[k, n], -1.0, 1.0, dtype, 41 + i as u64);
            let want = a.matmul(&b).unwrap().to_f64_vec().unwrap();
            let (av, bv) = (a.to_f64_vec().unwrap(), b.to_f64_vec().unwrap());
            for (trans_a, trans_b) in [(false, false), (true, false), (false, true), (true, true)] {
                let ga = if trans_a {
                    tensor(&transpose(&av, m, k), &[k, m], dtype)
                } else {
                    a.clone()
                };
                let gb = if trans_b {
                    tensor(&transpose(&bv, k, n), &[n, k], dtype)
                } else {
                    b.clone()
                };
                for tf32 in [false, true] {
                    if tf32 && dtype != DType::F32 {
                        continue;
                    }
                    let cfg = GemmConfig {
                        trans_a,
                        trans_b,
                        tf32,
                        ..Default::default()
                    };
                    let c = gemm::matmul(
                        &upload(&dev, &ga),
                        &upload(&dev, &gb),
                        GemmShape::single(m, n, k),
                        &cfg,
                    )
                    .unwrap();
                    let what =
                        format!("{dtype:?} {m}x{n}x{k} ta={trans_a} tb={trans_b} tf32={tf32}");
                    assert_close(&what, &download(&c), &want, gemm_tol(dtype, k, tf32));
                }
            }
        }
    }
}

#[test]
fn batched_gemm_broadcasts_and_beta_one_accumulates_in_place() {
    let dev = cuda_or_skip!("gemm_batched");
    let (batch, m, n, k) = (3, 9, 11, 13);
    for dtype in [DType::F32, DType::BF16] {
        let a = cpu_rand(&[m, k], -1.0, 1.0, dtype, 51);
        let b = cpu_rand(&[batch, k, n], -1.0, 1.0, dtype, 52);
        let c0 = cpu_rand(&[batch, m, n], -1.0, 1.0, dtype, 53);
        let mut want = Vec::new();
        for i in 0..batch {
            let bi = b.to_f64_vec().unwrap()[i * k * n..(i + 1) * k * n].to_vec();
            let prod = a
                .matmul(&tensor(&bi, &[k, n], dtype))
                .unwrap()
                .to_f64_vec()
                .unwrap();
            let ci = &c0.to_f64_vec().unwrap()[i * m * n..(i + 1) * m * n];
            want.extend(prod.iter().zip(ci).map(|(p, c)| 0.5 * p + c));
        }
        let shape = GemmShape {
            stride_a: 0,
            ..GemmShape::batched(batch, m, n, k)
        };
        let mut c = upload(&dev, &c0);
        let cfg = GemmConfig {
            alpha: 0.5,
            beta: 1.0,
            ..Default::default()
        };
        gemm::gemm(&upload(&dev, &a), &upload(&dev, &b), &mut c, shape, &cfg).unwrap();
        assert_close(
            &format!("batched {dtype:?}"),
            &download(&c),
            &want,
            gemm_tol(dtype, k, false) * 2.0,
        );
    }
    // Operands too small for the shape are refused before cuBLAS sees them.
    let a = upload(&dev, &cpu_rand(&[4], 0.0, 1.0, DType::F32, 54));
    let r = gemm::matmul(&a, &a, GemmShape::single(2, 2, 3), &GemmConfig::default());
    assert!(r.is_err());
    let e = gemm::matmul(&a, &a, GemmShape::single(2, 2, 0), &GemmConfig::default()).unwrap();
    assert_eq!(download(&e), vec![0.0; 4]);
}
