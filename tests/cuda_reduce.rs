//! Softmax and cross-entropy on CUDA against the CPU backend (and the
//! formulas of `src/cpu/loss.rs`), odd sizes included. (The reductions'
//! tests are in the crate: `src/cuda/tests/reduce.rs`.) Without a GPU:
//! `skipped: no CUDA device (…)`.

mod cuda_common;

use cuda_common::{assert_close, download, tol, upload, FLOATS};
use leangrad::cuda::reduce;
use leangrad::cuda::CudaBuffer;
use leangrad::DType;

/// `dx` of softmax (or log-softmax) from `y` and `g` by the formula, in f64.
fn softmax_grad(y: &[f64], g: &[f64], outer: usize, c: usize, inner: usize, log: bool) -> Vec<f64> {
    let mut dx = vec![0.0; y.len()];
    for o in 0..outer {
        for j in 0..inner {
            let at = |k: usize| (o * c + k) * inner + j;
            let s: f64 = (0..c)
                .map(|k| if log { g[at(k)] } else { g[at(k)] * y[at(k)] })
                .sum();
            for k in 0..c {
                let i = at(k);
                dx[i] = if log {
                    g[i] - y[i].exp() * s
                } else {
                    y[i] * (g[i] - s)
                };
            }
        }
    }
    dx
}

#[test]
fn softmax_and_log_softmax_forward_and_backward() {
    let dev = cuda_or_skip!("softmax");
    let shape = [4, 300, 3];
    for dtype in FLOATS {
        let x = cuda_common::cpu_rand(&shape, -4.0, 4.0, dtype, 13);
        let g = cuda_common::cpu_rand(&shape, -1.0, 1.0, dtype, 14);
        for log in [false, true] {
            let y_cpu = if log { x.log_softmax(1) } else { x.softmax(1) }.unwrap();
            let y = reduce::softmax(&upload(&dev, &x), &shape, 1, log).unwrap();
            let what = format!("softmax log={log} {dtype:?}");
            assert_close(
                &what,
                &download(&y),
                &y_cpu.to_f64_vec().unwrap(),
                tol(dtype),
            );
            let dx = reduce::softmax_backward(&y, &upload(&dev, &g), &shape, 1, log).unwrap();
            let want = softmax_grad(&download(&y), &g.to_f64_vec().unwrap(), 4, 300, 3, log);
            assert_close(
                &format!("{what} backward"),
                &download(&dx),
                &want,
                tol(dtype) * 4.0,
            );
        }
    }
}

#[test]
fn cross_entropy_forward_and_backward_follow_the_cpu_formulas() {
    let dev = cuda_or_skip!("cross_entropy");
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
        let x = cuda_common::cpu_rand(&[n, c], -3.0, 3.0, dtype, 15);
        let xv = x.to_f64_vec().unwrap();
        let ce =
            reduce::cross_entropy_forward(&upload(&dev, &x), &[n, c], 1, &gt, ignore, eps, true)
                .unwrap();
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
        assert_eq!(ce.count, targets.iter().filter(|&&t| t != ignore).count());
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
        let w = CudaBuffer::from_slice(&dev, &[1.0 / ce.count as f64]).unwrap();
        let dx = reduce::cross_entropy_backward(&p, &[n, c], 1, &gt, &w, ignore, eps).unwrap();
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
                (pv[i] - eps / c as f64 - hit) / ce.count as f64
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
    let x = upload(
        &dev,
        &cuda_common::cpu_rand(&[n, c], -1.0, 1.0, DType::F32, 16),
    );
    let r = reduce::cross_entropy_forward(&x, &[n, c], 1, &bad, ignore, 0.0, false);
    assert!(
        matches!(r, Err(leangrad::Error::IndexOutOfRange { .. })),
        "{r:?}"
    );
}
