//! Floating-point semantics of PTX instructions, on raw bits: every
//! rounding mode, flush-to-zero, saturation, f16/bf16 conversions bit-exact
//! with IEEE 754, and the approximate instructions within the maximum
//! errors the PTX ISA documents. Pure functions, checked against exact
//! big-integer references in `gpusim/tests/numeric_*.rs`.
//!
//! Values travel as `u64` holding the type's bits right-aligned (an f16 in
//! the low 16 bits). Inputs use only the type's low bits (as PTX does with
//! a wider register); results are zero-extended — a signed integer result
//! of [`cvt`] too, the interpreter sign-extends into a wider register.
//!
//! Choices where the ISA leaves room (each matches what CUDA's own headers
//! or the ISA's neighbouring text say):
//! - NaN results of f16/bf16/f32 operations and conversions are the
//!   canonical NaN (all bits but the sign: `0x7FFF`, `0x7FFFFFFF`), which
//!   CUDA's host emulations of `cvt.rn.f16.f32`, `cvt.rn.bf16.f32` and
//!   `cvt.f32.f16` return; f64 operations pass on the first NaN operand
//!   (a, then b, then c) made quiet — "NaN payloads are supported for
//!   double-precision instructions" — and return `0x7FFFFFFFFFFFFFFF` for
//!   an invalid operation (∞ − ∞, 0 · ∞, √−1); a NaN converted to f64 keeps
//!   its sign and payload, made quiet.
//! - `.ftz` applies to f32 (and to f16, whose PTX forms take it): subnormal
//!   inputs, and results subnormal *after* rounding, become the zero of
//!   their sign.
//! - `.sat` clamps to [+0.0, 1.0]: NaN and every negative value, −0.0
//!   included, give +0.0.
//! - `abs`/`neg` pass a NaN through unchanged (the ISA: "for abs.f64, NaN
//!   input is passed through unchanged"; unspecified otherwise).

mod approx;
mod arith;
mod cvt;
mod format;
mod misc;

use arith::{finish, ftz_applies, prep, Op};
use format::Fmt;

/// Rounding of a floating-point result (`.rn`, `.rz`, `.rm`, `.rp`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Rnd {
    /// To nearest, ties to even.
    Rn,
    /// Towards zero.
    Rz,
    /// Towards minus infinity.
    Rm,
    /// Towards plus infinity.
    Rp,
}

/// A floating-point type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FloatTy {
    /// IEEE binary16.
    F16,
    /// bfloat16.
    Bf16,
    /// IEEE binary32.
    F32,
    /// IEEE binary64.
    F64,
}

/// An integer type of `cvt`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IntTy {
    /// Unsigned, 8 bits.
    U8,
    /// Unsigned, 16 bits.
    U16,
    /// Unsigned, 32 bits.
    U32,
    /// Unsigned, 64 bits.
    U64,
    /// Signed, 8 bits.
    S8,
    /// Signed, 16 bits.
    S16,
    /// Signed, 32 bits.
    S32,
    /// Signed, 64 bits.
    S64,
}

/// A `cvt` operand type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CvtTy {
    /// An integer type.
    Int(IntTy),
    /// A floating-point type.
    Float(FloatTy),
}

/// The modifiers of one `cvt`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CvtMode {
    /// `.rn/.rz/.rm/.rp` (a float result rounded) or, with `integral`,
    /// `.rni/.rzi/.rmi/.rpi` (rounded to an integral value).
    pub rnd: Option<Rnd>,
    /// The rounding is an integer rounding (`.rni` …).
    pub integral: bool,
    /// `.sat`: clamp to the destination's range (floats: to [0, 1], NaN → 0).
    pub sat: bool,
    /// `.ftz`: subnormal f32 inputs and results flushed to sign-preserving zero.
    pub ftz: bool,
    /// `.relu`: negative results (−0 included) become +0 and a NaN becomes
    /// the canonical NaN, as the ISA says (f16/bf16 destinations).
    pub relu: bool,
}

/// The kind of a division, square root or reciprocal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Precision {
    /// IEEE, rounded as given.
    Ieee(Rnd),
    /// `.full` (div.full.f32: max 2 ulp).
    Full,
    /// `.approx`.
    Approx,
}

/// A comparison of `setp`/`set`/`slct` on floats (and the unordered forms).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    Equ,
    Neu,
    Ltu,
    Leu,
    Gtu,
    Geu,
    Num,
    Nan,
}

/// An approximate transcendental instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum ApproxOp {
    Ex2,
    Lg2,
    Sin,
    Cos,
    Rsqrt,
    Tanh,
}

/// `cvt` from `src` to `dst` with `mode`. The result's bits right-aligned,
/// zero-extended to 64 bits.
#[inline]
pub fn cvt(dst: CvtTy, src: CvtTy, mode: CvtMode, bits: u64) -> u64 {
    cvt::cvt(dst, src, mode, bits)
}

/// `add{.rnd}{.ftz}{.sat}` on `ty`.
#[inline]
pub fn fadd(ty: FloatTy, a: u64, b: u64, rnd: Rnd, ftz: bool, sat: bool) -> u64 {
    binary(ty, Op::Add, a, b, rnd, ftz, sat)
}

/// `sub{.rnd}{.ftz}{.sat}` on `ty`.
#[inline]
pub fn fsub(ty: FloatTy, a: u64, b: u64, rnd: Rnd, ftz: bool, sat: bool) -> u64 {
    // a − b is a + (−b) exactly; a NaN b is passed on as it is.
    let f = Fmt::of(ty);
    let b = b & f.mask();
    let nb = if f.is_nan(b) { b } else { b ^ f.sign() };
    binary(ty, Op::Add, a, nb, rnd, ftz, sat)
}

/// `mul{.rnd}{.ftz}{.sat}` on `ty`.
#[inline]
pub fn fmul(ty: FloatTy, a: u64, b: u64, rnd: Rnd, ftz: bool, sat: bool) -> u64 {
    binary(ty, Op::Mul, a, b, rnd, ftz, sat)
}

/// A two-operand operation with its modifiers.
#[inline]
fn binary(ty: FloatTy, op: Op, a: u64, b: u64, rnd: Rnd, ftz: bool, sat: bool) -> u64 {
    let f = Fmt::of(ty);
    let ftz = ftz && ftz_applies(ty);
    let (a, b) = (prep(f, a, ftz), prep(f, b, ftz));
    finish(f, arith::binary(ty, op, a, b, rnd), ftz, sat)
}

/// `fma.rnd{.ftz}{.sat}` (and `mad.rnd`) on `ty`: `a * b + c` rounded once.
#[inline]
pub fn ffma(ty: FloatTy, a: u64, b: u64, c: u64, rnd: Rnd, ftz: bool, sat: bool) -> u64 {
    let f = Fmt::of(ty);
    let ftz = ftz && ftz_applies(ty);
    let (a, b, c) = (prep(f, a, ftz), prep(f, b, ftz), prep(f, c, ftz));
    finish(f, arith::fma(ty, a, b, c, rnd), ftz, sat)
}

/// The rounding of an IEEE precision; `.full` and `.approx` (outside the
/// forms with their own definitions) are exactly rounded to nearest, which
/// is within their 1–2 ulp bounds.
#[inline]
fn rnd_of(prec: Precision) -> Rnd {
    match prec {
        Precision::Ieee(r) => r,
        Precision::Full | Precision::Approx => Rnd::Rn,
    }
}

/// `div` on `ty` (f32/f64).
#[inline]
pub fn fdiv(ty: FloatTy, a: u64, b: u64, prec: Precision, ftz: bool) -> u64 {
    let ftz = ftz && ftz_applies(ty);
    if prec == Precision::Approx && ty == FloatTy::F32 {
        return approx::div_approx_f32(a, b, ftz);
    }
    binary(ty, Op::Div, a, b, rnd_of(prec), ftz, false)
}

/// `sqrt` on `ty` (f32/f64).
#[inline]
pub fn fsqrt(ty: FloatTy, a: u64, prec: Precision, ftz: bool) -> u64 {
    let f = Fmt::of(ty);
    let ftz = ftz && ftz_applies(ty);
    let a = prep(f, a, ftz);
    finish(f, arith::sqrt(ty, a, rnd_of(prec)), ftz, false)
}

/// `rcp` on `ty` (f32/f64); `rcp.approx.ftz.f64` included.
#[inline]
pub fn frcp(ty: FloatTy, a: u64, prec: Precision, ftz: bool) -> u64 {
    if prec == Precision::Approx && ty == FloatTy::F64 {
        // The only f64 approximate reciprocal is `rcp.approx.ftz.f64`.
        return approx::rcp_approx_f64(a);
    }
    binary(ty, Op::Div, Fmt::of(ty).one(), a, rnd_of(prec), ftz, false)
}

/// `min` (or `max` when `is_max`) with `.ftz` and `.NaN` (propagate) as in
/// the PTX ISA, including the signed-zero rule.
#[inline]
pub fn fminmax(ty: FloatTy, a: u64, b: u64, is_max: bool, ftz: bool, nan: bool) -> u64 {
    misc::fminmax(ty, a, b, is_max, ftz, nan)
}

/// `abs{.ftz}` on `ty`.
#[inline]
pub fn fabs(ty: FloatTy, a: u64, ftz: bool) -> u64 {
    misc::fabs(ty, a, ftz)
}

/// `neg{.ftz}` on `ty`.
#[inline]
pub fn fneg(ty: FloatTy, a: u64, ftz: bool) -> u64 {
    misc::fneg(ty, a, ftz)
}

/// `copysign.ty d, a, b`: `b`'s magnitude with `a`'s sign (PTX operand order).
#[inline]
pub fn fcopysign(ty: FloatTy, a: u64, b: u64) -> u64 {
    misc::fcopysign(ty, a, b)
}

/// An approximate instruction (`ex2.approx{.ftz}.f32`, `lg2.approx`, …),
/// within the PTX ISA's documented maximum error.
#[inline]
pub fn approx(op: ApproxOp, ty: FloatTy, a: u64, ftz: bool) -> u64 {
    approx::approx(op, ty, a, ftz)
}

/// A float comparison of `setp` (`.ftz` flushes subnormal f32 inputs).
#[inline]
pub fn fcmp(ty: FloatTy, op: CmpOp, a: u64, b: u64, ftz: bool) -> bool {
    misc::fcmp(ty, op, a, b, ftz)
}
