//! Grouped-query attention (`SdpaOptions::enable_gqa`, PyTorch's
//! `enable_gqa=True`) on the CPU and the meta device: the output and the
//! gradients against the same attention on k and v repeated explicitly
//! (`repeat_interleave` over the heads, Hugging Face's `repeat_kv`) with
//! the repeated gradients summed back over each group, in every float
//! dtype, causal or not, with float and U8 masks, dropout, groups of 2, 3
//! and 4 and one key/value head for all (multi-query), from head-split
//! views of `[B, L, H, D]`; the exact saved bytes (K and V un-repeated),
//! the same bits on 1 and 2 threads, the meta ledger equal to the CPU's,
//! no allocation of a repeated K or V, and the typed errors of bad heads.

mod common;

use common::check_policies;
use leangrad::autograd::{backward_with, CollectGrads};
use leangrad::memory::{Category, EventKind, Ledger};
use leangrad::nn::{scaled_dot_product_attention as sdpa, SdpaOptions};
use leangrad::{DType, Device, Error, Result, Tensor};

/// k or v `[B, Hkv, L, F]` repeated to `[B, Hkv·group, L, F]`, head `h` a
/// copy of head `h / group` (`repeat_interleave(group, dim=1)`): the
/// reference's operand, a differentiable copy whose gradient sums the group.
fn repeat_kv(t: &Tensor, group: usize) -> Result<Tensor> {
    let s = t.shape();
    t.unsqueeze(2)?
        .broadcast_to(&[s[0], s[1], group, s[2], s[3]])?
        .reshape(&[s[0], s[1] * group, s[2], s[3]])
}

/// One grouped attention problem.
#[derive(Clone, Copy, Debug)]
struct Gqa {
    dtype: DType,
    b: usize,
    /// Query heads.
    h: usize,
    /// Key/value heads.
    hkv: usize,
    lq: usize,
    lk: usize,
    d: usize,
    dv: usize,
    /// The operands are `[B, L, H, F]` tensors viewed as `[B, H, L, F]`.
    permuted: bool,
}

impl Gqa {
    /// A small f64 problem: two query bands (70 queries), odd sizes.
    fn new(dtype: DType, h: usize, hkv: usize) -> Gqa {
        Gqa {
            dtype,
            b: 2,
            h,
            hkv,
            lq: 70,
            lk: 37,
            d: 8,
            dv: 6,
            permuted: false,
        }
    }

    /// A seeded leaf of `heads` heads, `l` rows and `f` features on
    /// `device`: `[B, L, H, F]` when permuted (the view is taken by
    /// [`Gqa::heads`]), else `[B, H, L, F]`.
    fn leaf(&self, heads: usize, l: usize, f: usize, seed: u64, device: Device) -> Tensor {
        let shape = if self.permuted {
            [self.b, l, heads, f]
        } else {
            [self.b, heads, l, f]
        };
        Tensor::rand_range(&shape, -1.5, 1.5, self.dtype, device, seed)
            .unwrap()
            .set_requires_grad(true)
            .unwrap()
    }

    /// q, k, v leaves on `device`.
    fn leaves(&self, device: Device) -> [Tensor; 3] {
        [
            self.leaf(self.h, self.lq, self.d, 1, device),
            self.leaf(self.hkv, self.lk, self.d, 2, device),
            self.leaf(self.hkv, self.lk, self.dv, 3, device),
        ]
    }

    /// A leaf as attention reads it, `[B, H, L, F]` (a view when permuted).
    fn heads(&self, t: &Tensor) -> Tensor {
        if self.permuted {
            t.permute(&[0, 2, 1, 3]).unwrap()
        } else {
            t.clone()
        }
    }

    /// Query heads per key/value head.
    fn group(&self) -> usize {
        self.h / self.hkv
    }
}

/// The output and the leaves' gradients (q, k, v) of grouped attention
/// (`reference`: attention on k and v repeated) for the output gradient
/// seeded by 7.
fn run(c: &Gqa, opts: &SdpaOptions, reference: bool) -> [Tensor; 4] {
    let leaves = c.leaves(Device::Cpu);
    let [q, k, v] = leaves.each_ref().map(|t| c.heads(t));
    let out = if reference {
        let g = c.group();
        let (k, v) = (repeat_kv(&k, g).unwrap(), repeat_kv(&v, g).unwrap());
        sdpa(&q, &k, &v, opts).unwrap()
    } else {
        sdpa(&q, &k, &v, &opts.clone().gqa(true)).unwrap()
    };
    assert_eq!(out.shape(), &[c.b, c.h, c.lq, c.dv]);
    let gy = Tensor::rand_range(out.shape(), -1.0, 1.0, c.dtype, Device::Cpu, 7).unwrap();
    backward_with(&out, Some(gy), &mut CollectGrads).unwrap();
    let [gq, gk, gv] = leaves.map(|l| l.grad().expect("a gradient"));
    [out.detach(), gq, gk, gv]
}

fn vals(t: &Tensor) -> Vec<f64> {
    t.to_f64_vec().unwrap()
}

/// `got` within `tol` of `want`, relative to `want`'s largest magnitude.
fn assert_near(what: &str, got: &Tensor, want: &Tensor, tol: f64) {
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    let (g, w) = (vals(got), vals(want));
    let big = w.iter().fold(1e-30f64, |m, x| m.max(x.abs()));
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        assert!(
            (a - b).abs() <= tol * big,
            "{what}: element {i}: {a} vs {b} (largest {big})"
        );
    }
    assert!(w.iter().any(|&x| x != 0.0), "{what}: all zero");
}

/// The dtype's tolerance on dK and dV against the reference, whose
/// per-head gradients are rounded to the dtype before they are summed.
fn tol(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => 1e-13,
        DType::F32 => 1e-5,
        DType::F16 => 4e-3,
        _ => 3e-2,
    }
}

/// A U8 mask `[lq, lk]`: a scattered pattern, and query 1 sees no key
/// (its output and gradients are zero).
fn bool_mask(lq: usize, lk: usize) -> Tensor {
    let m: Vec<u8> = (0..lq * lk)
        .map(|e| u8::from(e / lk != 1 && (e * 7) % 5 != 0))
        .collect();
    Tensor::from_vec(m, &[lq, lk], Device::Cpu).unwrap()
}

/// The output and dQ equal the reference's bit for bit (the same fused
/// arithmetic on the same packed values: K and V read at head `h / group`
/// are the repeated heads' values); dK and dV, one sum over the group's
/// query heads in the compute type where the reference rounds each head's
/// gradient to the dtype first, agree within the dtype's rounding.
#[test]
fn gqa_matches_attention_on_repeated_keys_and_values() {
    let (lq, lk) = (70, 37);
    let fm = |dt| Tensor::rand_range(&[lq, lk], -2.0, 0.5, dt, Device::Cpu, 5).unwrap();
    let drop = |o: SdpaOptions| o.dropout(0.3, 11, 4);
    #[allow(clippy::type_complexity)]
    let cases: Vec<(DType, usize, usize, bool, SdpaOptions)> = vec![
        (DType::F64, 4, 2, false, SdpaOptions::default()),
        (DType::F64, 4, 1, true, SdpaOptions::default().causal(true)),
        (
            DType::F64,
            8,
            2,
            true,
            drop(SdpaOptions::default().mask(fm(DType::F64))),
        ),
        (
            DType::F64,
            6,
            2,
            false,
            SdpaOptions::default().mask(bool_mask(lq, lk)),
        ),
        (
            DType::F32,
            4,
            2,
            true,
            SdpaOptions::default().mask(fm(DType::F32)),
        ),
        (
            DType::F32,
            4,
            1,
            false,
            drop(SdpaOptions::default().causal(true)),
        ),
        (
            DType::F32,
            8,
            2,
            true,
            drop(SdpaOptions::default().mask(bool_mask(lq, lk))),
        ),
        (
            DType::F32,
            6,
            3,
            false,
            SdpaOptions::default().causal(true).scale(0.3),
        ),
        (
            DType::F16,
            4,
            2,
            true,
            drop(SdpaOptions::default().causal(true)),
        ),
        (
            DType::F16,
            4,
            1,
            false,
            SdpaOptions::default().mask(bool_mask(lq, lk)),
        ),
        (
            DType::BF16,
            8,
            2,
            true,
            SdpaOptions::default().mask(fm(DType::F32)),
        ),
        (
            DType::BF16,
            4,
            4,
            false,
            drop(SdpaOptions::default().causal(true)),
        ),
    ];
    for (dtype, h, hkv, permuted, opts) in cases {
        let c = Gqa {
            permuted,
            ..Gqa::new(dtype, h, hkv)
        };
        let what = format!("{c:?} causal {} p {}", opts.causal, opts.dropout_p);
        let got = run(&c, &opts, false);
        let want = run(&c, &opts, true);
        assert_eq!(vals(&got[0]), vals(&want[0]), "{what}: output");
        assert_eq!(vals(&got[1]), vals(&want[1]), "{what}: dq");
        assert_near(&format!("{what}: dk"), &got[2], &want[2], tol(dtype));
        assert_near(&format!("{what}: dv"), &got[3], &want[3], tol(dtype));
    }
}

/// Finite differences agree with the gradients of q, k and v (f64), for
/// groups of 2 and of every query head (one key/value head), plain, causal
/// with a mask, and with dropout.
#[test]
fn gqa_gradcheck() {
    let mask = common::rand64(&[3, 4], 8);
    for (h, hkv) in [(4, 2), (3, 1)] {
        let q = common::rand64(&[1, h, 3, 2], 5);
        let k = common::rand64(&[1, hkv, 4, 2], 6);
        let v = common::rand64(&[1, hkv, 4, 3], 7);
        for o in [
            SdpaOptions::default(),
            SdpaOptions::default().causal(true).mask(mask.clone()),
            SdpaOptions::default().dropout(0.3, 11, 8),
        ] {
            let o = o.gqa(true);
            common::check(
                |x| sdpa(&x[0], &x[1], &x[2], &o),
                &[q.clone(), k.clone(), v.clone()],
            );
        }
    }
}

/// `H = Hkv` with the flag is plain attention, bit for bit (both paths:
/// the fused kernels and, for short keys and wide heads, the saved `P`).
#[test]
fn gqa_flag_with_equal_heads_changes_nothing() {
    for (lq, lk, d) in [(70, 37, 8), (3, 4, 33)] {
        let c = Gqa {
            lq,
            lk,
            d,
            ..Gqa::new(DType::F32, 4, 4)
        };
        let opts = SdpaOptions::default().causal(true);
        let plain = run(&c, &opts, true);
        let flagged = run(&c, &opts, false);
        for (a, b) in plain.iter().zip(&flagged) {
            assert_eq!(vals(a), vals(b), "{c:?}");
        }
    }
}

/// Expected (lean, save-all) saved bytes of grouped attention on f32
/// leaves (bit `i` of `combo`: input `i` requires grad): always the fused
/// path, so lean keeps `Q`, `K`, the mask, `lse` and, for q or k, `V`,
/// with `K` and `V` their own (un-repeated) size; save-all adds `P` (and
/// its U8 dropout mask) over the query heads.
fn expected(c: &Gqa, combo: u32, mask_bytes: usize, dropout: bool) -> (usize, usize) {
    if combo == 0 {
        return (0, 0);
    }
    let es = 4;
    let (qb, kb, vb) = (
        es * c.b * c.h * c.lq * c.d,
        es * c.b * c.hkv * c.lk * c.d,
        es * c.b * c.hkv * c.lk * c.dv,
    );
    let scores = c.b * c.h * c.lq * c.lk;
    let lse = es * c.b * c.h * c.lq;
    let v = if combo & 3 != 0 { vb } else { 0 };
    let lean = qb + kb + v + mask_bytes + lse;
    let all = qb + kb + vb + mask_bytes + lse + es * scores + if dropout { scores } else { 0 };
    (lean, all)
}

/// The exact saved bytes of every requires-grad combination under both
/// policies (and the same bits under both), for groups of 2 and 4, with
/// and without a mask and dropout: K and V are saved as they are.
#[test]
fn gqa_saves_keys_and_values_unrepeated() {
    for (h, hkv) in [(4, 2), (4, 1)] {
        let c = Gqa::new(DType::F32, h, hkv);
        let [q, k, v] = c.leaves(Device::Cpu).map(|t| t.detach());
        for (masked, p) in [(false, 0.0), (true, 0.4)] {
            let rows = check_policies(
                &|x: &[Tensor]| {
                    let mut o = SdpaOptions::default().gqa(true).dropout(p, 9, 4);
                    if masked {
                        // Made inside the run, so that its ledger sees it.
                        o = o.mask(bool_mask(c.lq, c.lk));
                    }
                    sdpa(&x[0], &x[1], &x[2], &o)
                },
                &[q.clone(), k.clone(), v.clone()],
            );
            assert_eq!(rows.len(), 8);
            let mb = if masked { c.lq * c.lk } else { 0 };
            for (combo, lean, all) in rows {
                assert_eq!(
                    (lean, all),
                    expected(&c, combo, mb, p > 0.0),
                    "{c:?} combo {combo} mask {masked} p {p}"
                );
            }
        }
    }
}

/// The values' bit patterns.
fn bits(t: &Tensor) -> Vec<u64> {
    vals(t).iter().map(|v| v.to_bits()).collect()
}

/// Backward runs one task per key/value head that sums its group in order:
/// the same bits in pools of 1 and 2 threads (several tasks, several query
/// bands each).
#[test]
fn gqa_gives_the_same_bits_on_one_and_two_threads() {
    let c = Gqa {
        b: 2,
        lq: 130,
        lk: 100,
        permuted: true,
        ..Gqa::new(DType::F32, 8, 2)
    };
    let opts = SdpaOptions::default()
        .causal(true)
        .dropout(0.2, 3, 1)
        .mask(bool_mask(130, 100));
    let on = |threads: usize| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("a rayon pool")
            .install(|| run(&c, &opts, false).map(|t| bits(&t)))
    };
    let one = on(1);
    assert_eq!(one, on(2), "1 vs 2 threads");
}

/// What a GQA forward and backward on `device` did to a fresh ledger:
/// the timeline (the device left out) and the device's report.
#[allow(clippy::type_complexity)]
fn ledger_of(
    c: &Gqa,
    device: Device,
) -> (
    Vec<(EventKind, usize, Category, Option<Category>, usize)>,
    leangrad::memory::DeviceReport,
) {
    let ledger = Ledger::new().record_timeline(true);
    {
        let _l = ledger.enter();
        let leaves = c.leaves(device);
        let [q, k, v] = leaves.each_ref().map(|t| c.heads(t));
        let opts = SdpaOptions::default()
            .gqa(true)
            .causal(true)
            .dropout(0.1, 2, 0);
        let out = sdpa(&q, &k, &v, &opts).unwrap();
        backward_with(&out, Some(out.ones_like().unwrap()), &mut CollectGrads).unwrap();
        for l in &leaves {
            assert_eq!(l.grad().unwrap().device(), device);
        }
    }
    let events = ledger
        .timeline()
        .into_iter()
        .map(|e| (e.kind, e.bytes, e.category, e.from, e.live))
        .collect();
    let mut report = ledger.report().devices;
    assert_eq!(report.len(), 1, "one device");
    let mut r = report.remove(0);
    r.device = String::new();
    (events, r)
}

/// The meta device predicts the CPU's ledger event for event; and no
/// allocation is the size of a repeated K or V (the sizes are chosen so
/// that no other tensor has those sizes).
#[test]
fn gqa_meta_ledger_equals_the_cpu_ledger_and_nothing_is_repeated() {
    for permuted in [false, true] {
        let c = Gqa {
            lq: 64,
            lk: 48,
            dv: 5,
            permuted,
            ..Gqa::new(DType::F32, 8, 2)
        };
        let cpu = ledger_of(&c, Device::Cpu);
        let meta = ledger_of(&c, Device::Meta);
        assert_eq!(cpu, meta, "{c:?}");
        let repeated = [4 * c.b * c.h * c.lk * c.d, 4 * c.b * c.h * c.lk * c.dv];
        let sizes: Vec<usize> = cpu.0.iter().map(|e| e.1).collect();
        assert!(
            sizes.iter().all(|s| !repeated.contains(s)),
            "an allocation of a repeated K or V: {sizes:?}"
        );
        // Saved at the end of forward: |Q| + |K| + |V| + |lse|, un-repeated.
        let (q, k, v) = (
            4 * c.b * c.h * c.lq * c.d,
            4 * c.b * c.hkv * c.lk * c.d,
            4 * c.b * c.hkv * c.lk * c.dv,
        );
        assert_eq!(cpu.1.peak.saved, q + k + v + 4 * c.b * c.h * c.lq);
    }
}

/// The message of an `InvalidArgument` naming the op.
fn message(r: Result<Tensor>) -> String {
    match r {
        Err(e @ Error::InvalidArgument { op, .. }) => {
            assert_eq!(op, "scaled_dot_product_attention");
            e.to_string()
        }
        other => panic!(
            "not an InvalidArgument: {:?}",
            other.map(|t| t.shape().to_vec())
        ),
    }
}

#[test]
fn bad_head_counts_are_typed_errors() {
    let t = |shape: &[usize]| Tensor::zeros(shape, DType::F32, Device::Cpu).unwrap();
    let (q, k, v) = (t(&[2, 6, 5, 4]), t(&[2, 2, 7, 4]), t(&[2, 2, 7, 3]));
    let off = SdpaOptions::default();
    let on = SdpaOptions::default().gqa(true);
    // Heads differ without the flag.
    let m = message(sdpa(&q, &k, &v, &off));
    assert!(m.contains("6 heads") && m.contains('2'), "{m}");
    assert!(m.contains("scaled_dot_product_attention"), "{m}");
    // The flag groups them: [2, 6, 5, 3].
    assert_eq!(sdpa(&q, &k, &v, &on).unwrap().shape(), &[2, 6, 5, 3]);
    // 6 query heads are not a multiple of 4.
    let (k4, v4) = (t(&[2, 4, 7, 4]), t(&[2, 4, 7, 3]));
    let m = message(sdpa(&q, &k4, &v4, &on));
    assert!(
        m.contains('6') && m.contains('4') && m.contains("multiple"),
        "{m}"
    );
    // No key/value heads for 6 query heads.
    let (k0, v0) = (t(&[2, 0, 7, 4]), t(&[2, 0, 7, 3]));
    assert!(message(sdpa(&q, &k0, &v0, &on)).contains("multiple"));
    // k and v heads differ.
    let m = message(sdpa(&q, &k, &t(&[2, 3, 7, 3]), &on));
    assert!(m.contains("k has 2 heads and v 3"), "{m}");
    // Rank 3 has no head dim: the batch dims must match, flag or not.
    let (q3, k3, v3) = (t(&[6, 5, 4]), t(&[2, 7, 4]), t(&[2, 7, 3]));
    let m = message(sdpa(&q3, &k3, &v3, &on));
    assert!(m.contains("[6, 5, 4]") && m.contains("[2, 7, 4]"), "{m}");
    assert!(m.contains("enable_gqa"), "{m}");
    message(sdpa(&q3, &k3, &v3, &off));
    // Rank 3 with equal batch dims and the flag: plain attention.
    let same = sdpa(&t(&[2, 5, 4]), &k3, &v3, &on).unwrap();
    assert_eq!(same.shape(), &[2, 5, 3]);
    // Batch dims differ on rank 4.
    message(sdpa(&q, &t(&[1, 2, 7, 4]), &t(&[1, 2, 7, 3]), &on));
}
