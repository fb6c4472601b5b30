//! Floating-point semantics of PTX instructions, on raw bits: every
//! rounding mode, flush-to-zero, saturation, f16/bf16 conversions bit-exact
//! with IEEE 754, and the approximate instructions within the maximum
//! errors the PTX ISA documents. Pure functions, checked against host
//! references in this module's tests.
//!
//! Values travel as `u64` holding the type's bits right-aligned (an f16 in
//! the low 16 bits, an s8 sign-extended or not — see [`cvt`]).

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
    /// `.relu`: negative results (and NaN) become +0 (f16/bf16 destinations).
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
pub fn cvt(dst: CvtTy, src: CvtTy, mode: CvtMode, bits: u64) -> u64 {
    let _ = (dst, src, mode, bits);
    todo!("numeric::cvt")
}

/// `add{.rnd}{.ftz}{.sat}` on `ty`.
pub fn fadd(ty: FloatTy, a: u64, b: u64, rnd: Rnd, ftz: bool, sat: bool) -> u64 {
    let _ = (ty, a, b, rnd, ftz, sat);
    todo!("numeric::fadd")
}

/// `sub{.rnd}{.ftz}{.sat}` on `ty`.
pub fn fsub(ty: FloatTy, a: u64, b: u64, rnd: Rnd, ftz: bool, sat: bool) -> u64 {
    let _ = (ty, a, b, rnd, ftz, sat);
    todo!("numeric::fsub")
}

/// `mul{.rnd}{.ftz}{.sat}` on `ty`.
pub fn fmul(ty: FloatTy, a: u64, b: u64, rnd: Rnd, ftz: bool, sat: bool) -> u64 {
    let _ = (ty, a, b, rnd, ftz, sat);
    todo!("numeric::fmul")
}

/// `fma.rnd{.ftz}{.sat}` (and `mad.rnd`) on `ty`: `a * b + c` rounded once.
pub fn ffma(ty: FloatTy, a: u64, b: u64, c: u64, rnd: Rnd, ftz: bool, sat: bool) -> u64 {
    let _ = (ty, a, b, c, rnd, ftz, sat);
    todo!("numeric::ffma")
}

/// `div` on `ty` (f32/f64).
pub fn fdiv(ty: FloatTy, a: u64, b: u64, prec: Precision, ftz: bool) -> u64 {
    let _ = (ty, a, b, prec, ftz);
    todo!("numeric::fdiv")
}

/// `sqrt` on `ty` (f32/f64).
pub fn fsqrt(ty: FloatTy, a: u64, prec: Precision, ftz: bool) -> u64 {
    let _ = (ty, a, prec, ftz);
    todo!("numeric::fsqrt")
}

/// `rcp` on `ty` (f32/f64); `rcp.approx.ftz.f64` included.
pub fn frcp(ty: FloatTy, a: u64, prec: Precision, ftz: bool) -> u64 {
    let _ = (ty, a, prec, ftz);
    todo!("numeric::frcp")
}

/// `min` (or `max` when `is_max`) with `.ftz` and `.NaN` (propagate) as in
/// the PTX ISA, including the signed-zero rule.
pub fn fminmax(ty: FloatTy, a: u64, b: u64, is_max: bool, ftz: bool, nan: bool) -> u64 {
    let _ = (ty, a, b, is_max, ftz, nan);
    todo!("numeric::fminmax")
}

/// `abs{.ftz}` on `ty`.
pub fn fabs(ty: FloatTy, a: u64, ftz: bool) -> u64 {
    let _ = (ty, a, ftz);
    todo!("numeric::fabs")
}

/// `neg{.ftz}` on `ty`.
pub fn fneg(ty: FloatTy, a: u64, ftz: bool) -> u64 {
    let _ = (ty, a, ftz);
    todo!("numeric::fneg")
}

/// `copysign.ty d, a, b`: `b`'s magnitude with `a`'s sign (PTX operand order).
pub fn fcopysign(ty: FloatTy, a: u64, b: u64) -> u64 {
    let _ = (ty, a, b);
    todo!("numeric::fcopysign")
}

/// An approximate instruction (`ex2.approx{.ftz}.f32`, `lg2.approx`, …),
/// within the PTX ISA's documented maximum error.
pub fn approx(op: ApproxOp, ty: FloatTy, a: u64, ftz: bool) -> u64 {
    let _ = (op, ty, a, ftz);
    todo!("numeric::approx")
}

/// A float comparison of `setp` (`.ftz` flushes subnormal f32 inputs).
pub fn fcmp(ty: FloatTy, op: CmpOp, a: u64, b: u64, ftz: bool) -> bool {
    let _ = (ty, op, a, b, ftz);
    todo!("numeric::fcmp")
}
