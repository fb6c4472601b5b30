//! add, sub, mul, fma, div and sqrt in every rounding direction.
//!
//! Two exact routes:
//! - **soft**: integer mantissas in `u128` with a sticky bit (any format;
//!   used for f64 in the directed modes). Products of two mantissas
//!   (≤ 106 bits) are exact; a sum is formed with both operands' leading
//!   bits at bit 125, so what an alignment shift pushes out is ≥ 20 bits
//!   below the leading bit and only ever matters as a sticky bit.
//! - **via f64** (f16, bf16, f32): the operation is done in f64 with the
//!   host's correctly rounded arithmetic, its exact residual recovered by
//!   an error-free transformation (TwoSum, or an `fma` remainder for
//!   division and square root), and the f64 result turned into
//!   round-to-odd; f64 has ≥ p+2 bits for those formats, so rounding that
//!   value once more into the format in any direction is correct.
//!
//! Round-to-nearest f32/f64 add, sub, mul, fma, div and sqrt use the host
//! operations directly (IEEE-correct); only their NaN results are fixed
//! up to the PTX ones.

use super::format::{bit_len, from_f64, round_pack, Fmt, BF16, F16, F32, F64};
use super::{FloatTy, Rnd};

/// The result of an exact sum before rounding: ±(m + sticky)·2^e.
struct Exact {
    neg: bool,
    m: u128,
    e: i32,
    sticky: bool,
}

/// Exact ±ma·2^ea ± mb·2^eb for nonzero mantissas of at most 106 bits.
/// An exact cancellation returns m = 0 without sticky.
fn add_exact(na: bool, ma: u128, ea: i32, nb: bool, mb: u128, eb: i32) -> Exact {
    let (sa, sb) = (125 - bit_len(ma), 125 - bit_len(mb));
    let (mut ma, mut ea, mut mb, mut eb, mut na, mut nb) =
        (ma << sa, ea - sa, mb << sb, eb - sb, na, nb);
    if (ea, ma) < (eb, mb) {
        std::mem::swap(&mut ma, &mut mb);
        std::mem::swap(&mut ea, &mut eb);
        std::mem::swap(&mut na, &mut nb);
    }
    let d = (ea - eb) as u32;
    let (mb, sticky) = if d == 0 {
        (mb, false)
    } else if d < 128 {
        (mb >> d, mb & (u128::MAX >> (128 - d)) != 0)
    } else {
        (0, true)
    };
    if na == nb {
        Exact {
            neg: na,
            m: ma + mb,
            e: ea,
            sticky,
        }
    } else {
        // |a| ≥ |b|: the true value is ma − (mb + δ) with δ in (0, 1) when
        // sticky, i.e. (ma − mb − 1) + (1 − δ).
        Exact {
            neg: na,
            m: ma - mb - sticky as u128,
            e: ea,
            sticky,
        }
    }
}

/// The sign of an exact zero sum `x + y` where both are zeros or x = −y:
/// negative when both are −0, or, rounding towards −∞, unless both are +0.
#[inline]
fn zero_sum_neg(neg_x: bool, neg_y: bool, both_zero: bool, rnd: Rnd) -> bool {
    if both_zero && neg_x == neg_y {
        neg_x
    } else {
        rnd == Rnd::Rm
    }
}

/// Rounds an [`Exact`] into `f`; an exact cancellation is the zero of the
/// rounding direction's sign.
#[inline]
fn round_exact(f: Fmt, x: Exact, rnd: Rnd) -> u64 {
    if x.m == 0 && !x.sticky {
        return if rnd == Rnd::Rm { f.sign() } else { 0 };
    }
    round_pack(f, x.neg, x.m, x.e, x.sticky, rnd)
}

/// `a + b` in `f`, exactly rounded (integer route, any format).
pub(crate) fn soft_add(f: Fmt, a: u64, b: u64, rnd: Rnd) -> u64 {
    if f.is_nan(a) || f.is_nan(b) {
        return f.nan_of(&[a, b]);
    }
    if f.is_inf(a) || f.is_inf(b) {
        if f.is_inf(a) && f.is_inf(b) && (a ^ b) & f.sign() != 0 {
            return f.canonical_nan();
        }
        return if f.is_inf(a) { a } else { b };
    }
    let (za, zb) = (f.is_zero(a), f.is_zero(b));
    if za || zb {
        if za && zb {
            let neg = zero_sum_neg(f.is_neg(a), f.is_neg(b), true, rnd);
            return if neg { f.sign() } else { 0 };
        }
        return if za { b } else { a };
    }
    let (na, ma, ea) = f.unpack(a);
    let (nb, mb, eb) = f.unpack(b);
    round_exact(f, add_exact(na, ma as u128, ea, nb, mb as u128, eb), rnd)
}

/// `a · b` in `f`, exactly rounded (integer route).
pub(crate) fn soft_mul(f: Fmt, a: u64, b: u64, rnd: Rnd) -> u64 {
    if f.is_nan(a) || f.is_nan(b) {
        return f.nan_of(&[a, b]);
    }
    let sign = (a ^ b) & f.sign();
    if f.is_inf(a) || f.is_inf(b) {
        if f.is_zero(a) || f.is_zero(b) {
            return f.canonical_nan();
        }
        return sign | f.inf();
    }
    if f.is_zero(a) || f.is_zero(b) {
        return sign;
    }
    let (_, ma, ea) = f.unpack(a);
    let (_, mb, eb) = f.unpack(b);
    round_pack(f, sign != 0, ma as u128 * mb as u128, ea + eb, false, rnd)
}

/// `a · b + c` in `f`, rounded once (integer route).
pub(crate) fn soft_fma(f: Fmt, a: u64, b: u64, c: u64, rnd: Rnd) -> u64 {
    if f.is_nan(a) || f.is_nan(b) || f.is_nan(c) {
        return f.nan_of(&[a, b, c]);
    }
    let psign = (a ^ b) & f.sign();
    if f.is_inf(a) || f.is_inf(b) {
        if f.is_zero(a) || f.is_zero(b) {
            return f.canonical_nan();
        }
        if f.is_inf(c) && (c & f.sign()) != psign {
            return f.canonical_nan();
        }
        return psign | f.inf();
    }
    if f.is_inf(c) {
        return c;
    }
    if f.is_zero(a) || f.is_zero(b) {
        if f.is_zero(c) {
            let neg = zero_sum_neg(psign != 0, f.is_neg(c), true, rnd);
            return if neg { f.sign() } else { 0 };
        }
        return c;
    }
    if f.is_zero(c) {
        // a·b + 0 is a·b rounded (a nonzero product keeps its sign).
        return soft_mul(f, a, b, rnd);
    }
    let (_, ma, ea) = f.unpack(a);
    let (_, mb, eb) = f.unpack(b);
    let (nc, mc, ec) = f.unpack(c);
    let p = ma as u128 * mb as u128;
    round_exact(
        f,
        add_exact(psign != 0, p, ea + eb, nc, mc as u128, ec),
        rnd,
    )
}

/// `a / b` in `f`, exactly rounded (integer route).
pub(crate) fn soft_div(f: Fmt, a: u64, b: u64, rnd: Rnd) -> u64 {
    if f.is_nan(a) || f.is_nan(b) {
        return f.nan_of(&[a, b]);
    }
    let sign = (a ^ b) & f.sign();
    let (ia, ib, za, zb) = (f.is_inf(a), f.is_inf(b), f.is_zero(a), f.is_zero(b));
    if (ia && ib) || (za && zb) {
        return f.canonical_nan();
    }
    if ia || zb {
        return sign | f.inf();
    }
    if ib || za {
        return sign;
    }
    let (_, ma, ea) = f.unpack(a);
    let (_, mb, eb) = f.unpack(b);
    // Dividend's leading bit at 126, divisor's at 63: a quotient of 63 or
    // 64 bits, far more than the 55 the rounding needs.
    let sa = 127 - bit_len(ma as u128);
    let sb = 64 - bit_len(mb as u128);
    let n = (ma as u128) << sa;
    let d = (mb as u128) << sb;
    let (q, r) = (n / d, n % d);
    round_pack(f, sign != 0, q, (ea - sa) - (eb - sb), r != 0, rnd)
}

/// `sqrt(a)` in `f`, exactly rounded (integer route).
pub(crate) fn soft_sqrt(f: Fmt, a: u64, rnd: Rnd) -> u64 {
    if f.is_nan(a) {
        return f.pass_nan(a);
    }
    if f.is_zero(a) {
        return a;
    }
    if f.is_neg(a) {
        return f.canonical_nan();
    }
    if f.is_inf(a) {
        return a;
    }
    let (_, m, e) = f.unpack(a);
    // Leading bit at 125 or 124 so that the exponent left is even.
    let mut k = 126 - bit_len(m as u128);
    if (e - k) & 1 != 0 {
        k -= 1;
    }
    let n = (m as u128) << k;
    let r = n.isqrt();
    round_pack(f, false, r, (e - k) / 2, r * r != n, rnd)
}

/// `s` (= rn(x) in f64) and the sign of the residual x − s made into the
/// round-to-odd of x: s when exact, otherwise whichever of s and its
/// neighbour towards x has an odd last bit.
#[inline(always)]
fn to_odd(s: f64, residual_sign: f64) -> f64 {
    let b = s.to_bits();
    if residual_sign == 0.0 || b & 1 == 1 {
        return s;
    }
    // Magnitude up when the residual has s's sign, else down (s ≠ 0 here:
    // a zero rn result is exact for these operations).
    if (residual_sign > 0.0) == (s > 0.0) {
        f64::from_bits(b + 1)
    } else {
        f64::from_bits(b - 1)
    }
}

/// Error of the f64 sum `s = x + y` (TwoSum; exact without overflow).
#[inline(always)]
fn two_sum_err(x: f64, y: f64, s: f64) -> f64 {
    let yy = s - x;
    (x - (s - yy)) + (y - yy)
}

/// A finite, non-NaN f16/bf16/f32 value, exactly, as f64.
#[inline(always)]
pub(crate) fn widen(f: Fmt, x: u64) -> f64 {
    match f.bits {
        32 => f32::from_bits(x as u32) as f64,
        64 => f64::from_bits(x),
        _ if f.man == 10 => f32::from_bits(super::format::f16_to_f32_bits(x as u16)) as f64,
        _ => f32::from_bits((x as u32) << 16) as f64,
    }
}

/// `x + y` for f16/bf16/f32 operands (already checked non-NaN) via f64.
#[inline(always)]
fn narrow_sum(f: Fmt, x: f64, y: f64, rnd: Rnd) -> u64 {
    let s = x + y;
    if s.is_nan() {
        return f.canonical_nan();
    }
    if s == 0.0 {
        let both_zero = x == 0.0 && y == 0.0;
        let neg = zero_sum_neg(x.is_sign_negative(), y.is_sign_negative(), both_zero, rnd);
        return if neg { f.sign() } else { 0 };
    }
    if s.is_infinite() {
        return from_f64(f, s, rnd);
    }
    from_f64(f, to_odd(s, two_sum_err(x, y, s)), rnd)
}

/// f16/bf16/f32 `a + b` via f64.
#[inline(always)]
fn narrow_add(f: Fmt, a: u64, b: u64, rnd: Rnd) -> u64 {
    if f.is_nan(a) || f.is_nan(b) {
        return f.canonical_nan();
    }
    narrow_sum(f, widen(f, a), widen(f, b), rnd)
}

/// f16/bf16/f32 `a · b` via f64 (the product of two ≤ 24-bit mantissas is
/// exact in f64, and far from its overflow and underflow).
#[inline(always)]
fn narrow_mul(f: Fmt, a: u64, b: u64, rnd: Rnd) -> u64 {
    if f.is_nan(a) || f.is_nan(b) {
        return f.canonical_nan();
    }
    let p = widen(f, a) * widen(f, b);
    if p.is_nan() {
        return f.canonical_nan();
    }
    from_f64(f, p, rnd)
}

/// f16/bf16/f32 `a · b + c` via f64: the product is exact, the sum gets
/// its residual from TwoSum.
#[inline(always)]
fn narrow_fma(f: Fmt, a: u64, b: u64, c: u64, rnd: Rnd) -> u64 {
    if f.is_nan(a) || f.is_nan(b) || f.is_nan(c) {
        return f.canonical_nan();
    }
    let p = widen(f, a) * widen(f, b);
    if p.is_nan() {
        return f.canonical_nan();
    }
    narrow_sum(f, p, widen(f, c), rnd)
}

/// f16/bf16/f32 `a / b` via f64 and the exact remainder a − q·b.
#[inline(always)]
fn narrow_div(f: Fmt, a: u64, b: u64, rnd: Rnd) -> u64 {
    if f.is_nan(a) || f.is_nan(b) {
        return f.canonical_nan();
    }
    let (x, y) = (widen(f, a), widen(f, b));
    let q = x / y;
    if q.is_nan() {
        return f.canonical_nan();
    }
    if q == 0.0 || q.is_infinite() {
        // Exact: a zero or infinite operand (the quotient of two finite
        // nonzero narrow values is within f64's normal range).
        return from_f64(f, q, rnd);
    }
    // x/y = q + r/y, exact r: the residual has the sign of r·y.
    let r = (-q).mul_add(y, x);
    from_f64(f, to_odd(q, r * y.signum()), rnd)
}

/// f16/bf16/f32 `sqrt(a)` via f64 and the exact remainder a − s².
#[inline(always)]
fn narrow_sqrt(f: Fmt, a: u64, rnd: Rnd) -> u64 {
    if f.is_nan(a) {
        return f.canonical_nan();
    }
    let x = widen(f, a);
    if x == 0.0 {
        return a;
    }
    if x < 0.0 {
        return f.canonical_nan();
    }
    let s = x.sqrt();
    if s.is_infinite() {
        return a;
    }
    let r = (-s).mul_add(s, x);
    from_f64(f, to_odd(s, r), rnd)
}

/// Flushes a subnormal result (`ftz`) and clamps to [0, 1] (`sat`, NaN and
/// −0 to +0).
#[inline]
pub(crate) fn finish(f: Fmt, r: u64, ftz: bool, sat: bool) -> u64 {
    let r = if ftz { f.flush(r) } else { r };
    if sat {
        saturate(f, r)
    } else {
        r
    }
}

/// Clamp to [+0, 1]: NaN and every negative value (−0 included) to +0.
#[inline]
pub(crate) fn saturate(f: Fmt, x: u64) -> u64 {
    if f.is_nan(x) || f.is_neg(x) {
        0
    } else if x > f.one() {
        f.one()
    } else {
        x
    }
}

/// Whether `.ftz` applies to `ty` (f32, and f16 whose PTX forms take it).
#[inline]
pub(crate) fn ftz_applies(ty: FloatTy) -> bool {
    matches!(ty, FloatTy::F32 | FloatTy::F16)
}

/// Inputs masked to the type and flushed if `ftz` applies.
#[inline]
pub(crate) fn prep(f: Fmt, x: u64, ftz: bool) -> u64 {
    let x = x & f.mask();
    if ftz {
        f.flush(x)
    } else {
        x
    }
}

/// The NaN of an f64 host result: the first NaN operand, quiet, else the
/// canonical NaN.
#[inline]
fn f64_result(r: f64, ops: &[u64]) -> u64 {
    if r.is_nan() {
        F64.nan_of(ops)
    } else {
        r.to_bits()
    }
}

/// An f32 host result with its NaN made canonical.
#[inline]
fn f32_result(r: f32) -> u64 {
    if r.is_nan() {
        super::format::CANON32 as u64
    } else {
        r.to_bits() as u64
    }
}

/// Which arithmetic operation [`binary`] performs.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Add,
    Mul,
    Div,
}

/// `a op b` on `ty` in direction `rnd`, inputs already prepared.
pub(crate) fn binary(ty: FloatTy, op: Op, a: u64, b: u64, rnd: Rnd) -> u64 {
    match (ty, rnd) {
        (FloatTy::F32, Rnd::Rn) => {
            let (x, y) = (f32::from_bits(a as u32), f32::from_bits(b as u32));
            f32_result(match op {
                Op::Add => x + y,
                Op::Mul => x * y,
                Op::Div => x / y,
            })
        }
        (FloatTy::F64, Rnd::Rn) => {
            let (x, y) = (f64::from_bits(a), f64::from_bits(b));
            f64_result(
                match op {
                    Op::Add => x + y,
                    Op::Mul => x * y,
                    Op::Div => x / y,
                },
                &[a, b],
            )
        }
        (FloatTy::F64, _) => match op {
            Op::Add => soft_add(F64, a, b, rnd),
            Op::Mul => soft_mul(F64, a, b, rnd),
            Op::Div => soft_div(F64, a, b, rnd),
        },
        (FloatTy::F32, _) => narrow_binary(F32, op, a, b, rnd),
        (FloatTy::F16, _) => narrow_binary(F16, op, a, b, rnd),
        (FloatTy::Bf16, _) => narrow_binary(BF16, op, a, b, rnd),
    }
}

/// A narrow-format `a op b` (inlined per format by [`binary`]).
#[inline(always)]
fn narrow_binary(f: Fmt, op: Op, a: u64, b: u64, rnd: Rnd) -> u64 {
    match op {
        Op::Add => narrow_add(f, a, b, rnd),
        Op::Mul => narrow_mul(f, a, b, rnd),
        Op::Div => narrow_div(f, a, b, rnd),
    }
}

/// `a · b + c` on `ty` in direction `rnd`, inputs already prepared.
pub(crate) fn fma(ty: FloatTy, a: u64, b: u64, c: u64, rnd: Rnd) -> u64 {
    match (ty, rnd) {
        (FloatTy::F32, Rnd::Rn) => {
            let [x, y, z] = [a, b, c].map(|v| f32::from_bits(v as u32));
            f32_result(x.mul_add(y, z))
        }
        (FloatTy::F64, Rnd::Rn) => {
            let [x, y, z] = [a, b, c].map(f64::from_bits);
            f64_result(x.mul_add(y, z), &[a, b, c])
        }
        (FloatTy::F64, _) => soft_fma(F64, a, b, c, rnd),
        // One instance per format, so each is specialized to its constants.
        (FloatTy::F32, _) => narrow_fma(F32, a, b, c, rnd),
        (FloatTy::F16, _) => narrow_fma(F16, a, b, c, rnd),
        (FloatTy::Bf16, _) => narrow_fma(BF16, a, b, c, rnd),
    }
}

/// `sqrt(a)` on `ty` in direction `rnd`, input already prepared.
pub(crate) fn sqrt(ty: FloatTy, a: u64, rnd: Rnd) -> u64 {
    match (ty, rnd) {
        (FloatTy::F32, Rnd::Rn) => f32_result(f32::from_bits(a as u32).sqrt()),
        (FloatTy::F64, Rnd::Rn) => f64_result(f64::from_bits(a).sqrt(), &[a]),
        (FloatTy::F64, _) => soft_sqrt(F64, a, rnd),
        (FloatTy::F32, _) => narrow_sqrt(F32, a, rnd),
        (FloatTy::F16, _) => narrow_sqrt(F16, a, rnd),
        (FloatTy::Bf16, _) => narrow_sqrt(BF16, a, rnd),
    }
}
