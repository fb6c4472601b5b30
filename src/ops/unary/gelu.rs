//! GELU and its derivative on the CPU.
//!
//! The reference is the f64 formula ([`gelu_value_f64`], [`gelu_grad_f64`]
//! with the series/continued-fraction [`erf`]), rounded once to the
//! element type: that is what every dtype has always returned, and what the
//! CUDA kernels compute. It is exact but slow (a series of up to ~60 terms
//! per element), so blocks of f32/f16/bf16 elements go through a fast,
//! vectorised f64 candidate instead ([`fast_block`]: a Chebyshev expansion
//! of `erfcx` in monomial form and a polynomial `exp`, FMAs, no branches,
//! 32 lanes at a time as four explicit vectors with AVX-512, 16 with AVX2)
//! together with a bound on its distance from the reference. The
//! candidate is only as accurate as deciding an f32 rounding needs (about
//! 3e-13 relative), not f64's precision. Rounding is monotonic, so when both
//! ends of `candidate ± bound` round to the same element value, the
//! reference rounds to it too: that value is returned. Otherwise (a value
//! within the bound of a rounding boundary, about one element in 10⁴ for
//! normally distributed inputs; NaN, ±∞, far tails) the reference is
//! computed. The result is therefore bit-identical to the reference by
//! construction, for every input, whatever the speed path; f64 elements
//! always use the reference.

use crate::primitives::exp_reduction::{INV_FACT_12_TO_2, INV_FACT_13, LN2_HI, LN2_LO, SHIFT};
use crate::primitives::{as_f32, as_f32_mut};
use crate::{FloatDType, WithDType};
use std::f64::consts::{FRAC_1_SQRT_2, FRAC_2_SQRT_PI, PI, SQRT_2};

/// The error function, to about 1e-15: for |x| < 3 the series
/// `erf(a) = 2/√π · e^(-a²) · Σ 2ⁿ a^(2n+1) / (1·3·…·(2n+1))` (all terms
/// positive, so no cancellation), else `1 - erfc` from erfc's continued fraction.
pub(crate) fn erf(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    let a = x.abs();
    let r = if a < 3.0 {
        let (a2, mut term, mut sum, mut n) = (a * a, a, a, 0.0);
        while term > 1e-17 * sum {
            n += 1.0;
            term *= 2.0 * a2 / (2.0 * n + 1.0);
            sum += term;
        }
        sum * FRAC_2_SQRT_PI * (-a2).exp()
    } else {
        // erfc(a) = e^(-a²)/√π · 1/(a + (1/2)/(a + 1/(a + (3/2)/(a + …))))
        let mut f = a;
        for k in (1..=60).rev() {
            f = a + (k as f64 / 2.0) / f;
        }
        1.0 - (-a * a).exp() / (PI.sqrt() * f)
    };
    r.copysign(x)
}

const GELU_K: f64 = 0.797_884_560_802_865_4; // √(2/π)
const GELU_A: f64 = 0.044_715;

/// gelu(x) in f64, exact (erf) or tanh-approximated: the reference.
pub(crate) fn gelu_value_f64(x: f64, approximate: bool) -> f64 {
    if approximate {
        let t = (GELU_K * (x + GELU_A * x * x * x)).tanh();
        0.5 * x * (1.0 + t)
    } else {
        x * (0.5 * (1.0 + erf(x / SQRT_2)))
    }
}

/// The tanh-approximated gelu(x) and gelu'(x) in f64 from one tanh: the
/// same expressions, bit for bit, as [`gelu_value_f64`] and
/// [`gelu_grad_f64`] with `approximate`.
pub(crate) fn gelu_tanh_pair_f64(x: f64) -> (f64, f64) {
    let t = (GELU_K * (x + GELU_A * x * x * x)).tanh();
    let value = 0.5 * x * (1.0 + t);
    let slope = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * GELU_K * (1.0 + 3.0 * GELU_A * x * x);
    (value, slope)
}

/// gelu'(x) in f64, exact (erf) or tanh-approximated: the reference.
pub(crate) fn gelu_grad_f64(x: f64, approximate: bool) -> f64 {
    if approximate {
        let t = (GELU_K * (x + GELU_A * x * x * x)).tanh();
        0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * GELU_K * (1.0 + 3.0 * GELU_A * x * x)
    } else {
        let cdf = 0.5 * (1.0 + erf(x / SQRT_2));
        let pdf = (-0.5 * x * x).exp() / (2.0 * PI).sqrt();
        cdf + x * pdf
    }
}

/// `erfcx(z) = e^(z²)·erfc(z)` over `z ∈ [0, ∞)` as a polynomial of degree
/// 17 in `t = (z − K)/(z + K)`, `K = 3.75`, `t ∈ [−1, 1)`: the Chebyshev
/// expansion `tests::ERFCX_CHEB` (computed with 40-digit arithmetic)
/// truncated after `T₁₇` and converted exactly to monomial coefficients,
/// then rounded; lowest degree first. The omitted terms sum to 1.3e-13;
/// `tests::fast_candidate_is_within_its_bound` measures the relative error
/// of the whole candidate against [`ERFC_REL_BOUND`]. (Degree 17, not the
/// 22 that reaches f64's precision: the candidate only has to decide an f32
/// rounding, and the five FMAs saved are a tenth of the work.)
const ERFCX_K: f64 = 3.75;
const ERFCX_POLY: [f64; 18] = [
    0.1455897212751554,
    -0.2734219314950862,
    0.22600806689751043,
    -0.16357189554450952,
    0.10260431254777444,
    -0.05480232632892442,
    0.024143218599025927,
    -0.008220624121993717,
    0.0018029906156203288,
    -2.5522236047419e-05,
    -0.00015254648703438275,
    4.7864583724848664e-05,
    3.732234860594051e-06,
    -6.128729715942641e-06,
    5.906554135076983e-07,
    6.060386935670007e-07,
    -8.633843463526708e-08,
    -4.2166157960192746e-08,
];

/// The Taylor coefficients `1/k!` of `e^r`, `k = 0 … 13`, lowest first:
/// `e^r` to about 2 ulp for `|r| ≤ ln 2 / 2`. (Its chain is shorter than
/// erfcx's and runs beside it, so its length costs no time.)
const EXP_POLY: [f64; 14] = {
    let mut s = [1.0; 14];
    let mut i = 0;
    while i < INV_FACT_12_TO_2.len() {
        s[12 - i] = INV_FACT_12_TO_2[i];
        i += 1;
    }
    s[13] = INV_FACT_13;
    s
};

/// Bound on the reference's own distance from the true Φ (absolute; Φ ≤ 1),
/// with a margin: the series/continued-fraction [`erf`] is good to about
/// 1e-15.
pub(crate) const PHI_BOUND: f64 = 1e-14;

/// Bound on the fast `½·e^(−z²)·erfcx(z)` relative to its true value: the
/// truncated polynomial, `exp` and the roundings.
/// `tests::fast_candidate_is_within_its_bound` measures 2.9e-13 and
/// requires below a quarter of it. (A looser bound sends more elements to
/// the slow reference: at 1e-11, one in 2,000.)
pub(crate) const ERFC_REL_BOUND: f64 = 2e-12;

/// `a·b + c` with one rounding. Inside the `target_feature` functions
/// below it is one FMA instruction; elsewhere a (slow, still exact) call.
#[inline(always)]
fn fma(a: f64, b: f64, c: f64) -> f64 {
    a.mul_add(b, c)
}

/// Φ(x) (the normal CDF), `e^(−x²/2)` and `½·erfc(|x|/√2)` (the smaller
/// of Φ and 1 − Φ, which the bounds scale with), fast, for every lane of a
/// group: `½·e^(−z²)·erfcx(z)` with `z = |x|/√2` for the lower tail,
/// `1 −` that for x ≥ 0. `e^(−z²)` by Cody–Waite reduction by ln 2 and
/// [`EXP_POLY`]; `z²` above 708 is clamped (the result is then ≤ 3e-308).
/// The two polynomials are independent chains and advance together, so
/// the FMA units always have work. No branches or calls (it vectorises).
#[inline(always)]
fn phi_fast<const G: usize>(x: &[f64; G]) -> Phi<G> {
    let mut t = [0.0; G];
    let mut k = [0.0; G];
    let mut r = [0.0; G];
    for i in 0..G {
        let z = x[i].abs() * FRAC_1_SQRT_2;
        t[i] = (z - ERFCX_K) / (z + ERFCX_K);
        let y = (-(z * z)).max(-708.0);
        k[i] = fma(y, std::f64::consts::LOG2_E, SHIFT);
        let n = k[i] - SHIFT;
        // n·LN2_HI is exact (|n| < 2¹¹, LN2_HI has 21 significant bits).
        r[i] = fma(-n, LN2_LO, y - n * LN2_HI);
    }
    const D: usize = ERFCX_POLY.len() - 1;
    const E: usize = EXP_POLY.len() - 1;
    let mut erfcx = [ERFCX_POLY[D]; G];
    let mut p = [EXP_POLY[E]; G];
    for j in (0..D).rev() {
        for i in 0..G {
            erfcx[i] = fma(erfcx[i], t[i], ERFCX_POLY[j]);
        }
        if j < E {
            for i in 0..G {
                p[i] = fma(p[i], r[i], EXP_POLY[j]);
            }
        }
    }
    let mut out = Phi {
        phi: [0.0; G],
        e: [0.0; G],
        tail: [0.0; G],
    };
    for i in 0..G {
        let ni = (k[i].to_bits() as i64).wrapping_sub(SHIFT.to_bits() as i64);
        out.e[i] = p[i] * f64::from_bits(((ni + 1023) as u64) << 52);
        out.tail[i] = 0.5 * out.e[i] * erfcx[i];
        out.phi[i] = if x[i] < 0.0 {
            out.tail[i]
        } else {
            1.0 - out.tail[i]
        };
    }
    out
}

/// What [`phi_fast`] gives for each lane of a group.
struct Phi<const G: usize> {
    /// Φ(x).
    phi: [f64; G],
    /// `e^(−x²/2)`.
    e: [f64; G],
    /// `½·erfc(|x|/√2)`: the fast part of Φ, whose relative error is
    /// bounded by [`ERFC_REL_BOUND`].
    tail: [f64; G],
}

/// Defines a module's one-line f64 vector operations from its intrinsics,
/// each compiled with the module's target features.
#[cfg(target_arch = "x86_64")]
macro_rules! vector_ops {
    (
        $features:literal,
        set1: $set1:ident, add: $add:ident, sub: $sub:ident, mul: $mul:ident,
        div: $div:ident, max: $max:ident, fmadd: $fmadd:ident,
        fnmadd: $fnmadd:ident, loadu: $loadu:ident, storeu: $storeu:ident $(,)?
    ) => {
        /// Every lane `v`.
        #[inline]
        #[target_feature(enable = $features)]
        fn splat(v: f64) -> F {
            $set1(v)
        }

        /// `a + b`.
        #[inline]
        #[target_feature(enable = $features)]
        fn add(a: F, b: F) -> F {
            $add(a, b)
        }

        /// `a − b`.
        #[inline]
        #[target_feature(enable = $features)]
        fn sub(a: F, b: F) -> F {
            $sub(a, b)
        }

        /// `a · b`.
        #[inline]
        #[target_feature(enable = $features)]
        fn mul(a: F, b: F) -> F {
            $mul(a, b)
        }

        /// `a / b`.
        #[inline]
        #[target_feature(enable = $features)]
        fn div(a: F, b: F) -> F {
            $div(a, b)
        }

        /// `max(a, b)` as the instruction takes it (`b` where either is NaN).
        #[inline]
        #[target_feature(enable = $features)]
        fn max(a: F, b: F) -> F {
            $max(a, b)
        }

        /// `a·b + c`, one rounding.
        #[inline]
        #[target_feature(enable = $features)]
        fn fmadd(a: F, b: F, c: F) -> F {
            $fmadd(a, b, c)
        }

        /// `c − a·b`, one rounding.
        #[inline]
        #[target_feature(enable = $features)]
        fn fnmadd(a: F, b: F, c: F) -> F {
            $fnmadd(a, b, c)
        }

        /// The lanes at `src`.
        ///
        /// # Safety
        /// `src` holds a vector's lanes.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn load(src: *const f64) -> F {
            // SAFETY: the caller's lanes.
            unsafe { $loadu(src) }
        }

        /// Stores the lanes at `dst`.
        ///
        /// # Safety
        /// `dst` holds a vector's lanes.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn store(dst: *mut f64, v: F) {
            // SAFETY: the caller's lanes.
            unsafe { $storeu(dst, v) }
        }
    };
}

/// The vector forms of the fast path, written once over a module's f64
/// vector type `F` (`W` lanes) and its one-line operations (`splat`, `add`,
/// `fmadd`, …, each compiled with the module's target features so that it
/// inlines into these functions): [`phi_fast`] for one group of `GROUP`
/// lanes as four vectors advanced in lockstep, and whole f32 blocks kept in
/// vectors from load to store. Left to itself, the compiler ran each
/// vector's polynomial chains one after the other, every FMA waiting on
/// the last and half the FMA units idle; here four (then eight) independent
/// FMAs issue together. The operations are [`phi_fast`]'s, lane for lane, so
/// Φ is the same on every instruction set; the candidates and bounds are
/// [`value_candidate`]'s and [`slope_candidate`]'s.
#[cfg(target_arch = "x86_64")]
macro_rules! vector_kernels {
    ($features:literal) => {
        use super::{
            reference, Phi, ERFCX_K, ERFCX_POLY, ERFC_REL_BOUND, EXP_POLY, INV_SQRT_2PI, LN2_HI,
            LN2_LO, PHI_BOUND, SHIFT,
        };
        use std::f64::consts::{FRAC_1_SQRT_2, LOG2_E};

        /// Vectors per group.
        const V: usize = GROUP / W;

        /// A group of lanes, four f64 vectors.
        type Lanes = [F; V];

        /// [`Phi`] of a group, in vectors.
        struct PhiV {
            phi: Lanes,
            e: Lanes,
            tail: Lanes,
        }

        #[inline]
        #[target_feature(enable = $features)]
        fn phi_v(xv: &Lanes) -> PhiV {
            let zero = splat(0.0);
            let (mut t, mut k, mut r) = ([zero; V], [zero; V], [zero; V]);
            for i in 0..V {
                let z = mul(abs(xv[i]), splat(FRAC_1_SQRT_2));
                let num = sub(z, splat(ERFCX_K));
                t[i] = div(num, add(z, splat(ERFCX_K)));
                // max(−z², −708) as f64::max takes it (a NaN gives −708).
                let y = max(negate(mul(z, z)), splat(-708.0));
                k[i] = fmadd(y, splat(LOG2_E), splat(SHIFT));
                let n = sub(k[i], splat(SHIFT));
                let hi = sub(y, mul(n, splat(LN2_HI)));
                r[i] = fnmadd(n, splat(LN2_LO), hi);
            }
            const D: usize = ERFCX_POLY.len() - 1;
            const E: usize = EXP_POLY.len() - 1;
            let mut erfcx = [splat(ERFCX_POLY[D]); V];
            let mut p = [splat(EXP_POLY[E]); V];
            for j in (0..D).rev() {
                for i in 0..V {
                    erfcx[i] = fmadd(erfcx[i], t[i], splat(ERFCX_POLY[j]));
                }
                if j < E {
                    for i in 0..V {
                        p[i] = fmadd(p[i], r[i], splat(EXP_POLY[j]));
                    }
                }
            }
            let mut out = PhiV {
                phi: [zero; V],
                e: [zero; V],
                tail: [zero; V],
            };
            for i in 0..V {
                // 2^n from the integer the shift left in k's low bits.
                out.e[i] = mul(p[i], two_to_the(k[i]));
                out.tail[i] = mul(mul(splat(0.5), out.e[i]), erfcx[i]);
                let upper = sub(splat(1.0), out.tail[i]);
                out.phi[i] = below_zero(xv[i], out.tail[i], upper);
            }
            out
        }

        /// [`super::phi_fast`] of one group, through [`phi_v`].
        #[inline]
        #[target_feature(enable = $features)]
        pub(super) fn phi(x: &[f64; GROUP]) -> Phi<GROUP> {
            let mut xv = [splat(0.0); V];
            for (i, v) in xv.iter_mut().enumerate() {
                // SAFETY: lanes W·i..W·i+W lie inside the group.
                *v = unsafe { load(x.as_ptr().add(W * i)) };
            }
            let p = phi_v(&xv);
            let mut out = Phi {
                phi: [0.0; GROUP],
                e: [0.0; GROUP],
                tail: [0.0; GROUP],
            };
            for i in 0..V {
                // SAFETY: lanes W·i..W·i+W lie inside each group-sized array.
                unsafe {
                    store(out.e.as_mut_ptr().add(W * i), p.e[i]);
                    store(out.tail.as_mut_ptr().add(W * i), p.tail[i]);
                    store(out.phi.as_mut_ptr().add(W * i), p.phi[i]);
                }
            }
            out
        }

        /// gelu's candidates and bounds ([`super::value_candidate`]).
        #[inline]
        #[target_feature(enable = $features)]
        fn values(xv: &Lanes, p: &PhiV) -> (Lanes, Lanes) {
            let (mut v, mut b) = ([splat(0.0); V], [splat(0.0); V]);
            for i in 0..V {
                v[i] = mul(xv[i], p.phi[i]);
                let phi_bound = fmadd(p.tail[i], splat(ERFC_REL_BOUND), splat(PHI_BOUND));
                let round = mul(abs(v[i]), splat(1e-15));
                b[i] = fmadd(abs(xv[i]), phi_bound, round);
            }
            (v, b)
        }

        /// gelu′'s candidates and bounds ([`super::slope_candidate`]).
        #[inline]
        #[target_feature(enable = $features)]
        fn slopes(xv: &Lanes, p: &PhiV) -> (Lanes, Lanes) {
            let (mut v, mut b) = ([splat(0.0); V], [splat(0.0); V]);
            for i in 0..V {
                let xpdf = mul(xv[i], mul(p.e[i], splat(INV_SQRT_2PI)));
                v[i] = add(p.phi[i], xpdf);
                let phi_bound = fmadd(p.tail[i], splat(ERFC_REL_BOUND), splat(PHI_BOUND));
                let pdf_bound = fmadd(abs(xpdf), splat(1e-13), phi_bound);
                b[i] = fmadd(abs(v[i]), splat(1e-15), pdf_bound);
            }
            (v, b)
        }

        /// [`super::settle`] for f32 lanes in vectors: `v − b` rounded is
        /// stored, and the lanes where `v + b` rounds differently (NaN
        /// included) are replaced by the reference.
        #[inline]
        #[target_feature(enable = $features)]
        fn settle(src: &[f32], (v, b): (Lanes, Lanes), out: &mut [f32], grad: bool) {
            // Up to 32 lanes: unsigned, so that lane 31 is not a sign.
            let mut unsettled = 0u32;
            for i in 0..V {
                // SAFETY: lanes W·i..W·i+W lie inside the group.
                let differ = unsafe { store_rounded(out.as_mut_ptr().add(W * i), v[i], b[i]) };
                unsettled |= differ << (W * i);
            }
            while unsettled != 0 {
                let lane = unsettled.trailing_zeros() as usize;
                out[lane] = reference(src[lane] as f64, grad);
                unsettled &= unsettled - 1;
            }
        }

        /// One group of f32 lanes widened to f64.
        #[inline]
        #[target_feature(enable = $features)]
        fn widen(src: &[f32]) -> Lanes {
            let mut xv = [splat(0.0); V];
            for (i, x) in xv.iter_mut().enumerate() {
                // SAFETY: lanes W·i..W·i+W lie inside the group.
                *x = unsafe { load_f32(src.as_ptr().add(W * i)) };
            }
            xv
        }

        /// [`super::block_body`] for f32, whole groups in vectors (a last
        /// partial group through the generic code with [`phi`]).
        #[target_feature(enable = $features)]
        pub(super) fn block_f32(src: &[f32], out: &mut [f32], grad: bool, times: Option<&[f32]>) {
            let whole = src.len() / GROUP * GROUP;
            for (k, (src, out)) in src[..whole]
                .chunks_exact(GROUP)
                .zip(out[..whole].chunks_exact_mut(GROUP))
                .enumerate()
            {
                let xv = widen(src);
                let p = phi_v(&xv);
                let candidates = if grad {
                    slopes(&xv, &p)
                } else {
                    values(&xv, &p)
                };
                settle(src, candidates, out, grad);
                if let Some(g) = times {
                    let g = &g[k * GROUP..(k + 1) * GROUP];
                    out.iter_mut().zip(g).for_each(|(o, &g)| *o *= g);
                }
            }
            super::block_body::<f32, GROUP>(
                &src[whole..],
                &mut out[whole..],
                (grad, times.map(|g| &g[whole..])),
                |x| phi(x),
            );
        }

        /// [`super::pair_body`] for f32, whole groups in vectors.
        #[target_feature(enable = $features)]
        pub(super) fn pair_f32(src: &[f32], value: &mut [f32], slope: &mut [f32]) {
            let whole = src.len() / GROUP * GROUP;
            let groups = src[..whole]
                .chunks_exact(GROUP)
                .zip(value[..whole].chunks_exact_mut(GROUP))
                .zip(slope[..whole].chunks_exact_mut(GROUP));
            for ((src, value), slope) in groups {
                let xv = widen(src);
                let p = phi_v(&xv);
                settle(src, values(&xv, &p), value, false);
                settle(src, slopes(&xv, &p), slope, true);
            }
            super::pair_body::<f32, GROUP>(
                &src[whole..],
                &mut value[whole..],
                &mut slope[whole..],
                |x| phi(x),
            );
        }
    };
}

/// The AVX2 + FMA fast path: groups of [`GROUP`] lanes as four f64×4
/// vectors (see [`vector_kernels`]).
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::GROUP;
    use std::arch::x86_64::*;

    /// The vector type and its lanes.
    type F = __m256d;
    const W: usize = 4;

    vector_ops! {
        "avx2,fma",
        set1: _mm256_set1_pd, add: _mm256_add_pd, sub: _mm256_sub_pd, mul: _mm256_mul_pd,
        div: _mm256_div_pd, max: _mm256_max_pd, fmadd: _mm256_fmadd_pd,
        fnmadd: _mm256_fnmadd_pd, loadu: _mm256_loadu_pd, storeu: _mm256_storeu_pd,
    }

    /// `|v|`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn abs(v: F) -> F {
        _mm256_andnot_pd(_mm256_set1_pd(-0.0), v)
    }

    /// `−v` (the sign bit flipped).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn negate(v: F) -> F {
        _mm256_xor_pd(v, _mm256_set1_pd(-0.0))
    }

    /// `2^n` for the `n` that a shift by [`super::SHIFT`] left in `k`'s
    /// low bits (its exponent field built directly).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn two_to_the(k: F) -> F {
        let bias = _mm256_set1_epi64x(1023 - super::SHIFT.to_bits() as i64);
        let n = _mm256_add_epi64(_mm256_castpd_si256(k), bias);
        _mm256_castsi256_pd(_mm256_slli_epi64::<52>(n))
    }

    /// `below` where `x < 0`, else `otherwise`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn below_zero(x: F, below: F, otherwise: F) -> F {
        let mask = _mm256_cmp_pd::<_CMP_LT_OQ>(x, _mm256_setzero_pd());
        _mm256_blendv_pd(otherwise, below, mask)
    }

    /// Four f32 at `src`, widened.
    ///
    /// # Safety
    /// `src` holds four f32.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn load_f32(src: *const f32) -> F {
        // SAFETY: the caller's four.
        _mm256_cvtps_pd(unsafe { _mm_loadu_ps(src) })
    }

    /// Stores `v − b` rounded to f32 at `out` and says, one bit a lane,
    /// where `v + b` rounds to another f32 (or either is NaN).
    ///
    /// # Safety
    /// `out` holds four f32.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn store_rounded(out: *mut f32, v: F, b: F) -> u32 {
        let lo = _mm256_cvtpd_ps(_mm256_sub_pd(v, b));
        let hi = _mm256_cvtpd_ps(_mm256_add_pd(v, b));
        // SAFETY: the caller's four.
        unsafe { _mm_storeu_ps(out, lo) };
        _mm_movemask_ps(_mm_cmp_ps::<_CMP_NEQ_UQ>(lo, hi)) as u32
    }

    vector_kernels!("avx2,fma");
}

/// The AVX-512 fast path: groups of [`GROUP_AVX512`] lanes as four f64×8
/// vectors (see [`vector_kernels`]).
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::GROUP_AVX512 as GROUP;
    use std::arch::x86_64::*;

    /// The vector type and its lanes.
    type F = __m512d;
    const W: usize = 8;

    vector_ops! {
        "avx512f,avx2,fma",
        set1: _mm512_set1_pd, add: _mm512_add_pd, sub: _mm512_sub_pd, mul: _mm512_mul_pd,
        div: _mm512_div_pd, max: _mm512_max_pd, fmadd: _mm512_fmadd_pd,
        fnmadd: _mm512_fnmadd_pd, loadu: _mm512_loadu_pd, storeu: _mm512_storeu_pd,
    }

    /// `|v|`.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma")]
    fn abs(v: F) -> F {
        _mm512_abs_pd(v)
    }

    /// `−v` (the sign bit flipped, as the AVX2 code's `xor`).
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma")]
    fn negate(v: F) -> F {
        let sign = _mm512_castpd_si512(_mm512_set1_pd(-0.0));
        _mm512_castsi512_pd(_mm512_xor_si512(_mm512_castpd_si512(v), sign))
    }

    /// `2^n` for the `n` that a shift by [`super::SHIFT`] left in `k`'s
    /// low bits (its exponent field built directly).
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma")]
    fn two_to_the(k: F) -> F {
        let bias = _mm512_set1_epi64(1023 - super::SHIFT.to_bits() as i64);
        let n = _mm512_add_epi64(_mm512_castpd_si512(k), bias);
        _mm512_castsi512_pd(_mm512_slli_epi64::<52>(n))
    }

    /// `below` where `x < 0`, else `otherwise`.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma")]
    fn below_zero(x: F, below: F, otherwise: F) -> F {
        let mask = _mm512_cmp_pd_mask::<_CMP_LT_OQ>(x, _mm512_setzero_pd());
        _mm512_mask_blend_pd(mask, otherwise, below)
    }

    /// Eight f32 at `src`, widened.
    ///
    /// # Safety
    /// `src` holds eight f32.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma")]
    unsafe fn load_f32(src: *const f32) -> F {
        // SAFETY: the caller's eight.
        _mm512_cvtps_pd(unsafe { _mm256_loadu_ps(src) })
    }

    /// Stores `v − b` rounded to f32 at `out` and says, one bit a lane,
    /// where `v + b` rounds to another f32 (or either is NaN).
    ///
    /// # Safety
    /// `out` holds eight f32.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma")]
    unsafe fn store_rounded(out: *mut f32, v: F, b: F) -> u32 {
        let lo = _mm512_cvtpd_ps(_mm512_sub_pd(v, b));
        let hi = _mm512_cvtpd_ps(_mm512_add_pd(v, b));
        // SAFETY: the caller's eight.
        unsafe { _mm256_storeu_ps(out, lo) };
        _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_NEQ_UQ>(lo, hi)) as u32
    }

    vector_kernels!("avx512f,avx2,fma");
}

/// 1/√(2π).
const INV_SQRT_2PI: f64 = 0.398_942_280_401_432_7;

/// The fast candidate for gelu(x) and the bound on its distance from the
/// reference, from the lane's Φ and its tail: Φ's bound (the reference's
/// and the fast part's) times |x|, and the final rounding.
#[inline(always)]
fn value_candidate(x: f64, phi: f64, tail: f64) -> (f64, f64) {
    let g = x * phi;
    (
        g,
        x.abs() * (PHI_BOUND + tail * ERFC_REL_BOUND) + g.abs() * 1e-15,
    )
}

/// The fast candidate for gelu'(x) = Φ + x·φ and its bound, from the lane's
/// Φ, its tail and `e^(−x²/2)`: Φ's bound, φ's (the exponent x²/2 rounds
/// differently from the reference's: ≤ 1e-13 relative for the x where φ is
/// not negligible) and the final roundings.
#[inline(always)]
fn slope_candidate(x: f64, phi: f64, tail: f64, e: f64) -> (f64, f64) {
    let xpdf = x * (e * INV_SQRT_2PI);
    let d = phi + xpdf;
    let bound = PHI_BOUND + tail * ERFC_REL_BOUND + xpdf.abs() * 1e-13 + d.abs() * 1e-15;
    (d, bound)
}

/// The fast candidates and their bounds for one group of `G` lanes: `v[i]`
/// near gelu(x[i]) (or gelu'(x[i]) when `grad`), `|v[i] − reference| ≤ b[i]`.
#[inline(always)]
fn candidates_group<const G: usize>(
    x: &[f64; G],
    p: &Phi<G>,
    v: &mut [f64; G],
    b: &mut [f64; G],
    grad: bool,
) {
    for i in 0..G {
        (v[i], b[i]) = if grad {
            slope_candidate(x[i], p.phi[i], p.tail[i], p.e[i])
        } else {
            value_candidate(x[i], p.phi[i], p.tail[i])
        };
    }
}

/// Lanes per group with AVX2 (four ymm registers per value, four
/// independent FMA chains).
const GROUP: usize = 16;
/// Lanes per group with AVX-512 (four zmm registers per value). Written
/// out in vectors as [`avx2`] is: generic group code compiled for AVX-512
/// was measured on a Xeon with its `phi_fast` not inlined into the
/// `target_feature` function, every `mul_add` a call, and GELU 30% of the
/// frozen BERT-base step.
const GROUP_AVX512: usize = 32;

/// The reference, rounded to `T`.
fn reference<T: FloatDType>(x: f64, grad: bool) -> T {
    T::from_f64(if grad {
        gelu_grad_f64(x, false)
    } else {
        gelu_value_f64(x, false)
    })
}

/// `x` widened to f64, one group (a short last group is padded with
/// zeros, whose results are never read).
#[inline(always)]
fn widen<T: FloatDType, const G: usize>(src: &[T]) -> [f64; G] {
    let mut x = [0.0f64; G];
    for (x, s) in x.iter_mut().zip(src) {
        *x = WithDType::to_f64(*s);
    }
    x
}

/// Writes each lane's candidate `v` rounded to `T` when both ends of
/// `v ± b` round to the same value, else the reference (of gelu, or of
/// gelu' when `grad`).
#[inline(always)]
fn settle<T: FloatDType, const G: usize>(
    x: &[f64; G],
    (v, b): (&[f64; G], &[f64; G]),
    out: &mut [T],
    grad: bool,
) {
    let mut unsettled = false;
    for ((o, &v), &b) in out.iter_mut().zip(v).zip(b) {
        let (lo, hi) = (T::from_f64(v - b), T::from_f64(v + b));
        *o = lo;
        // NaN candidates (NaN, ±∞ inputs) compare unequal: the reference.
        unsettled |= lo != hi;
    }
    if unsettled {
        for (((o, &v), &b), &x) in out.iter_mut().zip(v).zip(b).zip(x) {
            if T::from_f64(v - b) != T::from_f64(v + b) {
                *o = reference(x, grad);
            }
        }
    }
}

/// [`fast_block`] for f32/f16/bf16, `G` lanes at a time: widen, the
/// candidates, the rounding test, and the reference where it fails; then,
/// with `times`, `out[i] = times[i] · out[i]` (the incoming gradient). Only
/// group-sized arrays, which stay in registers (no block-sized buffers to
/// clear).
#[inline(always)]
fn block_body<T: FloatDType, const G: usize>(
    src: &[T],
    out: &mut [T],
    (grad, times): (bool, Option<&[T]>),
    phi: impl Fn(&[f64; G]) -> Phi<G>,
) {
    for (k, (src, out)) in src.chunks(G).zip(out.chunks_mut(G)).enumerate() {
        let x = widen::<T, G>(src);
        let (mut v, mut b) = ([0.0f64; G], [0.0f64; G]);
        candidates_group(&x, &phi(&x), &mut v, &mut b, grad);
        settle(&x, (&v, &b), out, grad);
        if let Some(g) = times {
            let g = &g[k * G..k * G + out.len()];
            out.iter_mut().zip(g).for_each(|(o, &g)| *o = g * *o);
        }
    }
}

/// [`fast_pair_block`] for f32/f16/bf16, `G` lanes at a time: one Φ and
/// `e^(−x²/2)` per lane for both functions, each settled as in
/// [`block_body`].
#[inline(always)]
fn pair_body<T: FloatDType, const G: usize>(
    src: &[T],
    value: &mut [T],
    slope: &mut [T],
    phi: impl Fn(&[f64; G]) -> Phi<G>,
) {
    let groups = src
        .chunks(G)
        .zip(value.chunks_mut(G))
        .zip(slope.chunks_mut(G));
    for ((src, value), slope) in groups {
        let x = widen::<T, G>(src);
        let p = phi(&x);
        let (mut v, mut b) = ([0.0f64; G], [0.0f64; G]);
        candidates_group(&x, &p, &mut v, &mut b, false);
        settle(&x, (&v, &b), value, false);
        candidates_group(&x, &p, &mut v, &mut b, true);
        settle(&x, (&v, &b), slope, true);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn pair_avx512<T: FloatDType>(src: &[T], value: &mut [T], slope: &mut [T]) {
    if let (Some(src), Some(value), Some(slope)) =
        (as_f32(src), as_f32_mut(value), as_f32_mut(slope))
    {
        return avx512::pair_f32(src, value, slope);
    }
    pair_body::<T, GROUP_AVX512>(src, value, slope, |x| avx512::phi(x))
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn pair_avx2<T: FloatDType>(src: &[T], value: &mut [T], slope: &mut [T]) {
    if let (Some(src), Some(value), Some(slope)) =
        (as_f32(src), as_f32_mut(value), as_f32_mut(slope))
    {
        return avx2::pair_f32(src, value, slope);
    }
    pair_body::<T, GROUP>(src, value, slope, |x| avx2::phi(x))
}

/// `value[i] = T(gelu(src[i]))` and `slope[i] = T(gelu'(src[i]))` (exact
/// GELU), each exactly as [`fast_block`] gives it, from one evaluation of
/// the normal CDF and density per element (about half the work of the two
/// calls). f64 blocks take the references directly.
pub(crate) fn fast_pair_block<T: FloatDType>(src: &[T], value: &mut [T], slope: &mut [T]) {
    if T::DTYPE == crate::DType::F64 {
        for ((v, d), &x) in value.iter_mut().zip(slope.iter_mut()).zip(src) {
            let x = WithDType::to_f64(x);
            (*v, *d) = (reference(x, false), reference(x, true));
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    {
        if crate::primitives::avx512() {
            // SAFETY: the CPU has AVX-512F, AVX2 and FMA (the path says so).
            return unsafe { pair_avx512(src, value, slope) };
        }
        if crate::primitives::avx2_fma() {
            // SAFETY: the CPU has AVX2 and FMA (checked just above).
            return unsafe { pair_avx2(src, value, slope) };
        }
    }
    pair_body::<T, GROUP>(src, value, slope, phi_fast)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn block_avx512<T: FloatDType>(src: &[T], out: &mut [T], grad: bool, times: Option<&[T]>) {
    if let (Some(src), Some(out)) = (as_f32(src), as_f32_mut(out)) {
        let times = times.map(|g| as_f32(g).expect("the same dtype as src"));
        return avx512::block_f32(src, out, grad, times);
    }
    block_body::<T, GROUP_AVX512>(src, out, (grad, times), |x| avx512::phi(x))
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn block_avx2<T: FloatDType>(src: &[T], out: &mut [T], grad: bool, times: Option<&[T]>) {
    if let (Some(src), Some(out)) = (as_f32(src), as_f32_mut(out)) {
        let times = times.map(|g| as_f32(g).expect("the same dtype as src"));
        return avx2::block_f32(src, out, grad, times);
    }
    block_body::<T, GROUP>(src, out, (grad, times), |x| avx2::phi(x))
}

/// `out[i] = T(reference(src[i]))` (exact GELU, or its derivative when
/// `grad`), for a block of any length (the callers pass up to 256), exactly as
/// [`gelu_value_f64`] / [`gelu_grad_f64`] rounded to `T` give it; f64
/// blocks take the reference directly. The fast path runs AVX-512 or AVX2
/// vectors, whichever the CPU's path has (the same IEEE operations, FMAs
/// included, in every version, so the same candidates).
pub(crate) fn fast_block<T: FloatDType>(src: &[T], out: &mut [T], grad: bool) {
    dispatch(src, out, grad, None)
}

/// `out[i] = g[i] · T(gelu'(x[i]))`: GELU's input gradient for a block
/// (the derivative exactly as in [`fast_block`], then one product in `T`).
pub(crate) fn fast_grad_block<T: FloatDType>(x: &[T], g: &[T], out: &mut [T]) {
    dispatch(x, out, true, Some(g))
}

fn dispatch<T: FloatDType>(src: &[T], out: &mut [T], grad: bool, times: Option<&[T]>) {
    if T::DTYPE == crate::DType::F64 {
        for (o, &x) in out.iter_mut().zip(src) {
            *o = reference(WithDType::to_f64(x), grad);
        }
        if let Some(g) = times {
            out.iter_mut().zip(g).for_each(|(o, &g)| *o = g * *o);
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    {
        if crate::primitives::avx512() {
            // SAFETY: the CPU has AVX-512F, AVX2 and FMA (the path says so).
            return unsafe { block_avx512(src, out, grad, times) };
        }
        if crate::primitives::avx2_fma() {
            // SAFETY: the CPU has AVX2 and FMA (checked just above).
            return unsafe { block_avx2(src, out, grad, times) };
        }
    }
    block_body::<T, GROUP>(src, out, (grad, times), phi_fast)
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::{bf16, f16};

    /// The callers' block length.
    const BLOCK: usize = crate::primitives::KERNEL_BLOCK;

    /// Chebyshev coefficients of `erfcx(z) = e^(z²)·erfc(z)` in
    /// `t = (z − K)/(z + K)`, `K = 3.75`, over `z ∈ [0, ∞)` (computed with
    /// 40-digit arithmetic; the omitted tail sums to 3e-17).
    const ERFCX_CHEB: [f64; 23] = [
        0.305_071_540_961_600_2,
        -0.434_841_272_712_577_5,
        0.176_351_193_643_605_5,
        -0.060_710_795_609_249_41,
        0.017_712_068_995_694_11,
        -0.004_321_119_385_567_294,
        0.000_854_216_676_887_098_7,
        -0.000_127_155_090_609_162_7,
        0.000_011_248_167_243_671_19,
        0.000_000_313_063_885_421_821,
        -0.000_000_270_988_068_537_762,
        0.000_000_030_737_622_701_407_69,
        0.000_000_002_515_620_384_817_623,
        -0.000_000_001_028_929_921_320_319,
        0.000_000_000_029_944_052_119_949_94,
        0.000_000_000_026_051_789_687_266_94,
        -0.000_000_000_002_634_839_924_171_969,
        -0.000_000_000_000_643_404_509_890_636_4,
        0.000_000_000_000_112_457_401_801_663_4,
        0.000_000_000_000_017_281_533_389_986_1,
        -0.000_000_000_000_004_264_101_694_942_375,
        -0.000_000_000_000_000_545_371_977_880_190_6,
        0.000_000_000_000_000_158_697_607_761_671_2,
    ];

    /// [`ERFCX_POLY`] is the Chebyshev series through `T₁₇` in monomial
    /// form: Horner on it and Clenshaw on the truncated series agree to
    /// 1e-15 over a dense grid of t.
    #[test]
    fn monomial_form_equals_the_chebyshev_series() {
        let mut worst = 0.0f64;
        for i in 0..=200_000 {
            let t = -1.0 + i as f64 / 100_000.0;
            let (mut b1, mut b2) = (0.0, 0.0);
            for &c in ERFCX_CHEB[1..ERFCX_POLY.len()].iter().rev() {
                let b0 = c + 2.0 * t * b1 - b2;
                b2 = b1;
                b1 = b0;
            }
            let clenshaw = ERFCX_CHEB[0] + t * b1 - b2;
            let horner = ERFCX_POLY.iter().rev().fold(0.0, |p, &a| p * t + a);
            worst = worst.max((horner - clenshaw).abs());
        }
        assert!(worst < 1e-15, "max |Horner − Clenshaw| = {worst:e}");
    }

    /// A dense grid over where GELU's inputs live: every 2⁻¹² step over
    /// [−12, 12], plus tiny and huge magnitudes.
    fn grid() -> Vec<f64> {
        let mut xs: Vec<f64> = (-(12 << 12)..=(12 << 12))
            .map(|i| i as f64 / 4096.0)
            .collect();
        for e in -40..=20 {
            let m = 2f64.powi(e) * 1.37;
            xs.extend([m, -m]);
        }
        xs
    }

    /// Φ of every lane of a group by the portable code and, where the CPU
    /// has them, by the AVX2 and the AVX-512 vectors: all, bit for bit.
    fn phi_group(x: &[f64; GROUP]) -> Phi<GROUP> {
        let portable = phi_fast(x);
        let same = |simd: &Phi<GROUP>, what: &str| {
            for (a, b) in [
                (&portable.phi, &simd.phi),
                (&portable.e, &simd.e),
                (&portable.tail, &simd.tail),
            ] {
                let bits = |v: &[f64; GROUP]| v.map(f64::to_bits);
                assert_eq!(
                    bits(a),
                    bits(b),
                    "{what} lanes differ from the portable code"
                );
            }
        };
        #[cfg(target_arch = "x86_64")]
        if crate::primitives::CpuPath::Avx2.available() {
            // SAFETY: the CPU has AVX2 and FMA (checked just above).
            same(&unsafe { avx2_phi(x) }, "AVX2");
        }
        #[cfg(target_arch = "x86_64")]
        if crate::primitives::CpuPath::Avx512.available() {
            // Two groups of 16 as one of 32: this one twice.
            let mut wide = [0.0; GROUP_AVX512];
            wide[..GROUP].copy_from_slice(x);
            wide[GROUP..].copy_from_slice(x);
            // SAFETY: the CPU has AVX-512F, AVX2 and FMA (checked above).
            let p = unsafe { avx512_phi(&wide) };
            for half in [0, GROUP] {
                let part = |v: &[f64; GROUP_AVX512]| -> [f64; GROUP] {
                    v[half..half + GROUP].try_into().expect("a group")
                };
                let simd = Phi {
                    phi: part(&p.phi),
                    e: part(&p.e),
                    tail: part(&p.tail),
                };
                same(&simd, "AVX-512");
            }
        }
        portable
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn avx2_phi(x: &[f64; GROUP]) -> Phi<GROUP> {
        avx2::phi(x)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx2,fma")]
    unsafe fn avx512_phi(x: &[f64; GROUP_AVX512]) -> Phi<GROUP_AVX512> {
        avx512::phi(x)
    }

    /// The candidate's Φ is within the bounds the rounding test assumes,
    /// with a margin, over a dense grid: the distance from the reference is
    /// below a tenth of [`PHI_BOUND`] plus a quarter of the tail's
    /// [`ERFC_REL_BOUND`]; `e^(−x²/2)` is within `1e-15 + 3e-16·x²` of
    /// `exp`'s, relative (below the slope's 1e-13 wherever φ is not
    /// negligible).
    #[test]
    fn fast_candidate_is_within_its_bound() {
        let xs: Vec<f64> = grid()
            .into_iter()
            .filter(|x| (-40.0..=40.0).contains(x))
            .collect();
        let (mut worst_rel, mut worst_e) = (0.0f64, 0.0f64);
        for chunk in xs.chunks(GROUP) {
            let mut x = [0.0; GROUP];
            x[..chunk.len()].copy_from_slice(chunk);
            let p = phi_group(&x);
            for (i, &x) in chunk.iter().enumerate() {
                let reference = 0.5 * (1.0 + erf(x / SQRT_2));
                let excess = ((p.phi[i] - reference).abs() - PHI_BOUND / 10.0).max(0.0);
                if excess > 0.0 {
                    worst_rel = worst_rel.max(excess / p.tail[i]);
                }
                let e = (-0.5 * x * x).exp();
                if e > 0.0 {
                    // Beyond exp's 2 ulp, the exponent's rounding (z² for
                    // x²/2) scales the error with x².
                    worst_e = worst_e.max((p.e[i] - e).abs() / e / (1e-15 + 3e-16 * x * x));
                }
            }
        }
        assert!(
            worst_rel < ERFC_REL_BOUND / 4.0,
            "max (|Φ_fast − Φ_ref| − PHI_BOUND/10) / tail = {worst_rel:e}"
        );
        assert!(
            worst_e <= 1.0,
            "|e − exp| / exp / (1e-15 + 3e-16·x²) up to {worst_e}"
        );
    }

    /// Max error of the fast f32 GELU against the f64 reference over a
    /// dense grid: the bits are the reference's, so within ½ ulp of f32
    /// wherever the reference is accurate.
    #[test]
    fn f32_block_equals_the_reference_bit_for_bit() {
        let xs = grid();
        for grad in [false, true] {
            for chunk in xs.chunks(BLOCK) {
                let src: Vec<f32> = chunk.iter().map(|&x| x as f32).collect();
                let mut out = vec![0f32; src.len()];
                fast_block(&src, &mut out, grad);
                for (&s, &o) in src.iter().zip(&out) {
                    let x = s as f64;
                    let want = if grad {
                        gelu_grad_f64(x, false)
                    } else {
                        gelu_value_f64(x, false)
                    };
                    assert_eq!(o.to_bits(), (want as f32).to_bits(), "x = {s}, grad {grad}");
                }
            }
        }
    }

    /// One evaluation for both functions gives each one's bits exactly as
    /// its own block does, in every half and single dtype, over the dense
    /// grid and the specials.
    #[test]
    fn pair_block_equals_the_value_and_slope_blocks_bit_for_bit() {
        fn check<T: FloatDType>(xs: &[f64]) {
            let src: Vec<T> = xs.iter().map(|&x| T::from_f64(x)).collect();
            for chunk in src.chunks(BLOCK) {
                let (mut v, mut d) = (vec![T::zero(); chunk.len()], vec![T::zero(); chunk.len()]);
                fast_pair_block(chunk, &mut v, &mut d);
                let (mut v0, mut d0) = (v.clone(), d.clone());
                fast_block(chunk, &mut v0, false);
                fast_block(chunk, &mut d0, true);
                let bits = |s: &[T]| -> Vec<u64> {
                    s.iter().map(|&x| WithDType::to_f64(x).to_bits()).collect()
                };
                assert_eq!(bits(&v), bits(&v0), "{:?} values", T::DTYPE);
                assert_eq!(bits(&d), bits(&d0), "{:?} slopes", T::DTYPE);
            }
        }
        let mut xs = grid();
        xs.extend([
            0.0,
            -0.0,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
            1e30,
            -1e30,
        ]);
        check::<f32>(&xs);
        check::<f16>(&xs);
        check::<bf16>(&xs);
        check::<f64>(&xs[..4096]);
    }

    #[test]
    fn half_blocks_and_specials_equal_the_reference() {
        let xs = [
            0.0,
            -0.0,
            1e-30,
            -3.5,
            -7.25,
            -40.0,
            0.75,
            9.0,
            1e30,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
        ];
        for grad in [false, true] {
            let f = |x: f64| {
                if grad {
                    gelu_grad_f64(x, false)
                } else {
                    gelu_value_f64(x, false)
                }
            };
            // Three times over: whole groups of lanes as well as a short
            // last one, so the specials pass through the vector paths too.
            let src: Vec<f32> = xs
                .iter()
                .cycle()
                .take(3 * xs.len())
                .map(|&x| x as f32)
                .collect();
            let mut out = vec![0f32; src.len()];
            fast_block(&src, &mut out, grad);
            let (mut value, mut slope) = (vec![0f32; src.len()], vec![0f32; src.len()]);
            fast_pair_block(&src, &mut value, &mut slope);
            let pair = if grad { &slope } else { &value };
            for ((&s, o), p) in src.iter().zip(&out).zip(pair) {
                let want = f(s as f64) as f32;
                assert!(o.to_bits() == want.to_bits() || (o.is_nan() && want.is_nan()));
                assert!(p.to_bits() == want.to_bits() || (p.is_nan() && want.is_nan()));
            }
            let src: Vec<bf16> = xs.iter().map(|&x| bf16::from_f64(x)).collect();
            let mut out = vec![bf16::ZERO; xs.len()];
            fast_block(&src, &mut out, grad);
            for (&s, o) in src.iter().zip(&out) {
                let want = bf16::from_f64(f(s.to_f64()));
                assert!(o.to_bits() == want.to_bits() || (o.is_nan() && want.is_nan()));
            }
            let src: Vec<f16> = (-2000..2000)
                .map(|i| f16::from_f64(i as f64 / 250.0))
                .collect();
            for chunk in src.chunks(BLOCK) {
                let mut out = vec![f16::ZERO; chunk.len()];
                fast_block(chunk, &mut out, grad);
                for (&s, o) in chunk.iter().zip(&out) {
                    assert_eq!(o.to_bits(), f16::from_f64(f(s.to_f64())).to_bits());
                }
            }
        }
    }
}
