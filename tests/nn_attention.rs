//! Scaled-dot-product attention (MultiheadAttention: nn_attention_mha.rs): naive-loop forward
//! references, gradcheck, lean vs save-all policies with exact saved bytes,
//! dropout replay, and error cases.

mod common;

use common::{assert_close, check, check_policies, rand64};
use leangrad::autograd::{backward_with, CollectGrads};
use leangrad::nn::{scaled_dot_product_attention as sdpa, Module, MultiheadAttention, SdpaOptions};
use leangrad::rng::dropout_keep;
use leangrad::{DType, Device, Tensor};

/// Naive f64 attention over `n` heads: additive `mask` over all scores.
#[allow(clippy::too_many_arguments)]
fn naive(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    (n, lq, lk, d, dv): (usize, usize, usize, usize, usize),
    causal: bool,
    mask: Option<&[f64]>,
    keep: &dyn Fn(usize) -> f64,
) -> (Vec<f64>, Vec<f64>) {
    let scale = 1.0 / (d as f64).sqrt();
    let mut out = vec![0.0; n * lq * dv];
    let mut probs = vec![0.0; n * lq * lk];
    for h in 0..n {
        for i in 0..lq {
            let mut s = vec![f64::NEG_INFINITY; lk];
            for (j, sj) in s.iter_mut().enumerate() {
                if causal && j > i {
                    continue;
                }
                let mut acc = 0.0;
                for t in 0..d {
                    acc += q[(h * lq + i) * d + t] * k[(h * lk + j) * d + t];
                }
                *sj = scale * acc + mask.map_or(0.0, |m| m[(h * lq + i) * lk + j]);
            }
            let mx = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = s.iter().map(|x| (x - mx).exp()).sum();
            for j in 0..lk {
                let idx = (h * lq + i) * lk + j;
                let p = if mx == f64::NEG_INFINITY {
                    0.0
                } else {
                    (s[j] - mx).exp() / z
                };
                probs[idx] = p;
                for c in 0..dv {
                    out[(h * lq + i) * dv + c] += p * keep(idx) * v[(h * lk + j) * dv + c];
                }
            }
        }
    }
    (out, probs)
}

fn vals(t: &Tensor) -> Vec<f64> {
    t.to_f64_vec().unwrap()
}

fn none(_: usize) -> f64 {
    1.0
}

#[test]
fn forward_matches_naive_loops() {
    let (b, h, lq, lk, d, dv) = (2, 2, 3, 5, 4, 3);
    let n = b * h;
    let q = rand64(&[b, h, lq, d], 1);
    let k = rand64(&[b, h, lk, d], 2);
    let v = rand64(&[b, h, lk, dv], 3);
    let dims = (n, lq, lk, d, dv);
    let (qv, kv, vv) = (vals(&q), vals(&k), vals(&v));
    // plain and causal
    for causal in [false, true] {
        let o = sdpa(&q, &k, &v, &SdpaOptions::default().causal(causal)).unwrap();
        assert_eq!(o.shape(), &[b, h, lq, dv]);
        let (r, _) = naive(&qv, &kv, &vv, dims, causal, None, &none);
        assert_close(&vals(&o), &r, 1e-12);
    }
    // additive mask [Lq, Lk] broadcast over batch and heads
    let am = rand64(&[lq, lk], 4);
    let full: Vec<f64> = (0..n).flat_map(|_| vals(&am)).collect();
    let o = sdpa(&q, &k, &v, &SdpaOptions::default().mask(am)).unwrap();
    assert_close(
        &vals(&o),
        &naive(&qv, &kv, &vv, dims, false, Some(&full), &none).0,
        1e-12,
    );
    // boolean mask [B, 1, Lq, Lk]; row (b=1, i=2) fully masked → zeros
    let bits: Vec<u8> = (0..b * lq * lk)
        .map(|i| u8::from(i % 3 != 1 && i < lq * lk + 2 * lk))
        .collect();
    let bm = Tensor::from_vec(bits.clone(), &[b, 1, lq, lk], Device::Cpu).unwrap();
    let mut add = Vec::new();
    for bi in 0..b {
        for _ in 0..h {
            for e in 0..lq * lk {
                let keep = bits[bi * lq * lk + e] != 0;
                add.push(if keep { 0.0 } else { f64::NEG_INFINITY });
            }
        }
    }
    let o = sdpa(&q, &k, &v, &SdpaOptions::default().mask(bm).causal(true)).unwrap();
    let r = naive(&qv, &kv, &vv, dims, true, Some(&add), &none).0;
    assert_close(&vals(&o), &r, 1e-12);
    assert!(vals(&o)[(3 * lq + 2) * dv..].iter().all(|&x| x == 0.0));
    // rank 3 and an explicit scale
    let q3 = q.reshape(&[n, lq, d]).unwrap();
    let k3 = k.reshape(&[n, lk, d]).unwrap();
    let v3 = v.reshape(&[n, lk, dv]).unwrap();
    let o = sdpa(&q3, &k3, &v3, &SdpaOptions::default().causal(true)).unwrap();
    assert_eq!(o.shape(), &[n, lq, dv]);
    assert_close(
        &vals(&o),
        &naive(&qv, &kv, &vv, dims, true, None, &none).0,
        1e-12,
    );
    let o = sdpa(&q3, &k3, &v3, &SdpaOptions::default().scale(0.5)).unwrap();
    let q2: Vec<f64> = qv.iter().map(|x| x * 0.5 * (d as f64).sqrt()).collect();
    assert_close(
        &vals(&o),
        &naive(&q2, &kv, &vv, dims, false, None, &none).0,
        1e-12,
    );
}

fn opts_variants() -> Vec<SdpaOptions> {
    let mask = Tensor::from_f64_slice(
        &[
            0.0, -1.0, 0.5, 0.0, 0.2, -0.3, 0.0, 1.0, 0.0, 0.0, -2.0, 0.1,
        ],
        &[3, 4],
        DType::F64,
        Device::Cpu,
    )
    .unwrap();
    vec![
        SdpaOptions::default(),
        SdpaOptions::default().causal(true),
        SdpaOptions::default().mask(mask),
        SdpaOptions::default().dropout(0.3, 11, 8),
        SdpaOptions::default()
            .causal(true)
            .dropout(0.5, 3, 0)
            .scale(0.7),
    ]
}

#[test]
fn gradcheck_q_k_v() {
    let q = rand64(&[1, 2, 3, 2], 5);
    let k = rand64(&[1, 2, 4, 2], 6);
    let v = rand64(&[1, 2, 4, 3], 7);
    for o in opts_variants() {
        check(
            |x| sdpa(&x[0], &x[1], &x[2], &o),
            &[q.clone(), k.clone(), v.clone()],
        );
    }
}

/// Expected (lean, save-all) saved bytes of one attention call on separate
/// f64 leaves: `V` if q or k needs grad, `Q` if k does, `K` if q does, then
/// `P` (n·lq·lk) or, when not more bytes, also `Q`, `K`, the mask and
/// `lse` (n·lq). Save-all: q, k, v, P and a u8 dropout mask, and where the
/// lean policy keeps no P (the fused kernels run for both) the mask and `lse`.
fn expected(
    es: usize,
    combo: u32,
    (n, lq, lk, d, dv): (usize, usize, usize, usize, usize),
    mask_bytes: usize,
    dropout: bool,
) -> (usize, usize) {
    if combo == 0 {
        return (0, 0);
    }
    let (nq, nk) = (combo & 1 != 0, combo & 2 != 0);
    let (qb, kb, vb) = (es * n * lq * d, es * n * lk * d, es * n * lk * dv);
    let (pb, lse) = (es * n * lq * lk, es * n * lq);
    let pick = |c: bool, bytes: usize| if c { bytes } else { 0 };
    let base = pick(nq || nk, vb) + pick(nk, qb) + pick(nq, kb);
    let recompute = base + pick(!nk, qb) + pick(!nq, kb) + mask_bytes + lse;
    let fused = recompute <= base + pb;
    let lean = recompute.min(base + pb);
    // Both policies run the fused kernels where the lean one keeps no P:
    // SaveAll then also keeps what they read (the mask and lse).
    let all = qb + kb + vb + pb + if dropout { n * lq * lk } else { 0 };
    let all = all + if fused { mask_bytes + lse } else { 0 };
    (lean, all)
}

#[test]
fn policies_all_combinations_exact_bytes() {
    // (a) long keys: P is the larger, so it is recomputed; (b) wide heads:
    // Q and K are the larger, so P is saved when they are not kept anyway.
    // f64 (lse in f64) and f32 (lse in f32): recomputed P is bit for bit
    // the saved one, so gradients match SaveAll exactly.
    for (dims, dt) in [
        ((4, 6, 8, 2, 3), DType::F64),
        ((2, 3, 3, 8, 2), DType::F64),
        ((4, 6, 8, 2, 3), DType::F32),
    ] {
        let (n, lq, lk, d, dv) = dims;
        let es = dt.size_in_bytes();
        let r = |shape: &[usize], seed| {
            Tensor::rand_range(shape, -2.0, 2.0, dt, Device::Cpu, seed).unwrap()
        };
        let q = r(&[2, n / 2, lq, d], 21);
        let k = r(&[2, n / 2, lk, d], 22);
        let v = r(&[2, n / 2, lk, dv], 23);
        let m = rand64(&[lq, lk], 24);
        for causal in [false, true] {
            for p in [0.0, 0.4] {
                for mask in [None, Some(m.clone())] {
                    let o = SdpaOptions::default().causal(causal).dropout(p, 9, 4);
                    // the mask is made inside the run, so its ledger sees it
                    let rows = check_policies(
                        &|x: &[Tensor]| {
                            let mut o = o.clone();
                            if let Some(m) = &mask {
                                let mv = m.to_f64_vec()?;
                                o.mask =
                                    Some(Tensor::from_f64_slice(&mv, m.shape(), dt, Device::Cpu)?);
                            }
                            sdpa(&x[0], &x[1], &x[2], &o)
                        },
                        &[q.clone(), k.clone(), v.clone()],
                    );
                    assert_eq!(rows.len(), 8);
                    let mb = mask.as_ref().map_or(0, |_| es * lq * lk);
                    for (combo, lean, all) in rows {
                        let want = expected(es, combo, dims, mb, p > 0.0);
                        assert_eq!(
                            (lean, all),
                            want,
                            "{dt:?} dims {dims:?} combo {combo} causal {causal} p {p} mask {}",
                            mb > 0
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn dropout_replay_grad_v() {
    let (n, lq, lk, d, dv) = (2, 4, 5, 3, 2);
    let (seed, offset, p) = (1234, 40, 0.5);
    let q = rand64(&[1, n, lq, d], 31);
    let k = rand64(&[1, n, lk, d], 32);
    let v = rand64(&[1, n, lk, dv], 33).set_requires_grad(true).unwrap();
    let o = sdpa(&q, &k, &v, &SdpaOptions::default().dropout(p, seed, offset)).unwrap();
    let keep = |i: usize| {
        if dropout_keep(seed, offset, i as u64, p) {
            2.0
        } else {
            0.0
        }
    };
    let (out, probs) = naive(
        &vals(&q),
        &vals(&k),
        &vals(&v),
        (n, lq, lk, d, dv),
        false,
        None,
        &keep,
    );
    assert_close(&vals(&o), &out, 1e-12);
    let g = rand64(o.shape(), 34);
    backward_with(&o, Some(g.clone()), &mut CollectGrads).unwrap();
    let gv = vals(&g);
    let mut dv_ref = vec![0.0; n * lk * dv];
    for h in 0..n {
        for i in 0..lq {
            for j in 0..lk {
                let idx = (h * lq + i) * lk + j;
                for c in 0..dv {
                    dv_ref[(h * lk + j) * dv + c] +=
                        probs[idx] * keep(idx) * gv[(h * lq + i) * dv + c];
                }
            }
        }
    }
    assert_close(&vals(&v.grad().unwrap()), &dv_ref, 1e-12);
    let dropped = (0..n * lq * lk).filter(|&i| keep(i) == 0.0).count();
    assert!(
        dropped > 0 && dropped < n * lq * lk,
        "the draw must drop some"
    );
}

#[test]
fn errors() {
    let q = rand64(&[1, 2, 3, 4], 1);
    let k = rand64(&[1, 2, 5, 3], 2);
    let v = rand64(&[1, 2, 5, 3], 3);
    let o = SdpaOptions::default();
    assert_err!(sdpa(&q, &k, &v, &o), InvalidArgument);
    let k = rand64(&[1, 2, 5, 4], 2);
    assert!(sdpa(&q, &k, &v, &o).is_ok());
    assert_err!(
        sdpa(&q, &k, &v.reshape(&[2, 5, 3]).unwrap(), &o),
        InvalidArgument
    );
    assert_err!(sdpa(&q, &k, &rand64(&[1, 2, 4, 3], 9), &o), InvalidArgument);
    assert_err!(
        sdpa(&q, &k, &v, &o.clone().mask(rand64(&[4, 5], 4))),
        ShapeMismatch
    );
    assert_err!(
        sdpa(&q, &k, &v, &o.clone().dropout(1.5, 0, 0)),
        InvalidArgument
    );
    assert_err!(
        sdpa(&q, &k, &v, &o.clone().dropout(-0.1, 0, 0)),
        InvalidArgument
    );
    assert_err!(
        MultiheadAttention::builder(6, 4)
            .name("m")
            .dtype(DType::F64)
            .build(&Device::Cpu),
        InvalidArgument
    );
    assert_err!(
        MultiheadAttention::builder(6, 2)
            .name("m")
            .dropout(2.0)
            .dtype(DType::F64)
            .build(&Device::Cpu),
        InvalidArgument
    );
    let m = MultiheadAttention::builder(6, 2)
        .name("m")
        .dtype(DType::F64)
        .build(&Device::Cpu)
        .unwrap();
    assert_err!(m.forward(&rand64(&[1, 3, 5], 5)), InvalidArgument);
}

/// Large enough for the parallel row kernels (P has 40 960 elements): the
/// recomputed probabilities are still bit for bit the saved ones.
#[test]
fn policies_parallel_sizes() {
    let dims = (4, 64, 160, 8, 8);
    let (n, lq, lk, d, dv) = dims;
    let r = |shape: &[usize], seed| {
        Tensor::rand_range(shape, -2.0, 2.0, DType::F32, Device::Cpu, seed).unwrap()
    };
    let (q, k, v) = (r(&[n, lq, d], 81), r(&[n, lk, d], 82), r(&[n, lk, dv], 83));
    let o = SdpaOptions::default().causal(true).dropout(0.3, 5, 12);
    let rows = check_policies(&|x: &[Tensor]| sdpa(&x[0], &x[1], &x[2], &o), &[q, k, v]);
    for (combo, lean, all) in rows {
        assert_eq!(
            (lean, all),
            expected(4, combo, dims, 0, true),
            "combo {combo}"
        );
    }
}

/// Reference gradients of attention (f64 loops over `n` heads) from the
/// naive probabilities: `dV = P'ᵀ·dO`, `dP = keep ⊙ dO·Vᵀ`,
/// `dS = P ⊙ (dP − Σ_j P ⊙ dP)`, `dQ = scale·dS·K`, `dK = scale·dSᵀ·Q`.
#[allow(clippy::too_many_arguments)]
fn naive_grads(
    (q, k, v, go): (&[f64], &[f64], &[f64], &[f64]),
    probs: &[f64],
    (n, lq, lk, d, dv): (usize, usize, usize, usize, usize),
    keep: &dyn Fn(usize) -> f64,
) -> [Vec<f64>; 3] {
    let scale = 1.0 / (d as f64).sqrt();
    let (mut gq, mut gk, mut gv) = (vec![0.0; q.len()], vec![0.0; k.len()], vec![0.0; v.len()]);
    for h in 0..n {
        for i in 0..lq {
            let row = |j: usize| (h * lq + i) * lk + j;
            let dp: Vec<f64> = (0..lk)
                .map(|j| {
                    let dot: f64 = (0..dv)
                        .map(|c| go[(h * lq + i) * dv + c] * v[(h * lk + j) * dv + c])
                        .sum();
                    keep(row(j)) * dot
                })
                .collect();
            let dd: f64 = (0..lk).map(|j| probs[row(j)] * dp[j]).sum();
            for j in 0..lk {
                let p = probs[row(j)];
                let ds = scale * p * (dp[j] - dd);
                for c in 0..dv {
                    gv[(h * lk + j) * dv + c] += p * keep(row(j)) * go[(h * lq + i) * dv + c];
                }
                for t in 0..d {
                    gq[(h * lq + i) * d + t] += ds * k[(h * lk + j) * d + t];
                    gk[(h * lk + j) * d + t] += ds * q[(h * lq + i) * d + t];
                }
            }
        }
    }
    [gq, gk, gv]
}

/// The fused kernels over several blocks of queries and keys (130 × 70),
/// from head-split views of `[B, L, H, D]` tensors, with a key mask that
/// removes some keys of batch 0 and every key of batch 1 (fully masked
/// rows: zero output and gradients), causal or not, with dropout: output
/// and all three gradients against f64 loops, in every float dtype.
#[test]
fn fused_blocks_match_loops_for_every_dtype() {
    let (b, h, lq, lk, d, dv) = (2, 3, 130, 70, 16, 8);
    let n = b * h;
    let (seed, offset, p) = (77, 8, 0.25);
    let keep = |i: usize| {
        if dropout_keep(seed, offset, i as u64, p) {
            1.0 / (1.0 - p)
        } else {
            0.0
        }
    };
    let keys: Vec<u8> = (0..b * lk)
        .map(|i| u8::from(i < lk && i % 5 != 2))
        .collect();
    let mut additive = vec![0.0; n * lq * lk];
    for (idx, a) in additive.iter_mut().enumerate() {
        let (head, j) = (idx / (lq * lk), idx % lk);
        if keys[(head / h) * lk + j] == 0 {
            *a = f64::NEG_INFINITY;
        }
    }
    for (dt, tol) in [
        (DType::F64, 1e-10),
        (DType::F32, 2e-5),
        (DType::BF16, 3e-2),
        (DType::F16, 5e-3),
    ] {
        let leaf = |l: usize, c: usize, s: u64| {
            let x = Tensor::rand_range(&[b, l, h, c], -1.5, 1.5, dt, Device::Cpu, s).unwrap();
            x.set_requires_grad(true).unwrap()
        };
        let (ql, kl, vl) = (leaf(lq, d, 91), leaf(lk, d, 92), leaf(lk, dv, 93));
        let heads = |t: &Tensor| t.permute(&[0, 2, 1, 3]).unwrap();
        let mask = Tensor::from_vec(keys.clone(), &[b, 1, 1, lk], Device::Cpu).unwrap();
        for causal in [false, true] {
            let (q, k, v) = (heads(&ql), heads(&kl), heads(&vl));
            let o = SdpaOptions::default()
                .mask(mask.clone())
                .causal(causal)
                .dropout(p, seed, offset);
            let out = sdpa(&q, &k, &v, &o).unwrap();
            let (qv, kv, vv) = (vals(&q), vals(&k), vals(&v));
            let dims = (n, lq, lk, d, dv);
            let (want, probs) = naive(&qv, &kv, &vv, dims, causal, Some(&additive), &keep);
            assert_close(&vals(&out), &want, tol);
            let g = Tensor::rand_range(out.shape(), -1.0, 1.0, dt, Device::Cpu, 94).unwrap();
            backward_with(&out, Some(g.clone()), &mut CollectGrads).unwrap();
            let grads = naive_grads((&qv, &kv, &vv, &vals(&g)), &probs, dims, &keep);
            for (leaf, want) in [&ql, &kl, &vl].into_iter().zip(grads) {
                let got = vals(&heads(&leaf.grad().unwrap()));
                assert_close(&got, &want, tol * 4.0);
                leaf.zero_grad();
            }
        }
    }
}

/// One causal attention of `[1, 2, 1024, 16]` f32 (long sequences, few
/// small heads, so that it stays quick unoptimised) with all three inputs
/// needing grad, on `device` in a fresh ledger: the workspace peak, the
/// saved bytes after forward and the whole peak.
fn gpt2_heads_bytes(device: Device) -> (usize, usize, usize) {
    use leangrad::memory::{Category, Ledger};
    let (b, h, l, d) = (1, 2, 1024, 16);
    let ledger = Ledger::new();
    let _l = ledger.enter();
    let r = |s| {
        Tensor::rand_range(&[b, h, l, d], -1.0, 1.0, DType::F32, device, s)
            .unwrap()
            .set_requires_grad(true)
            .unwrap()
    };
    let (q, k, v) = (r(1), r(2), r(3));
    let out = sdpa(&q, &k, &v, &SdpaOptions::default().causal(true)).unwrap();
    let saved = ledger.live_in(device, Category::Saved);
    let g = out.ones_like().unwrap();
    backward_with(&out, Some(g), &mut CollectGrads).unwrap();
    (
        ledger.peak_in(device, Category::Workspace),
        saved,
        ledger.peak(device),
    )
}

/// The fused path never holds the `L×L` scores: forward keeps no
/// workspace, backward only `D` (4 bytes per score row), where the
/// probabilities alone would be 8 MiB; saved are Q, K, V and `lse`. The
/// meta device predicts the CPU's ledger byte for byte.
#[test]
fn fused_attention_holds_no_scores() {
    let rows = 2 * 1024;
    let qkv = 3 * rows * 16 * 4;
    let cpu = gpt2_heads_bytes(Device::Cpu);
    assert_eq!(cpu.0, 4 * rows, "workspace: D alone");
    assert_eq!(cpu.1, qkv + 4 * rows, "saved: Q, K, V and lse");
    assert_eq!(gpt2_heads_bytes(Device::Meta), cpu);
}
