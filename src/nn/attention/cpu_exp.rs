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

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn exp_avx2(ys: &mut [f64]) {
    exp_body(ys)
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
        if is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F (checked just above).
            return unsafe { exp_avx512(ys) };
        }
        if is_x86_feature_detected!("avx2") {
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
}
