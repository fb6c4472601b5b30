//! The attention softmax rows of f32 scores in f32 vectors: the logits
//! `scale·s (+ mask)`, their maximum, `lse = max + ln Σ e^(x − max)` (the
//! sum and the logarithm in f64, `lse` rounded to f32 as it is saved),
//! `P = e^(x − lse)`, and the backward `scale·P ⊙ (dP − Σ dP ⊙ P)` (the
//! dot product in f64). PyTorch computes these rows in f32 too; the f64
//! path of `cpu.rs` took four times as long per exponential.
//!
//! Every function here gives the same bits on every CPU: the exponential
//! uses fused multiply-adds (`mul_add`, a hardware FMA where the CPU has
//! one and the same correctly rounded result where it does not), and the
//! sums run over eight lanes in a fixed order. So backward's `P` rebuilt
//! from the saved `lse` is forward's `P` bit for bit.

use crate::primitives::avx2_fma;

/// `1.5·2²³`: adding it to a float rounds it to an integer held in the low
/// mantissa bits.
const SHIFT: f32 = 12_582_912.0;
/// ln 2 in two parts (Cody–Waite): `LN2_HI` has 9 significant bits, so
/// `n·LN2_HI` is exact for `|n| ≤ 128`.
const LN2_HI: f32 = 355.0 / 512.0;
/// `ln 2 − LN2_HI`.
const LN2_LO: f32 = -2.121_944_4e-4;
/// Below this `e^x` is under f32's smallest normal: the result is 0.
const EXP_LO: f32 = -87.33;
/// Arguments are clamped here (softmax arguments are at most a rounding
/// error above 0).
const EXP_HI: f32 = 88.0;
/// `1/7!`, where Horner's recurrence over [`INV_FACT_6_TO_2`] starts.
const INV_FACT_7: f32 = 1.0 / 5_040.0;
/// `1/k!` for `k = 6` down to `2`.
const INV_FACT_6_TO_2: [f32; 5] = [1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5];

/// `e^x` within 1 ulp of the correctly rounded value for `x ∈ [−87.33, 88]`
/// (reduction `x = n·ln 2 + r`, `|r| ≤ ln 2 / 2`, then `2ⁿ·(1 + r + r²·q(r))`
/// with `q` the Taylor series to `r⁵/7!`: truncation below 5e-9); `0` below
/// −87.33 (and for −∞); `e^88` above 88; NaN stays NaN. No branches or
/// calls, so a loop of it vectorises.
#[inline(always)]
pub(super) fn exp_f32(x: f32) -> f32 {
    let xc = x.clamp(EXP_LO, EXP_HI);
    let k = xc.mul_add(std::f32::consts::LOG2_E, SHIFT);
    let n = k - SHIFT;
    let r = n.mul_add(-LN2_HI, xc);
    let r = n.mul_add(-LN2_LO, r);
    let mut q = INV_FACT_7;
    for c in INV_FACT_6_TO_2 {
        q = q.mul_add(r, c);
    }
    let em1 = (r * r).mul_add(q, r);
    let ni = (k.to_bits() as i32).wrapping_sub(SHIFT.to_bits() as i32);
    // n ∈ [−126, 127]: 2ⁿ is a normal float.
    let scale = f32::from_bits(((ni + 127) as u32) << 23);
    let v = scale.mul_add(em1, scale);
    if x < EXP_LO {
        0.0
    } else {
        v
    }
}

/// Lanes of the fixed-order sums (two AVX2 vectors of f64).
const LANES: usize = 8;

/// `Σ xs` in f64 over [`LANES`] lanes (element `i` into lane `i mod 8`,
/// then the lanes in order): a fixed order that vectorises.
#[inline(always)]
fn sum_f64(xs: &[f32]) -> f64 {
    let mut acc = [0.0f64; LANES];
    let mut chunks = xs.chunks_exact(LANES);
    for c in &mut chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += f64::from(v);
        }
    }
    for (a, &v) in acc.iter_mut().zip(chunks.remainder()) {
        *a += f64::from(v);
    }
    acc.iter().sum()
}

/// `Σ a·b` in f64 (products exact), in [`sum_f64`]'s order.
#[inline(always)]
fn dot_f64(a: &[f32], b: &[f32]) -> f64 {
    let mut acc = [0.0f64; LANES];
    let (mut ca, mut cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    for (x, y) in (&mut ca).zip(&mut cb) {
        for ((s, &x), &y) in acc.iter_mut().zip(x).zip(y) {
            *s += f64::from(x) * f64::from(y);
        }
    }
    for ((s, &x), &y) in acc.iter_mut().zip(ca.remainder()).zip(cb.remainder()) {
        *s += f64::from(x) * f64::from(y);
    }
    acc.iter().sum()
}

/// The largest of `xs`, ignoring NaN (as `f32::max`), `−∞` if none: exact,
/// so the lanes' order does not matter.
#[inline(always)]
fn max_f32(xs: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let mut chunks = xs.chunks_exact(LANES);
    for c in &mut chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a = a.max(v);
        }
    }
    for (a, &v) in acc.iter_mut().zip(chunks.remainder()) {
        *a = a.max(v);
    }
    acc.iter().copied().fold(f32::NEG_INFINITY, f32::max)
}

/// One score row's logits rule: the scale, the row's additive mask and the
/// first removed column (causal), if any.
pub(super) struct RowLogits<'a> {
    /// The factor on the scores.
    pub scale: f32,
    /// The row's additive mask (`−∞` where it removes), rounded to f32 as
    /// it is added.
    pub mask: Option<&'a [f64]>,
    /// Columns from here on are `−∞` (causal); `None` keeps them all.
    pub cut: Option<usize>,
}

/// The logits of `s` into `x`: `scale·s (+ mask)`, `−∞` from `cut` on.
#[inline(always)]
fn logits(rule: &RowLogits, s: &[f32], x: &mut [f32]) {
    for (x, &v) in x.iter_mut().zip(s) {
        *x = rule.scale * v;
    }
    if let Some(m) = rule.mask {
        for (x, &m) in x.iter_mut().zip(m) {
            *x += m as f32;
        }
    }
    if let Some(cut) = rule.cut {
        for x in x.iter_mut().skip(cut) {
            *x = f32::NEG_INFINITY;
        }
    }
}

/// `P = e^(x − lse)` of one score row `s` into `p` (`x` is scratch of the
/// row's length), with `lse` given (a saved one) or computed and rounded
/// to f32; returns the `lse` used (`−∞` for a fully masked row, whose `P`
/// is 0).
#[inline(always)]
fn probs_row_body(
    rule: &RowLogits,
    s: &[f32],
    p: &mut [f32],
    x: &mut [f32],
    lse: Option<f32>,
) -> f32 {
    // Plain loops, no closures: a closure is compiled apart from the
    // AVX2 + FMA copy of this body and would call `fmaf` per element.
    logits(rule, s, x);
    let lse = match lse {
        Some(v) => v,
        None => {
            let mx = max_f32(x);
            if mx == f32::NEG_INFINITY {
                mx
            } else {
                for (e, &x) in p.iter_mut().zip(&*x) {
                    *e = exp_f32(x - mx);
                }
                (f64::from(mx) + sum_f64(p).ln()) as f32
            }
        }
    };
    if lse == f32::NEG_INFINITY {
        p.fill(0.0);
    } else {
        for (o, &x) in p.iter_mut().zip(&*x) {
            *o = exp_f32(x - lse);
        }
    }
    lse
}

/// `ds = scale·p ⊙ (dp − Σ dp ⊙ p)` for one row.
#[inline(always)]
fn grad_row_body(scale: f32, p: &[f32], dp: &[f32], ds: &mut [f32]) {
    let dot = dot_f64(p, dp) as f32;
    for ((o, &a), &b) in ds.iter_mut().zip(p).zip(dp) {
        *o = scale * a * (b - dot);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn probs_row_avx2(
    rule: &RowLogits,
    s: &[f32],
    p: &mut [f32],
    x: &mut [f32],
    lse: Option<f32>,
) -> f32 {
    probs_row_body(rule, s, p, x, lse)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn grad_row_avx2(scale: f32, p: &[f32], dp: &[f32], ds: &mut [f32]) {
    grad_row_body(scale, p, dp, ds)
}

/// `P = e^(x − lse)` of the score row `s` into `p` (see [`probs_row_body`]),
/// `x` scratch of the row's length. Returns the `lse` used.
pub(super) fn probs_row(
    rule: &RowLogits,
    s: &[f32],
    p: &mut [f32],
    x: &mut [f32],
    lse: Option<f32>,
) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if avx2_fma() {
        // SAFETY: the CPU has AVX2 and FMA (checked just above).
        return unsafe { probs_row_avx2(rule, s, p, x, lse) };
    }
    probs_row_body(rule, s, p, x, lse)
}

/// The softmax backward of one row: `ds = scale·p ⊙ (dp − Σ dp ⊙ p)`.
pub(super) fn grad_row(scale: f32, p: &[f32], dp: &[f32], ds: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if avx2_fma() {
        // SAFETY: the CPU has AVX2 and FMA (checked just above).
        return unsafe { grad_row_avx2(scale, p, dp, ds) };
    }
    grad_row_body(scale, p, dp, ds)
}

/// `x ← e^(x − shift)` over a row (fused attention's blocks).
#[inline(always)]
fn exp_shifted_body(xs: &mut [f32], shift: f32) {
    for x in xs.iter_mut() {
        *x = exp_f32(*x - shift);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn exp_shifted_avx2(xs: &mut [f32], shift: f32) {
    exp_shifted_body(xs, shift)
}

/// `x ← e^(x − shift)` for every element (`0` for `−∞`), in vectors with
/// hardware FMAs where the CPU has them (the same bits either way: see the
/// module doc).
pub(super) fn exp_shifted(xs: &mut [f32], shift: f32) {
    #[cfg(target_arch = "x86_64")]
    if avx2_fma() {
        // SAFETY: the CPU has AVX2 and FMA (checked just above).
        return unsafe { exp_shifted_avx2(xs, shift) };
    }
    exp_shifted_body(xs, shift)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Within 1 ulp of `e^x` correctly rounded over [−87.33, 88], 0 below,
    /// NaN for NaN.
    #[test]
    fn exp_f32_is_within_one_ulp() {
        let mut xs: Vec<f32> = (0..400_000).map(|i| -87.33 + i as f32 * 4.3e-4).collect();
        xs.extend((0..20_000).map(|i| (i as f32 - 10_000.0) * 1e-6));
        xs.extend([0.0, -0.0, 88.0, -87.33, 1e-30, -1e-30]);
        for &x in &xs {
            let (got, want) = (exp_f32(x), (f64::from(x)).exp() as f32);
            let ulps = (i64::from(got.to_bits()) - i64::from(want.to_bits())).abs();
            assert!(ulps <= 1, "exp({x}): {got:e} vs {want:e}");
        }
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_f32(-87.34), 0.0);
        assert_eq!(exp_f32(-1e30), 0.0);
        assert!(exp_f32(f32::NAN).is_nan());
    }

    /// The dispatched rows (AVX2 + FMA where the CPU has them) equal the
    /// portable bodies bit for bit; the probabilities and their gradient
    /// are within their f32 roundings of an f64 softmax, and the row rebuilt
    /// from the returned `lse` is the same.
    #[test]
    fn rows_match_the_portable_body_and_an_f64_softmax() {
        for len in [1usize, 7, 8, 9, 31, 128, 200] {
            let s: Vec<f32> = (0..len)
                .map(|i| ((i * 7919) % 97) as f32 * 0.37 - 15.0)
                .collect();
            let mask: Vec<f64> = (0..len)
                .map(|i| if i % 5 == 3 { f64::NEG_INFINITY } else { -0.1 })
                .collect();
            for (mask, cut) in [(None, None), (Some(&mask[..]), None), (None, Some(len / 2))] {
                let rule = RowLogits {
                    scale: 0.125,
                    mask,
                    cut,
                };
                let (mut p, mut x) = (vec![0.0; len], vec![0.0; len]);
                let lse = probs_row(&rule, &s, &mut p, &mut x, None);
                let mut q = vec![0.0; len];
                let lse2 = probs_row_body(&rule, &s, &mut q, &mut x, None);
                assert_eq!(lse.to_bits(), lse2.to_bits());
                assert!(p.iter().zip(&q).all(|(a, b)| a.to_bits() == b.to_bits()));
                let mut again = vec![0.0; len];
                probs_row(&rule, &s, &mut again, &mut x, Some(lse));
                assert!(p
                    .iter()
                    .zip(&again)
                    .all(|(a, b)| a.to_bits() == b.to_bits()));
                // An f64 softmax of the same logits.
                let xs: Vec<f64> = (0..len)
                    .map(|j| match (cut, mask) {
                        (Some(c), _) if j >= c => f64::NEG_INFINITY,
                        (_, Some(m)) => f64::from(0.125 * s[j] + m[j] as f32),
                        _ => f64::from(0.125 * s[j]),
                    })
                    .collect();
                let mx = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let sum: f64 = xs.iter().map(|v| (v - mx).exp()).sum();
                let l = f64::from(lse);
                for (j, &v) in xs.iter().enumerate() {
                    let got = f64::from(p[j]);
                    if v == f64::NEG_INFINITY {
                        assert_eq!(got, 0.0, "len {len} [{j}] removed");
                        continue;
                    }
                    let want = (v - mx).exp() / sum;
                    // exp's ulp, and the f32 roundings of lse and x − lse.
                    let tol = want * (3e-7 + 1.2e-7 * ((v - l).abs() + l.abs()));
                    assert!(
                        (got - want).abs() <= tol,
                        "len {len} [{j}]: {got} vs {want}"
                    );
                }
                let dp: Vec<f32> = (0..len)
                    .map(|i| ((i * 31) % 17) as f32 * 0.1 - 0.8)
                    .collect();
                let (mut ds, mut ds2) = (vec![0.0; len], vec![0.0; len]);
                grad_row(0.125, &p, &dp, &mut ds);
                grad_row_body(0.125, &p, &dp, &mut ds2);
                assert!(ds.iter().zip(&ds2).all(|(a, b)| a.to_bits() == b.to_bits()));
                let dot: f64 = p
                    .iter()
                    .zip(&dp)
                    .map(|(&a, &b)| f64::from(a) * f64::from(b))
                    .sum();
                for j in 0..len {
                    let want = 0.125 * f64::from(p[j]) * (f64::from(dp[j]) - dot);
                    assert!(
                        (f64::from(ds[j]) - want).abs() <= 1e-6 * (want.abs() + 1e-3),
                        "dS [{j}]"
                    );
                }
            }
        }
    }

    /// A fully masked row has `lse = −∞` and probabilities 0.
    #[test]
    fn a_fully_masked_row_is_zero() {
        let mask = [f64::NEG_INFINITY; 9];
        let rule = RowLogits {
            scale: 1.0,
            mask: Some(&mask),
            cut: None,
        };
        let (mut p, mut x) = (vec![1.0; 9], vec![0.0; 9]);
        assert_eq!(
            probs_row(&rule, &[0.5; 9], &mut p, &mut x, None),
            f32::NEG_INFINITY
        );
        assert!(p.iter().all(|&v| v == 0.0));
    }
}
