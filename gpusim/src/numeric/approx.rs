//! The approximate instructions: computed in f64 with the host's libm and
//! rounded once to nearest into the type (ex2.f32: the host's exp2f), so
//! every result is within about half an ulp of the true value — inside each documented bound (ex2:
//! 2 ulp; lg2: 2^-22 absolute in (0.5, 2), 2^-22 relative elsewhere;
//! sin/cos: 2^-20.5 absolute on [-2π, 2π]; rsqrt: 2^-22.9 relative;
//! tanh: 2^-11 relative; rcp/sqrt/div.approx: 1–2 ulp) — with the
//! special values of the ISA's tables, which libm already gives (ex2(−∞) =
//! +0, lg2(±0) = −∞, rsqrt(−0) = −∞, sin(±∞) = NaN, tanh(±∞) = ±1, …).
//!
//! `rcp.approx.ftz.f64` and `rsqrt.approx.ftz.f64` follow their ISA
//! definition: only the upper 32 bits of the input (1.11.20) are used, the
//! result is rounded to 20 fraction bits with the lower 32 bits zero,
//! subnormal inputs and results are flushed, and NaN gives
//! `0x7fffffff00000000`.

use super::arith::{finish, ftz_applies, prep, widen};
use super::format::{from_f64, Fmt, F32, F64};
use super::{ApproxOp, FloatTy, Rnd};

/// See [`super::approx`].
pub(crate) fn approx(op: ApproxOp, ty: FloatTy, a: u64, ftz: bool) -> u64 {
    let f = Fmt::of(ty);
    if ty == FloatTy::F64 && ftz && op == ApproxOp::Rsqrt {
        return upper_word_f64(a, |t| 1.0 / t.sqrt());
    }
    // tanh.approx.f32 has no .ftz (its subnormals pass through); the
    // bf16 forms of ex2/tanh flush (`ex2.approx.ftz.bf16`).
    let ftz = ftz && (ftz_applies(ty) || ty == FloatTy::Bf16);
    let x = prep(f, a, ftz);
    if f.is_nan(x) {
        return f.pass_nan(x);
    }
    if ty == FloatTy::F32 && op == ApproxOp::Ex2 {
        // The hot one (every expf): the host's exp2f is within about half
        // an ulp (glibc documents 0.502), inside the ISA's 2 ulp.
        let y = f32::from_bits(x as u32).exp2();
        return finish(f, y.to_bits() as u64, ftz, false);
    }
    let v = widen(f, x);
    let y = match op {
        ApproxOp::Ex2 => v.exp2(),
        ApproxOp::Lg2 => v.log2(),
        ApproxOp::Sin => v.sin(),
        ApproxOp::Cos => v.cos(),
        ApproxOp::Rsqrt => 1.0 / v.sqrt(),
        ApproxOp::Tanh => v.tanh(),
    };
    if y.is_nan() {
        return f.canonical_nan();
    }
    finish(f, from_f64(f, y, Rnd::Rn), ftz, false)
}

/// `rcp.approx.ftz.f64` (see the module's note).
pub(crate) fn rcp_approx_f64(a: u64) -> u64 {
    upper_word_f64(a, |t| 1.0 / t)
}

/// An operation of the `.approx.ftz.f64` kind on the upper word of `a`.
fn upper_word_f64(a: u64, op: impl Fn(f64) -> f64) -> u64 {
    const CANON: u64 = 0x7fff_ffff_0000_0000;
    let hi = a & 0xffff_ffff_0000_0000;
    if F64.is_nan(hi) {
        return CANON;
    }
    let t = f64::from_bits(F64.flush(hi));
    let r = op(t);
    if r.is_nan() {
        return CANON;
    }
    // Round to 20 fraction bits (half away from zero on the magnitude; a
    // carry runs into the exponent), then flush a subnormal result.
    let rb = r.to_bits();
    let rounded = if r.is_infinite() {
        rb
    } else {
        (rb + 0x8000_0000) & 0xffff_ffff_0000_0000
    };
    F64.flush(rounded)
}

/// `div.approx{.ftz}.f32`: d = a · (1/b); for 2^126 < |b| < 2^128 the
/// reciprocal underflows, so the result is a signed zero, or NaN when a is
/// infinite (ISA). Elsewhere the exactly rounded quotient (≤ 2 ulp).
pub(crate) fn div_approx_f32(a: u64, b: u64, ftz: bool) -> u64 {
    let f = F32;
    let (a, b) = (prep(f, a, ftz), prep(f, b, ftz));
    let babs = b & f.abs_mask();
    if babs > 0x7e80_0000 && babs < f.inf() {
        if f.is_nan(a) || f.is_inf(a) {
            return f.canonical_nan();
        }
        return (a ^ b) & f.sign();
    }
    finish(
        f,
        super::arith::binary(FloatTy::F32, super::arith::Op::Div, a, b, Rnd::Rn),
        ftz,
        false,
    )
}
