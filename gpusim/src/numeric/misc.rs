//! min/max, abs, neg, copysign and comparisons: bit operations and orders.

use super::arith::{ftz_applies, prep};
use super::format::Fmt;
use super::{CmpOp, FloatTy};

/// A key ordering non-NaN values of `f` as numbers, with −0 below +0.
#[inline]
fn order_key(f: Fmt, x: u64) -> i64 {
    let mag = (x & f.abs_mask()) as i64;
    if f.is_neg(x) {
        -mag - 1
    } else {
        mag
    }
}

/// See [`super::fminmax`]. PTX: one NaN input gives the other input, two
/// give the canonical NaN, `.NaN` makes any NaN input give the canonical
/// NaN, and −0.0 < +0.0.
pub(crate) fn fminmax(ty: FloatTy, a: u64, b: u64, is_max: bool, ftz: bool, nan: bool) -> u64 {
    let f = Fmt::of(ty);
    let ftz = ftz && ftz_applies(ty);
    let (a, b) = (prep(f, a, ftz), prep(f, b, ftz));
    let (an, bn) = (f.is_nan(a), f.is_nan(b));
    if an || bn {
        return if nan || (an && bn) {
            f.canonical_nan()
        } else if an {
            b
        } else {
            a
        };
    }
    let a_less = order_key(f, a) < order_key(f, b);
    if a_less != is_max {
        a
    } else {
        b
    }
}

/// See [`super::fabs`]: the sign cleared; a NaN passes through unchanged
/// (the ISA: "For abs.f64, NaN input is passed through unchanged"; for the
/// other types it leaves the NaN unspecified).
pub(crate) fn fabs(ty: FloatTy, a: u64, ftz: bool) -> u64 {
    let f = Fmt::of(ty);
    let a = prep(f, a, ftz && ftz_applies(ty));
    if f.is_nan(a) {
        a
    } else {
        a & f.abs_mask()
    }
}

/// See [`super::fneg`]: the sign flipped; a NaN passes through unchanged
/// (the ISA leaves the NaN of `neg` unspecified).
pub(crate) fn fneg(ty: FloatTy, a: u64, ftz: bool) -> u64 {
    let f = Fmt::of(ty);
    let a = prep(f, a, ftz && ftz_applies(ty));
    if f.is_nan(a) {
        a
    } else {
        a ^ f.sign()
    }
}

/// See [`super::fcopysign`].
pub(crate) fn fcopysign(ty: FloatTy, a: u64, b: u64) -> u64 {
    let f = Fmt::of(ty);
    (b & f.abs_mask()) | (a & f.sign())
}

/// See [`super::fcmp`]: ordered comparisons are false with a NaN input,
/// the unordered ones (`…u`) true; `num`/`nan` test for NaN; ±0 are equal.
pub(crate) fn fcmp(ty: FloatTy, op: CmpOp, a: u64, b: u64, ftz: bool) -> bool {
    let f = Fmt::of(ty);
    let ftz = ftz && ftz_applies(ty);
    let (a, b) = (prep(f, a, ftz), prep(f, b, ftz));
    let unordered = f.is_nan(a) || f.is_nan(b);
    // Zeros compare equal whatever their signs.
    let key = |x: u64| {
        if f.is_zero(x) {
            0
        } else {
            order_key(f, x)
        }
    };
    let (ka, kb) = (key(a), key(b));
    let ord = |r: bool| !unordered && r;
    let unord = |r: bool| unordered || r;
    match op {
        CmpOp::Eq => ord(ka == kb),
        CmpOp::Ne => ord(ka != kb),
        CmpOp::Lt => ord(ka < kb),
        CmpOp::Le => ord(ka <= kb),
        CmpOp::Gt => ord(ka > kb),
        CmpOp::Ge => ord(ka >= kb),
        CmpOp::Equ => unord(ka == kb),
        CmpOp::Neu => unord(ka != kb),
        CmpOp::Ltu => unord(ka < kb),
        CmpOp::Leu => unord(ka <= kb),
        CmpOp::Gtu => unord(ka > kb),
        CmpOp::Geu => unord(ka >= kb),
        CmpOp::Num => !unordered,
        CmpOp::Nan => unordered,
    }
}
