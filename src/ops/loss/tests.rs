//! mse_loss's kernels and their CUDA forms (was the inline test of
//! `ops/loss.rs`), and the cross-entropy launch wrappers against the CPU's
//! formulas in f64, an ignored target and label smoothing included (was
//! `cross_entropy_forward_and_backward_follow_the_cpu_formulas` in
//! `tests/cuda_reduce.rs`). Without a GPU the CUDA test prints `skipped: no
//! CUDA device (…)` and passes.

use super::cuda::{cross_entropy_backward, cross_entropy_forward};
use super::{Diff, ScaledMul};
use crate::cuda::testing::device;
use crate::cuda::{CudaBuffer, CudaDevice};
use crate::op_code::BinaryOp;
use crate::primitives::BinaryKernel;
use crate::{DType, Device, Tensor};
use std::sync::Arc;

const FLOATS: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

/// Absolute + relative tolerance of a kernel against the reference in
/// `dtype` (half types compute in f32 on the GPU, round once more).
fn tol(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => 1e-11,
        DType::F32 => 2e-5,
        DType::F16 => 4e-3,
        DType::BF16 => 3e-2,
        _ => 0.0,
    }
}

/// Asserts `got` matches `want` within `tol` (absolute + relative); NaNs
/// and infinities must match exactly.
fn assert_close(what: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let ok = if w.is_finite() {
            (g - w).abs() <= tol * (1.0 + w.abs())
        } else {
            g.is_nan() == w.is_nan() && (w.is_nan() || g == w)
        };
        assert!(ok, "{what}: element {i}: got {g}, want {w} (tol {tol})");
    }
}

/// A seeded CPU tensor of `shape` in `dtype` with values in `[lo, hi)`.
fn cpu_rand(shape: &[usize], lo: f64, hi: f64, dtype: DType, seed: u64) -> Tensor {
    Tensor::rand_range(shape, lo, hi, DType::F64, Device::Cpu, seed)
        .and_then(|t| t.to_dtype(dtype))
        .unwrap()
}

/// A device copy of a contiguous CPU tensor's elements.
fn upload(dev: &Arc<CudaDevice>, t: &Tensor) -> CudaBuffer {
    CudaBuffer::from_cpu_data(dev, &t.storage().cpu().unwrap()).unwrap()
}

fn download(b: &CudaBuffer) -> Vec<f64> {
    b.to_cpu_data().unwrap().to_vec_as::<f64>()
}

/// mse_loss's kernels have their CUDA forms, and `ScaledMul` takes its
/// products in f64 before one rounding (which the CUDA op reproduces).
#[test]
fn kernels_have_their_cuda_forms() {
    assert_eq!(Diff.cuda(), Some(BinaryOp::Sub));
    assert_eq!(ScaledMul(-0.5).cuda(), Some(BinaryOp::ScaledMul(-0.5)));
    // 7 · 7 · (1/7): exactly 7 from f64, 7.0000005 in f32 arithmetic.
    assert_eq!(ScaledMul(1.0 / 7.0).f(7.0f32, 7.0), 7.0);
    assert_ne!(7.0f32 * 7.0 * (1.0 / 7.0f64) as f32, 7.0);
}

#[test]
fn cross_entropy_forward_and_backward_follow_the_cpu_formulas() {
    let Some(dev) = device("cross_entropy") else {
        return;
    };
    let (n, c, eps, ignore) = (37usize, 11usize, 0.1, -100i64);
    let targets: Vec<i64> = (0..n as i64)
        .map(|i| {
            if i % 9 == 4 {
                ignore
            } else {
                (i * 7) % c as i64
            }
        })
        .collect();
    let gt = CudaBuffer::from_slice(&dev, &targets).unwrap();
    for dtype in FLOATS {
        let x = cpu_rand(&[n, c], -3.0, 3.0, dtype, 15);
        let xv = x.to_f64_vec().unwrap();
        let ce =
            cross_entropy_forward(&upload(&dev, &x), &[n, c], 1, &gt, ignore, eps, true).unwrap();
        let mut want = vec![0.0; n];
        let mut probs = vec![0.0; n * c];
        for s in 0..n {
            let row = &xv[s * c..(s + 1) * c];
            let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let lse = m + row.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
            for k in 0..c {
                probs[s * c + k] = (row[k] - lse).exp();
            }
            if targets[s] != ignore {
                let sum: f64 = row.iter().sum();
                want[s] = lse - (1.0 - eps) * row[targets[s] as usize] - eps / c as f64 * sum;
            }
        }
        let count = ce.count.to_vec::<i64>().unwrap()[0] as usize;
        assert_eq!(count, targets.iter().filter(|&&t| t != ignore).count());
        assert_close(
            &format!("ce losses {dtype:?}"),
            &download(&ce.losses),
            &want,
            tol(dtype) * 4.0,
        );
        let p = ce.probs.expect("probs were asked for");
        assert_close(
            &format!("ce probs {dtype:?}"),
            &download(&p),
            &probs,
            tol(dtype),
        );
        let w = CudaBuffer::from_slice(&dev, &[1.0 / count as f64]).unwrap();
        let dx = cross_entropy_backward(&p, &[n, c], 1, &gt, &w, ignore, eps).unwrap();
        let pv = download(&p);
        let want: Vec<f64> = (0..n * c)
            .map(|i| {
                let (s, k) = (i / c, i % c);
                if targets[s] == ignore {
                    return 0.0;
                }
                let hit = if targets[s] == k as i64 {
                    1.0 - eps
                } else {
                    0.0
                };
                (pv[i] - eps / c as f64 - hit) / count as f64
            })
            .collect();
        assert_close(
            &format!("ce backward {dtype:?}"),
            &download(&dx),
            &want,
            tol(dtype),
        );
    }
    let bad = CudaBuffer::from_slice(&dev, &vec![c as i64; n]).unwrap();
    let x = upload(&dev, &cpu_rand(&[n, c], -1.0, 1.0, DType::F32, 16));
    // The launch does not wait: the next read from the device reports the
    // bad target (the first one recorded), and the device stays usable.
    let ce = cross_entropy_forward(&x, &[n, c], 1, &bad, ignore, 0.0, false).unwrap();
    match ce.losses.to_vec::<f64>() {
        Err(crate::Error::IndexOutOfRange { op, index, size }) => {
            assert_eq!((op, index, size), ("cross_entropy", c as i64, c))
        }
        other => panic!("expected IndexOutOfRange, got {other:?}"),
    }
    assert_eq!(ce.count.to_vec::<i64>().unwrap(), vec![0]);
}
