//! `e^y` over a row of score logits on the CPU, vectorised: the attention
//! softmax's exponentials are most of its time, and the C library's `exp`
//! is one call per element. The f32/f16/bf16 paths use [`exp_fast`]
//! (within 1 ulp of the correctly rounded f64 value, so after rounding to
//! the element type it gives the same result except in the rare case where
//! the f64 value lies within 1 ulp of a rounding boundary); f64 scores keep
//! the C library's `exp`.

use crate::primitives::exp_reduction::{INV_FACT_12_TO_2, INV_FACT_13, LN2_HI, LN2_LO, SHIFT};

/// `e^y` within 1 ulp for `y ∈ [−708, 709]` (Cody–Waite reduction by ln 2,
/// then `2ⁿ·(1 + (r + r²·q(r)))` with `q` the Taylor series of
/// `(e^r − 1 − r)/r²` to the `r¹¹/13!` term: truncation below 1e-18 for
/// `|r| ≤ ln 2 / 2`); `0` below −708 (where `e^y < 3.1e-308`: no f32, f16
/// or bf16 value, nor a sum ≥ 1, can tell it from 0); `exp(709)` above 709;
/// NaN stays NaN. No branches or calls, no FMA (every build computes the
/// same values), so a loop of it vectorises.
#[inline(always)]
pub(super) fn exp_fast(y: f64) -> f64 {
    let yc = y.clamp(-708.0, 709.0);
    let k = yc * std::f64::consts::LOG2_E + SHIFT;
    let n = k - SHIFT;
    // n·LN2_HI is exact (|n| ≤ 1023, LN2_HI has 21 significant bits).
    let r = (yc - n * LN2_HI) - n * LN2_LO;
    let mut q = INV_FACT_13;
    for c in INV_FACT_12_TO_2 {
        q = q * r + c;
    }
    let em1 = r + r * r * q; // e^r − 1, |em1| < 0.42
    let ni = (k.to_bits() as i64).wrapping_sub(SHIFT.to_bits() as i64);
    let scale = f64::from_bits(((ni + 1023) as u64) << 52);
    // scale·em1 is exact (a power of two, normal range): one rounding.
    let v = scale + scale * em1;
    if y < -708.0 {
        0.0
    } else {
        v
    }
}

fn exp_body(ys: &mut [f64]) {
    ys.iter_mut().for_each(|y| *y = exp_fast(*y));
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn exp_avx512(ys: &mut [f64]) {
    exp_body(ys)
}

/// [`exp_fast`] over 16 elements at a time as four AVX2 vectors advanced
/// in lockstep, the rest as [`exp_body`]. Left to itself, the compiler
/// evaluated one vector's polynomial at a time, each step waiting on the
/// last. The operations are [`exp_fast`]'s, in its order and without FMA,
/// so the values are the same.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn exp_avx2(ys: &mut [f64]) {
    use std::arch::x86_64::*;
    const V: usize = 4;
    let splat = _mm256_set1_pd;
    let mut groups = ys.chunks_exact_mut(4 * V);
    for g in &mut groups {
        let mut y = [_mm256_setzero_pd(); V];
        for (i, y) in y.iter_mut().enumerate() {
            // SAFETY: elements 4i..4i+4 lie inside the group.
            *y = unsafe { _mm256_loadu_pd(g.as_ptr().add(4 * i)) };
        }
        let (mut k, mut r) = ([splat(0.0); V], [splat(0.0); V]);
        for i in 0..V {
            // clamp(−708, 709) with NaN kept: min and max return their
            // second operand when either is NaN.
            let yc = _mm256_max_pd(splat(-708.0), _mm256_min_pd(splat(709.0), y[i]));
            k[i] = _mm256_add_pd(
                _mm256_mul_pd(yc, splat(std::f64::consts::LOG2_E)),
                splat(SHIFT),
            );
            let n = _mm256_sub_pd(k[i], splat(SHIFT));
            let hi = _mm256_sub_pd(yc, _mm256_mul_pd(n, splat(LN2_HI)));
            r[i] = _mm256_sub_pd(hi, _mm256_mul_pd(n, splat(LN2_LO)));
        }
        let mut q = [splat(INV_FACT_13); V];
        for c in INV_FACT_12_TO_2 {
            for i in 0..V {
                q[i] = _mm256_add_pd(_mm256_mul_pd(q[i], r[i]), splat(c));
            }
        }
        let bias = _mm256_set1_epi64x(1023 - SHIFT.to_bits() as i64);
        for i in 0..V {
            let em1 = _mm256_add_pd(r[i], _mm256_mul_pd(_mm256_mul_pd(r[i], r[i]), q[i]));
            let ni = _mm256_add_epi64(_mm256_castpd_si256(k[i]), bias);
            let scale = _mm256_castsi256_pd(_mm256_slli_epi64::<52>(ni));
            let v = _mm256_add_pd(scale, _mm256_mul_pd(scale, em1));
            let below = _mm256_cmp_pd::<_CMP_LT_OQ>(y[i], splat(-708.0));
            let v = _mm256_andnot_pd(below, v);
            // SAFETY: elements 4i..4i+4 lie inside the group.
            unsafe { _mm256_storeu_pd(g.as_mut_ptr().add(4 * i), v) };
        }
    }
    exp_body(groups.into_remainder());
}

/// `y ← e^y` for every element: the C library's `exp` when `exact` (f64
/// scores), else [`exp_fast`] compiled for the widest vectors the CPU has
/// (the same operations in every version, so the same values).
pub(super) fn exp_in_place(ys: &mut [f64], exact: bool) {
    if exact {
        ys.iter_mut().for_each(|y| *y = y.exp());
        return;
    }
    #[cfg(target_arch = "x86_64")]
    {
        if crate::primitives::avx512() {
            // SAFETY: the CPU has AVX-512F (checked just above).
            return unsafe { exp_avx512(ys) };
        }
        if crate::primitives::avx2_fma() {
            // SAFETY: the CPU has AVX2 (checked just above).
            return unsafe { exp_avx2(ys) };
        }
    }
    exp_body(ys)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Within 1 ulp of the C library's (itself within ½ ulp of e^y) over
    /// the whole range, exactly 0 below −708, NaN for NaN.
    #[test]
    fn exp_fast_is_within_one_ulp() {
        let mut ys: Vec<f64> = (0..200_000)
            .map(|i| -708.0 + i as f64 * 0.007_085)
            .collect();
        ys.extend((0..20_000).map(|i| (i as f64 - 10_000.0) * 1e-5));
        ys.extend([0.0, -0.0, 1e-300, -1e-300, 709.0, -708.0]);
        let mut got = ys.clone();
        exp_in_place(&mut got, false);
        for (&y, &g) in ys.iter().zip(&got) {
            let want = y.exp();
            let ulp = f64::EPSILON * want;
            assert!((g - want).abs() <= ulp, "exp({y}): {g:e} vs {want:e}");
        }
        let mut specials = [-708.5, -1e300, f64::NEG_INFINITY, f64::NAN];
        exp_in_place(&mut specials, false);
        assert_eq!(specials[..3], [0.0, 0.0, 0.0]);
        assert!(specials[3].is_nan());
    }

    /// The dispatched kernel (AVX2's four vectors where the CPU has them)
    /// gives [`exp_fast`]'s bits, element for element, at every length
    /// around a group and over the specials.
    #[test]
    fn vector_groups_equal_the_scalar_exp_bit_for_bit() {
        let mut ys: Vec<f64> = (0..4_003).map(|i| -720.0 + i as f64 * 0.3571).collect();
        ys.extend([0.0, -0.0, -708.0, 709.0, 710.0, f64::NAN, f64::NEG_INFINITY]);
        for len in [1, 15, 16, 17, 33, ys.len()] {
            let mut got = ys[ys.len() - len..].to_vec();
            exp_in_place(&mut got, false);
            for (&y, &g) in ys[ys.len() - len..].iter().zip(&got) {
                let want = exp_fast(y);
                assert!(
                    g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()),
                    "exp({y}): {g:e} vs {want:e}"
                );
            }
        }
    }
}
