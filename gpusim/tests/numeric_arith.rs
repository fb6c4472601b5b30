//! add/sub/mul/fma/div/sqrt/rcp on f16, bf16, f32 and f64 in all four
//! roundings against the exact references of `numeric_common` (integer
//! mantissa arithmetic, rounding by comparison with the neighbours), on
//! biased random operands and built cancellation/underflow/overflow cases;
//! plus `.ftz`, `.sat`, NaN propagation and the `.full`/`.approx` forms.

mod numeric_common;

use leangrad_gpusim::numeric::{
    fadd, fdiv, ffma, fmul, frcp, fsqrt, fsub, FloatTy, Precision, Rnd,
};
use numeric_common::*;
use std::cmp::Ordering;

/// The NaN an operation on `ops` must return: f64 passes on the first NaN
/// operand made quiet, the narrower types return the canonical NaN.
fn nan_of(ty: FloatTy, ops: &[u64]) -> u64 {
    let f = fm(ty);
    if ty == FloatTy::F64 {
        if let Some(&x) = ops.iter().find(|&&x| f.is_nan(x)) {
            return x | (1 << 51);
        }
    }
    f.canon()
}

fn ref_add(ty: FloatTy, a: u64, b: u64, rnd: Rnd) -> u64 {
    let f = fm(ty);
    if f.is_nan(a) || f.is_nan(b) {
        return nan_of(ty, &[a, b]);
    }
    if f.is_inf(a) && f.is_inf(b) && f.neg(a) != f.neg(b) {
        return f.canon();
    }
    if f.is_inf(a) {
        return a;
    }
    if f.is_inf(b) {
        return b;
    }
    let sum = Dy::of(f, a).add(&Dy::of(f, b));
    if sum.is_zero() {
        return zero_sum(f, f.neg(a), f.neg(b), f.is_zero(a) && f.is_zero(b), rnd);
    }
    round_ref(f, &sum, rnd)
}

fn ref_mul(ty: FloatTy, a: u64, b: u64, rnd: Rnd) -> u64 {
    let f = fm(ty);
    if f.is_nan(a) || f.is_nan(b) {
        return nan_of(ty, &[a, b]);
    }
    let sign = (a ^ b) & f.sign();
    if f.is_inf(a) || f.is_inf(b) {
        return if f.is_zero(a) || f.is_zero(b) {
            f.canon()
        } else {
            sign | f.inf()
        };
    }
    if f.is_zero(a) || f.is_zero(b) {
        return sign;
    }
    round_ref(f, &Dy::of(f, a).mul(&Dy::of(f, b)), rnd)
}

fn ref_fma(ty: FloatTy, a: u64, b: u64, c: u64, rnd: Rnd) -> u64 {
    let f = fm(ty);
    if f.is_nan(a) || f.is_nan(b) || f.is_nan(c) {
        return nan_of(ty, &[a, b, c]);
    }
    let psign = (a ^ b) & f.sign();
    if f.is_inf(a) || f.is_inf(b) {
        if f.is_zero(a) || f.is_zero(b) || (f.is_inf(c) && c & f.sign() != psign) {
            return f.canon();
        }
        return psign | f.inf();
    }
    if f.is_inf(c) {
        return c;
    }
    let p = Dy::of(f, a).mul(&Dy::of(f, b));
    let sum = p.add(&Dy::of(f, c));
    if sum.is_zero() {
        return zero_sum(f, psign != 0, f.neg(c), p.is_zero() && f.is_zero(c), rnd);
    }
    round_ref(f, &sum, rnd)
}

/// An f64 of any format's value, for seeding the implicit references.
fn to_f64(ty: FloatTy, x: u64) -> f64 {
    match ty {
        FloatTy::F16 => half::f16::from_bits(x as u16).to_f64(),
        FloatTy::Bf16 => half::bf16::from_bits(x as u16).to_f64(),
        FloatTy::F32 => f32::from_bits(x as u32) as f64,
        FloatTy::F64 => f64::from_bits(x),
    }
}

/// Magnitude bits of a positive f64 rounded (any way) into `ty`.
fn seed(ty: FloatTy, v: f64) -> u64 {
    let v = v.abs();
    match ty {
        FloatTy::F16 => half::f16::from_f64(v).to_bits() as u64,
        FloatTy::Bf16 => half::bf16::from_f64(v).to_bits() as u64,
        FloatTy::F32 => (v as f32).to_bits() as u64,
        FloatTy::F64 => v.to_bits(),
    }
}

fn ref_div(ty: FloatTy, a: u64, b: u64, rnd: Rnd) -> u64 {
    let f = fm(ty);
    if f.is_nan(a) || f.is_nan(b) {
        return nan_of(ty, &[a, b]);
    }
    let sign = (a ^ b) & f.sign();
    let (ia, ib, za, zb) = (f.is_inf(a), f.is_inf(b), f.is_zero(a), f.is_zero(b));
    if (ia && ib) || (za && zb) {
        return f.canon();
    }
    if ia || zb {
        return sign | f.inf();
    }
    if ib || za {
        return sign;
    }
    let (x, y) = (Dy::of(f, a).abs(), Dy::of(f, b).abs());
    let s = seed(ty, to_f64(ty, a) / to_f64(ty, b));
    round_implicit(
        f,
        sign != 0,
        s,
        |c| c.mul(&y).cmp_mag(&x) != Ordering::Greater,
        |lo, hi| x.twice().cmp_mag(&lo.add(hi).mul(&y)),
        |c| c.mul(&y).cmp_mag(&x) == Ordering::Equal,
        rnd,
    )
}

fn ref_sqrt(ty: FloatTy, a: u64, rnd: Rnd) -> u64 {
    let f = fm(ty);
    if f.is_nan(a) {
        return nan_of(ty, &[a]);
    }
    if f.is_zero(a) {
        return a;
    }
    if f.neg(a) {
        return f.canon();
    }
    if f.is_inf(a) {
        return a;
    }
    let x = Dy::of(f, a);
    let s = seed(ty, to_f64(ty, a).sqrt());
    round_implicit(
        f,
        false,
        s,
        |c| c.mul(c).cmp_mag(&x) != Ordering::Greater,
        |lo, hi| {
            let m = lo.add(hi);
            x.twice().twice().cmp_mag(&m.mul(&m))
        },
        |c| c.mul(c).cmp_mag(&x) == Ordering::Equal,
        rnd,
    )
}

const TYPES: [FloatTy; 4] = [FloatTy::F16, FloatTy::Bf16, FloatTy::F32, FloatTy::F64];

/// Cases per type: the 32/64-bit types get the most.
fn count(ty: FloatTy) -> usize {
    match ty {
        FloatTy::F32 | FloatTy::F64 => 100_000,
        _ => 25_000,
    }
}

/// `x` moved `d` representable values away in magnitude (sign kept).
fn nudge(f: Fm, x: u64, d: i64) -> u64 {
    let abs = f.sign() - 1;
    let mag = ((x & abs) as i128 + d as i128).clamp(0, abs as i128) as u64;
    (x & f.sign()) | mag
}

/// An operand near `x` in magnitude (a few binades away, random bits).
fn near(rng: &mut Rng, f: Fm, x: u64) -> u64 {
    let field = ((x >> f.man) & ((1 << f.exp) - 1)) as i64;
    let span = f.man as i64 + 3;
    let nf = (field + rng.below(2 * span as u64 + 1) as i64 - span).clamp(0, (1 << f.exp) - 2);
    let sign = if rng.next() & 1 == 1 { f.sign() } else { 0 };
    sign | ((nf as u64) << f.man) | (rng.next() & ((1 << f.man) - 1))
}

#[test]
fn add_sub_all_roundings() {
    for ty in TYPES {
        let f = fm(ty);
        let mut rng = Rng(10 + ty as u64);
        for i in 0..count(ty) {
            let a = operand(&mut rng, f);
            let b = match i % 4 {
                0 | 1 => operand(&mut rng, f),
                2 => near(&mut rng, f, a),
                // −a nudged by a few ulps: heavy cancellation
                _ => nudge(f, a ^ f.sign(), rng.below(7) as i64 - 3),
            };
            for rnd in RNDS {
                let got = fadd(ty, a, b, rnd, false, false);
                assert_eq!(
                    got,
                    ref_add(ty, a, b, rnd),
                    "{ty:?} {a:#x} + {b:#x} {rnd:?}"
                );
                let got = fsub(ty, a, b, rnd, false, false);
                let nb = if f.is_nan(b) {
                    b
                } else {
                    (b ^ f.sign()) & f.mask()
                };
                let want = ref_add(ty, a, nb, rnd);
                assert_eq!(got, want, "{ty:?} {a:#x} - {b:#x} {rnd:?}");
            }
        }
    }
}

#[test]
fn mul_all_roundings() {
    for ty in TYPES {
        let f = fm(ty);
        let mut rng = Rng(20 + ty as u64);
        for i in 0..count(ty) {
            let a = operand(&mut rng, f);
            let b = if i % 3 == 0 {
                // products around the underflow and overflow thresholds
                let target = if i % 2 == 0 {
                    f.man as i64 + 2
                } else {
                    -(f.bias()) + 1
                };
                let fa = ((a >> f.man) & ((1 << f.exp) - 1)) as i64 - f.bias();
                let e =
                    (target - fa + f.bias() + rng.below(5) as i64 - 2).clamp(0, (1 << f.exp) - 2);
                ((e as u64) << f.man) | (rng.next() & (f.sign() | ((1 << f.man) - 1)))
            } else {
                operand(&mut rng, f)
            } & f.mask();
            for rnd in RNDS {
                let got = fmul(ty, a, b, rnd, false, false);
                assert_eq!(
                    got,
                    ref_mul(ty, a, b, rnd),
                    "{ty:?} {a:#x} * {b:#x} {rnd:?}"
                );
            }
        }
    }
}

#[test]
fn fma_all_roundings() {
    for ty in TYPES {
        let f = fm(ty);
        let mut rng = Rng(30 + ty as u64);
        for i in 0..count(ty) {
            let a = operand(&mut rng, f);
            let b = if i % 2 == 0 {
                operand(&mut rng, f)
            } else {
                near(&mut rng, f, f.one())
            };
            let c = match i % 5 {
                0 | 1 => operand(&mut rng, f),
                2 => near(&mut rng, f, a),
                // −round(a·b) nudged by a few ulps: the product's low half decides
                _ => {
                    let p = ref_mul(ty, a, b, Rnd::Rn);
                    if f.is_nan(p) || f.is_inf(p) {
                        operand(&mut rng, f)
                    } else {
                        nudge(f, p ^ f.sign(), rng.below(5) as i64 - 2)
                    }
                }
            };
            for rnd in RNDS {
                let got = ffma(ty, a, b, c, rnd, false, false);
                assert_eq!(
                    got,
                    ref_fma(ty, a, b, c, rnd),
                    "{ty:?} fma({a:#x}, {b:#x}, {c:#x}) {rnd:?}"
                );
            }
        }
    }
}

#[test]
fn div_rcp_all_roundings() {
    for ty in TYPES {
        let f = fm(ty);
        let mut rng = Rng(40 + ty as u64);
        for i in 0..count(ty) {
            let a = operand(&mut rng, f);
            let b = if i % 3 == 0 {
                near(&mut rng, f, a)
            } else {
                operand(&mut rng, f)
            };
            for rnd in RNDS {
                let got = fdiv(ty, a, b, Precision::Ieee(rnd), false);
                assert_eq!(
                    got,
                    ref_div(ty, a, b, rnd),
                    "{ty:?} {a:#x} / {b:#x} {rnd:?}"
                );
                if i % 4 == 0 {
                    let got = frcp(ty, b, Precision::Ieee(rnd), false);
                    assert_eq!(
                        got,
                        ref_div(ty, f.one(), b, rnd),
                        "{ty:?} rcp {b:#x} {rnd:?}"
                    );
                }
            }
        }
    }
}

#[test]
fn sqrt_all_roundings() {
    for ty in TYPES {
        let f = fm(ty);
        let mut rng = Rng(50 + ty as u64);
        for i in 0..count(ty) {
            let mut a = operand(&mut rng, f);
            if i % 2 == 0 {
                a &= !f.sign();
            }
            if i % 7 == 0 {
                // exact squares and their neighbours
                let r = operand(&mut rng, f) & !f.sign();
                let sq = ref_mul(ty, r, r, Rnd::Rn);
                a = nudge(f, sq, rng.below(3) as i64 - 1);
            }
            for rnd in RNDS {
                let got = fsqrt(ty, a, Precision::Ieee(rnd), false);
                assert_eq!(got, ref_sqrt(ty, a, rnd), "{ty:?} sqrt {a:#x} {rnd:?}");
            }
        }
    }
}

/// The reference under `.ftz` (f32 and f16): inputs and result flushed.
fn flush(f: Fm, x: u64) -> u64 {
    if f.is_sub(x) {
        x & f.sign()
    } else {
        x
    }
}

fn sat(f: Fm, x: u64) -> u64 {
    if f.is_nan(x) || f.neg(x) {
        0
    } else if x > f.one() {
        f.one()
    } else {
        x
    }
}

#[test]
fn ftz_and_sat() {
    let mut rng = Rng(60);
    for ty in [FloatTy::F32, FloatTy::F16, FloatTy::Bf16, FloatTy::F64] {
        let f = fm(ty);
        // .ftz only exists for f32 and f16 arithmetic
        let ftz_on = matches!(ty, FloatTy::F32 | FloatTy::F16);
        for i in 0..20_000 {
            let pick = |rng: &mut Rng| {
                if rng.below(3) == 0 {
                    // subnormal
                    (rng.next() & (f.sign() | ((1 << f.man) - 1))) | 1
                } else {
                    operand(rng, f)
                }
            };
            let (a, b, c) = (pick(&mut rng), pick(&mut rng), pick(&mut rng));
            let rnd = RNDS[i % 4];
            let fl = |x| if ftz_on { flush(f, x) } else { x };
            let (fa, fb, fc) = (fl(a), fl(b), fl(c));
            let cases = [
                (
                    fadd(ty, a, b, rnd, true, false),
                    fl(ref_add(ty, fa, fb, rnd)),
                ),
                (
                    fmul(ty, a, b, rnd, true, false),
                    fl(ref_mul(ty, fa, fb, rnd)),
                ),
                (
                    ffma(ty, a, b, c, rnd, true, false),
                    fl(ref_fma(ty, fa, fb, fc, rnd)),
                ),
                (
                    fdiv(ty, a, b, Precision::Ieee(rnd), true),
                    fl(ref_div(ty, fa, fb, rnd)),
                ),
                (
                    fsqrt(ty, a, Precision::Ieee(rnd), true),
                    fl(ref_sqrt(ty, fa, rnd)),
                ),
                (
                    fadd(ty, a, b, rnd, false, true),
                    sat(f, ref_add(ty, a, b, rnd)),
                ),
                (
                    fmul(ty, a, b, rnd, true, true),
                    sat(f, fl(ref_mul(ty, fa, fb, rnd))),
                ),
                (
                    ffma(ty, a, b, c, rnd, false, true),
                    sat(f, ref_fma(ty, a, b, c, rnd)),
                ),
            ];
            for (k, (got, want)) in cases.into_iter().enumerate() {
                assert_eq!(
                    got, want,
                    "{ty:?} case {k} a={a:#x} b={b:#x} c={c:#x} {rnd:?}"
                );
            }
        }
    }
    // flushing is of the rounded result: a product just below the smallest
    // normal that rounds up to it stays
    let below = 0x3f7f_ffffu64; // 0.99999994
    let min_normal = 0x0080_0000u64;
    assert_eq!(
        fmul(FloatTy::F32, below, min_normal, Rnd::Rp, true, false),
        min_normal
    );
    assert_eq!(
        fmul(FloatTy::F32, below, min_normal, Rnd::Rz, true, false),
        0
    );
    assert_eq!(
        fmul(
            FloatTy::F32,
            below | 1 << 31,
            min_normal,
            Rnd::Rz,
            true,
            false
        ),
        1 << 31
    );
}

#[test]
fn nan_propagation_and_specials() {
    let qnan = 0x7ff8_0000_0000_1234u64;
    let snan = 0xfff0_0000_0000_0042u64;
    let one = d(1.0);
    for rnd in RNDS {
        assert_eq!(fadd(FloatTy::F64, one, qnan, rnd, false, false), qnan);
        assert_eq!(
            fadd(FloatTy::F64, snan, qnan, rnd, false, false),
            snan | 1 << 51
        );
        assert_eq!(
            ffma(FloatTy::F64, one, one, snan, rnd, false, false),
            snan | 1 << 51
        );
        assert_eq!(
            fadd(
                FloatTy::F64,
                d(f64::INFINITY),
                d(f64::NEG_INFINITY),
                rnd,
                false,
                false
            ),
            0x7fff_ffff_ffff_ffff
        );
        assert_eq!(
            fmul(FloatTy::F32, s(0.0), s(f32::INFINITY), rnd, false, false),
            0x7fff_ffff
        );
        assert_eq!(
            fadd(FloatTy::F32, 0x7f80_0001, s(1.0), rnd, false, false),
            0x7fff_ffff
        );
        assert_eq!(
            fadd(FloatTy::F16, 0x7c01, 0x3c00, rnd, false, false),
            0x7fff
        );
        assert_eq!(
            fadd(FloatTy::Bf16, 0xff81, 0x3f80, rnd, false, false),
            0x7fff
        );
        // x + (−x) is +0, −0 only rounding down; −0 + −0 = −0
        assert_eq!(
            fadd(FloatTy::F32, s(1.5), s(-1.5), rnd, false, false),
            if rnd == Rnd::Rm { 0x8000_0000 } else { 0 }
        );
        assert_eq!(
            fadd(FloatTy::F64, d(-0.0), d(-0.0), rnd, false, false),
            d(-0.0)
        );
        assert_eq!(
            fsqrt(FloatTy::F64, d(-0.0), Precision::Ieee(rnd), false),
            d(-0.0)
        );
    }
    // overflow by direction
    let max = d(f64::MAX);
    assert_eq!(
        fadd(FloatTy::F64, max, max, Rnd::Rn, false, false),
        d(f64::INFINITY)
    );
    assert_eq!(fadd(FloatTy::F64, max, max, Rnd::Rz, false, false), max);
    assert_eq!(
        fmul(FloatTy::F32, s(-3e38), s(10.0), Rnd::Rp, false, false),
        s(-f32::MAX)
    );
    assert_eq!(
        fmul(FloatTy::F32, s(-3e38), s(10.0), Rnd::Rm, false, false),
        s(f32::NEG_INFINITY)
    );
    // fma is single-rounded: a·b + c with the product's low half deciding
    let a = s(1.0 + f32::EPSILON);
    let c = s(-(1.0 + 2.0 * f32::EPSILON));
    assert_eq!(
        ffma(FloatTy::F32, a, a, c, Rnd::Rn, false, false),
        s(f32::EPSILON * f32::EPSILON)
    );
}

#[test]
fn full_and_approx_forms() {
    let mut rng = Rng(70);
    for _ in 0..50_000 {
        let a = operand(&mut rng, F32);
        let b = operand(&mut rng, F32);
        // .full: exactly rounded, within its 2 ulp
        assert_eq!(
            fdiv(FloatTy::F32, a, b, Precision::Full, false),
            ref_div(FloatTy::F32, a, b, Rnd::Rn)
        );
        assert_eq!(
            fsqrt(FloatTy::F32, a, Precision::Approx, false),
            ref_sqrt(FloatTy::F32, a, Rnd::Rn)
        );
        assert_eq!(
            frcp(FloatTy::F32, b, Precision::Approx, false),
            ref_div(FloatTy::F32, F32.one(), b, Rnd::Rn)
        );
        // div.approx: exact except 2^126 < |b| < 2^128, where 1/b underflows
        let got = fdiv(FloatTy::F32, a, b, Precision::Approx, false);
        let babs = b & 0x7fff_ffff;
        if babs > 0x7e80_0000 && babs < 0x7f80_0000 {
            if F32.is_nan(a) || F32.is_inf(a) {
                assert_eq!(got, 0x7fff_ffff);
            } else {
                assert_eq!(got, (a ^ b) & 0x8000_0000);
            }
        } else {
            assert_eq!(got, ref_div(FloatTy::F32, a, b, Rnd::Rn), "{a:#x} / {b:#x}");
        }
        // .ftz versions flush
        let (fa, fb) = (flush(F32, a), flush(F32, b));
        assert_eq!(
            frcp(FloatTy::F32, b, Precision::Approx, true),
            flush(F32, ref_div(FloatTy::F32, F32.one(), fb, Rnd::Rn))
        );
        assert_eq!(
            fdiv(FloatTy::F32, a, b, Precision::Full, true),
            flush(F32, ref_div(FloatTy::F32, fa, fb, Rnd::Rn))
        );
    }
}
