//! The fused attention softmax launch wrappers against an f64 reference
//! (was `attention_softmax_matches_a_reference` in `tests/cuda_layers.rs`):
//! probabilities with a float mask, causal or not; recomputed from the lse
//! bit for bit; the softmax backward. Without a GPU the test prints
//! `skipped: no CUDA device (…)` and passes.

use super::cuda::{attention_probs, attention_softmax_grad, AttnMask};
use super::ScoreGeom;
use crate::cuda::testing::*;

#[test]
fn attention_softmax_matches_a_reference() {
    let Some(dev) = device("attention") else {
        return;
    };
    let (rows, lq, lk, scale) = (2 * 3usize, 3usize, 4usize, 0.5);
    let geom = |causal| ScoreGeom {
        lq,
        lk,
        scale,
        causal,
    };
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
                attention_probs(&gs, geom(causal), AttnMask::Float(&gm, lq), None).unwrap();
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
            let (p2, _) =
                attention_probs(&gs, geom(causal), AttnMask::Float(&gm, lq), Some(&lse)).unwrap();
            assert_eq!(download(&p2), download(&p), "P recomputed from lse");
            let dp = cpu_rand(&[rows, lk], -1.0, 1.0, dtype, 26);
            let ds = attention_softmax_grad(&p, &upload(&dev, &dp), geom(causal)).unwrap();
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
