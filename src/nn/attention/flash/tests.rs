//! The fused attention's CUDA kernels (`flash.cu` through `cuda.rs`)
//! against a naive f64 reference computed on the host from the inputs'
//! values: `S = scale·q·kᵀ + mask`, causal, softmax, dropout replayed by
//! `rng::dropout_keep`, `·v`, and the gradients by `flash/mod.rs`'s formulas.
//! Every dtype, rank 3 and 4, views, odd and multi-tile sizes, causal with
//! `lq ≠ lk`, every mask form, dropout, every `needs`, determinism and the
//! empty edges. Without a GPU each test prints `skipped: no CUDA device (…)`
//! and passes (a failure under `LEANGRAD_REQUIRE_CUDA=1`).

use super::super::{RowLse, ScoreGeom};
use super::cuda as flash_cuda;
use super::{FlashGeom, FlashInputs};
use crate::cuda::testing::*;
use crate::dtype::stat_dtype;
use crate::nn::dropout::DropoutDraw;
use crate::rng::dropout_keep;
use crate::{DType, Device, Tensor};

/// The device the tests run on.
const CUDA: Device = Device::Cuda(0);

/// A user mask of a case: its dtype (U8: boolean) and shape kind.
#[derive(Clone, Copy, Debug)]
enum MaskShape {
    /// The scores' full shape.
    Full,
    /// `[lq, lk]`, shared by every batch entry and head.
    Rows,
    /// `[B, 1, 1, lk]` (rank 4) or `[B·H, 1, lk]` (rank 3): per key only.
    Keys,
}

/// One configuration of the fused attention.
#[derive(Clone, Debug)]
struct Case {
    /// q, k, v dtype.
    dtype: DType,
    /// `[B, H, L, D]` when true, else `[B·H, L, D]`.
    rank4: bool,
    /// Batch entries.
    b: usize,
    /// Heads.
    h: usize,
    /// Query heads per key/value head (GQA; 1: plain attention, and always
    /// for rank 3): k and v have `h / group` heads.
    group: usize,
    /// Query length.
    lq: usize,
    /// Key length.
    lk: usize,
    /// Query/key features.
    d: usize,
    /// Value features.
    dv: usize,
    /// Top-left causal mask.
    causal: bool,
    /// q, k, v and dO as views split from `[B, L, H, D]` (non-contiguous).
    permuted: bool,
    /// The user's mask: dtype and shape.
    mask: Option<(DType, MaskShape)>,
    /// Dropout probability (0: none).
    p: f64,
}

impl Case {
    /// A small rank-4 f32 case with odd sizes.
    fn small(dtype: DType) -> Case {
        Case {
            dtype,
            rank4: true,
            b: 2,
            h: 2,
            group: 1,
            lq: 5,
            lk: 7,
            d: 3,
            dv: 2,
            causal: false,
            permuted: false,
            mask: None,
            p: 0.0,
        }
    }

    /// The leading dims.
    fn lead(&self) -> Vec<usize> {
        if self.rank4 {
            vec![self.b, self.h]
        } else {
            vec![self.b * self.h]
        }
    }

    /// The score rows.
    fn rows(&self) -> usize {
        self.b * self.h * self.lq
    }

    /// Key/value heads.
    fn kv_heads(&self) -> usize {
        self.h / self.group
    }

    /// The key/value (batch·head) index query (batch·head) `bh` reads.
    fn kv_of(&self, bh: usize) -> usize {
        bh / self.h * self.kv_heads() + bh % self.h / self.group
    }

    /// The scale on `q·kᵀ`.
    fn scale(&self) -> f64 {
        if self.d == 0 {
            0.5
        } else {
            1.0 / (self.d as f64).sqrt()
        }
    }
}

/// An operand `[.., l, f]` of `h` heads on the device and its values in
/// row-major order; a view split from `[B, L, H, f]` (`[L, B·H, f]`) when
/// permuted.
fn operand_of(c: &Case, h: usize, l: usize, f: usize, seed: u64) -> (Tensor, Vec<f64>) {
    let bh = c.b * h;
    let (base, perm): (Vec<usize>, Vec<usize>) = match (c.rank4, c.permuted) {
        (true, true) => (vec![c.b, l, h, f], vec![0, 2, 1, 3]),
        (true, false) => (vec![c.b, h, l, f], vec![0, 1, 2, 3]),
        (false, true) => (vec![l, bh, f], vec![1, 0, 2]),
        (false, false) => (vec![bh, l, f], vec![0, 1, 2]),
    };
    let cpu = cpu_rand(&base, -1.0, 1.0, c.dtype, seed);
    let want = vals(&cpu.permute(&perm).unwrap());
    let dev = cpu.to_device(CUDA).unwrap().permute(&perm).unwrap();
    if c.permuted && l > 1 && h > 1 && f > 0 {
        assert!(!dev.is_contiguous(), "a permuted operand is a view");
    }
    (dev, want)
}

/// A query-side operand (q, dO): `c.h` heads.
fn operand(c: &Case, l: usize, f: usize, seed: u64) -> (Tensor, Vec<f64>) {
    operand_of(c, c.h, l, f, seed)
}

/// A key-side operand (k, v): `c.kv_heads()` heads.
fn kv_operand(c: &Case, l: usize, f: usize, seed: u64) -> (Tensor, Vec<f64>) {
    operand_of(c, c.kv_heads(), l, f, seed)
}

/// The case's mask on the device and its values broadcast to the scores
/// (`None` without a mask). A U8 `Rows` mask removes all of query 1's keys.
fn mask_of(c: &Case, scores: &[usize]) -> Option<(Tensor, Vec<f64>, bool)> {
    let (dtype, kind) = c.mask?;
    let shape = match (kind, c.rank4) {
        (MaskShape::Full, _) => scores.to_vec(),
        (MaskShape::Rows, _) => vec![c.lq, c.lk],
        (MaskShape::Keys, true) => vec![c.b, 1, 1, c.lk],
        (MaskShape::Keys, false) => vec![c.b * c.h, 1, c.lk],
    };
    let cpu = if dtype == DType::U8 {
        let r = vals(&cpu_rand(&shape, 0.0, 1.0, DType::F64, 77));
        let lk = c.lk.max(1);
        let bits: Vec<f64> = r
            .iter()
            .enumerate()
            .map(|(n, u)| {
                let fully = matches!(kind, MaskShape::Rows) && n / lk == 1;
                f64::from(u8::from(*u > 0.3 && !fully))
            })
            .collect();
        Tensor::from_host_f64(&bits, &shape, DType::U8, Device::Cpu).unwrap()
    } else {
        cpu_rand(&shape, -2.0, 0.5, dtype, 78)
    };
    let full = vals(&cpu.broadcast_to(scores).unwrap());
    Some((cpu.to_device(CUDA).unwrap(), full, dtype == DType::U8))
}

/// The reference results, all in f64.
struct Reference {
    /// The output `[rows, dv]`.
    out: Vec<f64>,
    /// Per-row log-sum-exp.
    lse: Vec<f64>,
    /// Per-row `D = Σ_j P dP`.
    delta: Vec<f64>,
    /// Gradients of q, k, v (row-major, their shapes).
    grads: [Vec<f64>; 3],
}

/// The host values of a case's operands.
struct Values<'a> {
    /// Queries `[bh, lq, d]`.
    q: &'a [f64],
    /// Keys `[bh, lk, d]`.
    k: &'a [f64],
    /// Values `[bh, lk, dv]`.
    v: &'a [f64],
    /// Output gradient `[bh, lq, dv]`.
    d_out: &'a [f64],
    /// Mask values broadcast to the scores, and whether boolean.
    mask: Option<(&'a [f64], bool)>,
}

/// Row `(bh, i)`'s probabilities `P_j`, or `None` when fully masked, with
/// its lse.
fn ref_probs(c: &Case, x: &Values, bh: usize, i: usize) -> (Vec<f64>, f64) {
    let (lq, lk, d) = (c.lq, c.lk, c.d);
    let logits: Vec<f64> = (0..lk)
        .map(|j| {
            if c.causal && j > i {
                return f64::NEG_INFINITY;
            }
            let dot: f64 = (0..d)
                .map(|t| x.q[(bh * lq + i) * d + t] * x.k[(c.kv_of(bh) * lk + j) * d + t])
                .sum();
            let s = c.scale() * dot;
            match x.mask {
                Some((m, true)) if m[(bh * lq + i) * lk + j] == 0.0 => f64::NEG_INFINITY,
                Some((m, false)) => s + m[(bh * lq + i) * lk + j],
                _ => s,
            }
        })
        .collect();
    let mx = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    if mx == f64::NEG_INFINITY {
        return (vec![0.0; lk], mx);
    }
    let sum: f64 = logits.iter().map(|l| (l - mx).exp()).sum();
    let lse = mx + sum.ln();
    (logits.iter().map(|l| (l - lse).exp()).collect(), lse)
}

/// The naive reference of forward and backward.
fn reference(c: &Case, x: &Values) -> Reference {
    let (lq, lk, d, dv) = (c.lq, c.lk, c.d, c.dv);
    let (bhn, kvn) = (c.b * c.h, c.b * c.kv_heads());
    let draw = DropoutDraw {
        seed: 11,
        offset: 5,
        p: c.p,
    };
    let mut r = Reference {
        out: vec![0.0; bhn * lq * dv],
        lse: vec![0.0; bhn * lq],
        delta: vec![0.0; bhn * lq],
        grads: [
            vec![0.0; bhn * lq * d],
            vec![0.0; kvn * lk * d],
            vec![0.0; kvn * lk * dv],
        ],
    };
    for bh in 0..bhn {
        // The key/value head this query head reads (itself without GQA).
        let kh = c.kv_of(bh);
        for i in 0..lq {
            let row = bh * lq + i;
            let (p, lse) = ref_probs(c, x, bh, i);
            r.lse[row] = lse;
            let drop = |j: usize| {
                let keep = c.p == 0.0 || dropout_keep(11, 5, (row * lk + j) as u64, c.p);
                if keep {
                    draw.scale()
                } else {
                    0.0
                }
            };
            let dp: Vec<f64> = (0..lk)
                .map(|j| {
                    let dot: f64 = (0..dv)
                        .map(|t| x.d_out[row * dv + t] * x.v[(kh * lk + j) * dv + t])
                        .sum();
                    drop(j) * dot
                })
                .collect();
            let delta: f64 = (0..lk).map(|j| p[j] * dp[j]).sum();
            r.delta[row] = delta;
            for j in 0..lk {
                let pd = drop(j) * p[j];
                let ds = p[j] * (dp[j] - delta);
                for t in 0..dv {
                    r.out[row * dv + t] += pd * x.v[(kh * lk + j) * dv + t];
                    r.grads[2][(kh * lk + j) * dv + t] += pd * x.d_out[row * dv + t];
                }
                for t in 0..d {
                    r.grads[0][row * d + t] += c.scale() * ds * x.k[(kh * lk + j) * d + t];
                    r.grads[1][(kh * lk + j) * d + t] += c.scale() * ds * x.q[row * d + t];
                }
            }
        }
    }
    r
}

/// What one run of the kernels returned, as f64 values.
#[derive(PartialEq, Debug)]
struct Got {
    /// The output.
    out: Vec<f64>,
    /// The lse.
    lse: Vec<f64>,
    /// The delta workspace after backward (empty when none was passed).
    delta: Vec<f64>,
    /// The gradients where needed.
    grads: [Option<Vec<f64>>; 3],
}

/// Runs forward and backward (`needs`) of case `c` on the device, checks
/// shapes, dtypes and every value against the reference, and returns the
/// values.
fn run_case(c: &Case, needs: [bool; 3]) -> Got {
    let lead = c.lead();
    let with = |a: usize, b: usize| [lead.as_slice(), &[a, b]].concat();
    let scores = with(c.lq, c.lk);
    let (q, qv) = operand(c, c.lq, c.d, 1);
    let (k, kv) = kv_operand(c, c.lk, c.d, 2);
    let (v, vv) = kv_operand(c, c.lk, c.dv, 3);
    let (d_out, ov) = operand(c, c.lq, c.dv, 4);
    let mask = mask_of(c, &scores);
    let geom = FlashGeom {
        score: ScoreGeom {
            lq: c.lq,
            lk: c.lk,
            scale: c.scale(),
            causal: c.causal,
        },
        batch: lead[0],
        heads: if c.rank4 { c.h } else { 1 },
        d: c.d,
        dv: c.dv,
        kv_heads: if c.rank4 { c.kv_heads() } else { 1 },
    };
    let x = FlashInputs {
        q: &q,
        k: &k,
        v: &v,
        mask: mask.as_ref().map(|m| &m.0),
        geom,
        scores: &scores,
        draw: (c.p > 0.0).then_some(DropoutDraw {
            seed: 11,
            offset: 5,
            p: c.p,
        }),
        lse_f32: c.dtype != DType::F64,
    };
    let stat = stat_dtype(c.dtype);
    let (out, lse) = flash_cuda::forward(&x, 0).unwrap();
    assert_eq!(out.shape(), with(c.lq, c.dv).as_slice(), "{c:?}");
    assert_eq!(out.dtype(), c.dtype);
    assert!(matches!(lse, RowLse::Cuda(_)));
    let lse = lse.into_tensor(stat, CUDA).unwrap();
    assert_eq!(lse.shape(), &[c.rows()]);
    let delta = (needs[0] || needs[1]).then(|| Tensor::zeros(&[c.rows()], stat, CUDA).unwrap());
    let grads = flash_cuda::backward(&x, &d_out, &lse, delta.as_ref(), needs, 0).unwrap();
    let got = Got {
        out: vals(&out),
        lse: vals(&lse),
        delta: delta.as_ref().map(vals).unwrap_or_default(),
        grads: [0, 1, 2].map(|n| grads[n].as_ref().map(vals)),
    };
    let values = Values {
        q: &qv,
        k: &kv,
        v: &vv,
        d_out: &ov,
        mask: mask.as_ref().map(|m| (m.1.as_slice(), m.2)),
    };
    let want = reference(c, &values);
    let t = tol(c.dtype) * 4.0;
    assert_close(&format!("O {c:?}"), &got.out, &want.out, t);
    assert_close(&format!("lse {c:?}"), &got.lse, &want.lse, t);
    if delta.is_some() {
        assert_close(&format!("delta {c:?}"), &got.delta, &want.delta, t);
    }
    let shapes = [q.shape(), k.shape(), v.shape()];
    for n in 0..3 {
        assert_eq!(grads[n].is_some(), needs[n], "grad {n} present iff needed");
        if let Some(g) = &grads[n] {
            assert_eq!(g.shape(), shapes[n]);
            assert_eq!(g.dtype(), c.dtype);
            assert!(g.is_contiguous());
            let what = format!("d{} {c:?}", ["q", "k", "v"][n]);
            assert_close(&what, got.grads[n].as_ref().unwrap(), &want.grads[n], t);
        }
    }
    got
}

/// Every gradient.
const ALL_GRADS: [bool; 3] = [true, true, true];

#[test]
fn flash_matches_the_reference_in_every_float_dtype_and_rank() {
    let _dev = cuda_or_skip!("flash dtypes");
    for dtype in FLOATS {
        for rank4 in [true, false] {
            let c = Case {
                rank4,
                mask: Some((dtype, MaskShape::Full)),
                ..Case::small(dtype)
            };
            run_case(&c, ALL_GRADS);
        }
    }
}

#[test]
fn flash_matches_the_reference_over_several_tiles() {
    let _dev = cuda_or_skip!("flash tiles");
    for dtype in [DType::F32, DType::F64, DType::BF16] {
        for causal in [false, true] {
            let c = Case {
                b: 1,
                lq: 130,
                lk: 130,
                d: 64,
                dv: 40,
                causal,
                ..Case::small(dtype)
            };
            run_case(&c, ALL_GRADS);
        }
    }
    // Features past one output chunk (64) and one dot-product chunk (32).
    let c = Case {
        b: 1,
        h: 1,
        lq: 33,
        lk: 70,
        d: 80,
        dv: 72,
        ..Case::small(DType::F32)
    };
    run_case(&c, ALL_GRADS);
}

#[test]
fn flash_reads_permuted_views() {
    let _dev = cuda_or_skip!("flash views");
    for dtype in [DType::F32, DType::F16] {
        for rank4 in [true, false] {
            let c = Case {
                rank4,
                h: 3,
                lq: 6,
                lk: 9,
                d: 8,
                dv: 5,
                permuted: true,
                ..Case::small(dtype)
            };
            run_case(&c, ALL_GRADS);
        }
    }
}

#[test]
fn flash_causal_with_unequal_lengths() {
    let _dev = cuda_or_skip!("flash causal");
    for dtype in [DType::F32, DType::F64] {
        for (lq, lk) in [(9, 5), (5, 9), (70, 100), (100, 70)] {
            let c = Case {
                b: 1,
                lq,
                lk,
                d: 16,
                dv: 8,
                causal: true,
                ..Case::small(dtype)
            };
            run_case(&c, ALL_GRADS);
        }
    }
}

#[test]
fn flash_masks_of_every_kind() {
    let _dev = cuda_or_skip!("flash masks");
    let cases = [
        (DType::F32, DType::F32, MaskShape::Full),
        (DType::F32, DType::F64, MaskShape::Full),
        (DType::BF16, DType::F32, MaskShape::Rows),
        (DType::F64, DType::F16, MaskShape::Keys),
        (DType::F32, DType::U8, MaskShape::Rows),
        (DType::F64, DType::U8, MaskShape::Rows),
        (DType::F16, DType::U8, MaskShape::Keys),
        (DType::F32, DType::F32, MaskShape::Keys),
    ];
    for (dtype, mdt, shape) in cases {
        for rank4 in [true, false] {
            let c = Case {
                rank4,
                mask: Some((mdt, shape)),
                causal: matches!(shape, MaskShape::Keys),
                ..Case::small(dtype)
            };
            run_case(&c, ALL_GRADS);
        }
    }
}

#[test]
fn flash_fully_masked_row_has_minus_infinite_lse_and_zero_output() {
    let _dev = cuda_or_skip!("flash masked row");
    let c = Case {
        mask: Some((DType::U8, MaskShape::Rows)),
        ..Case::small(DType::F32)
    };
    let got = run_case(&c, ALL_GRADS);
    for bh in 0..c.b * c.h {
        let row = bh * c.lq + 1;
        assert_eq!(got.lse[row], f64::NEG_INFINITY);
        assert!(got.out[row * c.dv..(row + 1) * c.dv]
            .iter()
            .all(|&o| o == 0.0));
        let dq = got.grads[0].as_ref().unwrap();
        assert!(dq[row * c.d..(row + 1) * c.d].iter().all(|&g| g == 0.0));
    }
}

#[test]
fn flash_dropout_replays_the_keep_rule() {
    let _dev = cuda_or_skip!("flash dropout");
    for dtype in [DType::F32, DType::F64, DType::F16] {
        for causal in [false, true] {
            let c = Case {
                p: 0.3,
                causal,
                lq: 20,
                lk: 70,
                d: 8,
                dv: 6,
                mask: Some((dtype, MaskShape::Keys)),
                ..Case::small(dtype)
            };
            run_case(&c, ALL_GRADS);
        }
    }
    // p = 1 drops everything: the output and dV are 0, lse is unchanged.
    let c = Case {
        p: 1.0,
        ..Case::small(DType::F32)
    };
    let got = run_case(&c, ALL_GRADS);
    assert!(got.out.iter().all(|&o| o == 0.0));
}

#[test]
fn flash_backward_for_every_needs_combination() {
    let _dev = cuda_or_skip!("flash needs");
    for dtype in [DType::F32, DType::F64] {
        for n in 1..8u32 {
            let needs = [n & 1 != 0, n & 2 != 0, n & 4 != 0];
            let c = Case {
                causal: n % 2 == 0,
                p: if n >= 4 { 0.3 } else { 0.0 },
                mask: Some((DType::U8, MaskShape::Rows)),
                lq: 40,
                lk: 70,
                d: 65,
                dv: 66,
                b: 1,
                ..Case::small(dtype)
            };
            run_case(&c, needs);
        }
    }
}

/// Grouped-query attention: k and v of `h / group` heads read in place at
/// key/value head `h / group`, dK and dV summed over each group (2, 3, and
/// every query head on one key/value head), in every float dtype, causal,
/// every mask kind, dropout and head-split views, against the reference.
#[test]
fn flash_grouped_query_heads_match_the_reference() {
    let _dev = cuda_or_skip!("flash gqa");
    let cases = [
        (
            DType::F32,
            4,
            2,
            false,
            Some((DType::F32, MaskShape::Full)),
            0.0,
            false,
        ),
        (
            DType::F64,
            4,
            4,
            true,
            Some((DType::U8, MaskShape::Rows)),
            0.0,
            false,
        ),
        (
            DType::F16,
            4,
            2,
            false,
            Some((DType::F16, MaskShape::Keys)),
            0.3,
            true,
        ),
        (DType::BF16, 6, 3, true, None, 0.3, true),
        (
            DType::F32,
            3,
            3,
            true,
            Some((DType::U8, MaskShape::Keys)),
            0.3,
            true,
        ),
    ];
    for (dtype, h, group, causal, mask, p, permuted) in cases {
        let c = Case {
            h,
            group,
            causal,
            mask,
            p,
            permuted,
            lq: 6,
            lk: 9,
            d: 8,
            dv: 5,
            ..Case::small(dtype)
        };
        run_case(&c, ALL_GRADS);
    }
}

/// GQA over several query and key tiles (the dK/dV block walks two query
/// heads, each over three query tiles), for every `needs`, and the same
/// bits from run to run.
#[test]
fn flash_grouped_query_heads_over_tiles_and_needs() {
    let _dev = cuda_or_skip!("flash gqa tiles");
    let c = Case {
        b: 1,
        h: 4,
        group: 2,
        lq: 130,
        lk: 70,
        d: 16,
        dv: 8,
        causal: true,
        p: 0.2,
        permuted: true,
        mask: Some((DType::F32, MaskShape::Keys)),
        ..Case::small(DType::F32)
    };
    let a = run_case(&c, ALL_GRADS);
    assert_eq!(a, run_case(&c, ALL_GRADS), "two GQA runs differ");
    // Every other combination (all three just ran).
    for n in 1..7u32 {
        let needs = [n & 1 != 0, n & 2 != 0, n & 4 != 0];
        let small = Case {
            lq: 20,
            lk: 33,
            ..c.clone()
        };
        run_case(&small, needs);
    }
}

#[test]
fn flash_is_bit_identical_from_run_to_run() {
    let _dev = cuda_or_skip!("flash determinism");
    let c = Case {
        b: 1,
        lq: 130,
        lk: 100,
        d: 40,
        dv: 24,
        p: 0.3,
        causal: true,
        permuted: true,
        mask: Some((DType::F32, MaskShape::Full)),
        ..Case::small(DType::F32)
    };
    let a = run_case(&c, ALL_GRADS);
    let b = run_case(&c, ALL_GRADS);
    assert_eq!(a, b, "two runs differ");
}

#[test]
fn flash_empty_edges_need_no_keys_queries_or_features() {
    let _dev = cuda_or_skip!("flash edges");
    // No keys: O = 0, lse = −∞, dQ = 0, empty dK and dV.
    let c = Case {
        lk: 0,
        ..Case::small(DType::F32)
    };
    let got = run_case(&c, ALL_GRADS);
    assert!(got.lse.iter().all(|&l| l == f64::NEG_INFINITY));
    // No queries: empty O and dQ, dK = dV = 0.
    run_case(
        &Case {
            lq: 0,
            ..Case::small(DType::F32)
        },
        ALL_GRADS,
    );
    // No q/k features (scores from the mask alone), no value features.
    for (d, dv) in [(0, 2), (3, 0)] {
        let c = Case {
            d,
            dv,
            mask: Some((DType::F32, MaskShape::Full)),
            ..Case::small(DType::F64)
        };
        run_case(&c, ALL_GRADS);
    }
    // No batch entries.
    run_case(
        &Case {
            b: 0,
            ..Case::small(DType::F32)
        },
        ALL_GRADS,
    );
}

#[test]
fn flash_rejects_inconsistent_operands_with_typed_errors() {
    let _dev = cuda_or_skip!("flash errors");
    let c = Case::small(DType::F32);
    let (q, _) = operand(&c, c.lq, c.d, 1);
    let (k, _) = operand(&c, c.lk, c.d, 2);
    let (v, _) = operand(&c, c.lk, c.dv, 3);
    let scores = vec![c.b, c.h, c.lq, c.lk];
    let geom = FlashGeom {
        score: ScoreGeom {
            lq: c.lq,
            lk: c.lk,
            scale: 0.5,
            causal: false,
        },
        batch: c.b,
        heads: c.h,
        d: c.d,
        dv: c.dv,
        kv_heads: c.h,
    };
    let x = FlashInputs {
        q: &q,
        k: &k,
        v: &v,
        mask: None,
        geom,
        scores: &scores,
        draw: None,
        lse_f32: true,
    };
    let (_, lse) = flash_cuda::forward(&x, 0).unwrap();
    let lse = lse.into_tensor(DType::F32, CUDA).unwrap();
    let bad_d_out = Tensor::zeros(&[c.b, c.h, c.lq, c.dv + 1], DType::F32, CUDA).unwrap();
    assert!(flash_cuda::backward(&x, &bad_d_out, &lse, None, [false, false, true], 0).is_err());
    let (d_out, _) = operand(&c, c.lq, c.dv, 4);
    // dK needs the delta workspace; a wrong lse length is refused.
    assert!(flash_cuda::backward(&x, &d_out, &lse, None, [false, true, false], 0).is_err());
    let short = Tensor::zeros(&[c.rows() - 1], DType::F32, CUDA).unwrap();
    assert!(flash_cuda::backward(&x, &d_out, &short, None, [false, false, true], 0).is_err());
    // A geometry that does not match the operands.
    let wrong = FlashInputs {
        geom: FlashGeom { d: c.d + 1, ..geom },
        ..x
    };
    assert!(flash_cuda::forward(&wrong, 0).is_err());
    let k64 = k.to_dtype(DType::F64).unwrap();
    let mixed = FlashInputs { k: &k64, ..x };
    assert!(flash_cuda::forward(&mixed, 0).is_err());
    // Key/value heads that do not divide the query heads, or that do not
    // match k's and v's own.
    for kv_heads in [3, 1, 0] {
        let grouped = FlashInputs {
            geom: FlashGeom { kv_heads, ..geom },
            ..x
        };
        assert!(flash_cuda::forward(&grouped, 0).is_err(), "{kv_heads}");
    }
}

/// The block size, tiles and output chunk the launches plan with are the
/// kernels' own (`#define`s of `flash.cu`).
#[test]
fn flash_launch_constants_match_the_kernels() {
    let src = include_str!("flash.cu");
    assert_eq!(
        cu_define(src, "LG_FL_THREADS"),
        flash_cuda::THREADS as usize
    );
    assert_eq!(cu_define(src, "LG_FL_TILE"), flash_cuda::tile(DType::F32));
    assert_eq!(
        cu_define(src, "LG_FL_TILE_F64"),
        flash_cuda::tile(DType::F64)
    );
    assert_eq!(cu_define(src, "LG_FL_OUT_CHUNK"), flash_cuda::OUT_CHUNK);
}
