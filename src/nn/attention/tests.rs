//! The fused attention softmax launch wrappers against an f64 reference
//! (was `attention_softmax_matches_a_reference` in `tests/cuda_layers.rs`):
//! probabilities with a float mask, causal or not; recomputed from the lse
//! bit for bit; the softmax backward. Without a GPU the test prints
//! `skipped: no CUDA device (…)` and passes.

use super::cuda::{attention_probs, attention_softmax_grad, AttnMask};
use crate::cuda::testing::device;
use crate::cuda::{CudaBuffer, CudaDevice};
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

fn vals(t: &Tensor) -> Vec<f64> {
    t.to_f64_vec().unwrap()
}

#[test]
fn attention_softmax_matches_a_reference() {
    let Some(dev) = device("attention") else {
        return;
    };
    let (rows, lq, lk, scale) = (2 * 3usize, 3usize, 4usize, 0.5);
    for dtype in FLOATS {
        let t = tol(dtype) * 4.0;
        let s = cpu_rand(&[rows, lk], -2.0, 2.0, dtype, 24);
        let sv = vals(&s);
        let mask = cpu_rand(&[lq, lk], -1.0, 0.0, dtype, 25);
        let mv = vals(&mask);
        let gs = upload(&dev, &s);
        let gm = upload(&dev, &mask);
        for causal in [false, true] {
            let (p, lse) =
                attention_probs(&gs, lq, lk, scale, causal, AttnMask::Float(&gm, lq), None)
                    .unwrap();
            let lse = lse.expect("computed lse");
            let mut want = vec![0.0; rows * lk];
            for r in 0..rows {
                let x: Vec<f64> = (0..lk)
                    .map(|j| {
                        if causal && j > r % lq {
                            f64::NEG_INFINITY
                        } else {
                            scale * sv[r * lk + j] + mv[r % lq * lk + j]
                        }
                    })
                    .collect();
                let mx = x.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let sum: f64 = x.iter().map(|v| (v - mx).exp()).sum();
                for j in 0..lk {
                    want[r * lk + j] = (x[j] - mx).exp() / sum;
                }
            }
            assert_close("attention P", &download(&p), &want, t);
            let (p2, _) = attention_probs(
                &gs,
                lq,
                lk,
                scale,
                causal,
                AttnMask::Float(&gm, lq),
                Some(&lse),
            )
            .unwrap();
            assert_eq!(download(&p2), download(&p), "P recomputed from lse");
            let dp = cpu_rand(&[rows, lk], -1.0, 1.0, dtype, 26);
            let ds = attention_softmax_grad(&p, &upload(&dev, &dp), lk, scale).unwrap();
            let (pv, dv) = (download(&p), vals(&dp));
            let want: Vec<f64> = (0..rows * lk)
                .map(|k| {
                    let r = k / lk;
                    let dot: f64 = (0..lk).map(|j| pv[r * lk + j] * dv[r * lk + j]).sum();
                    scale * pv[k] * (dv[k] - dot)
                })
                .collect();
            assert_close("attention dS", &download(&ds), &want, t);
        }
    }
}
