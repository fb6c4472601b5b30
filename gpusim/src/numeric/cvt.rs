//! `cvt` between every pair of integer and floating-point types.
//!
//! PTX rules followed (ISA 9.7.9.21, "cvt"):
//! - float → int rounds as `.rni/.rzi/.rmi/.rpi` say and always clamps to
//!   the destination's range (`.sat` is redundant there); a NaN gives 0,
//!   except from an `.f64` source or into a 64-bit integer, where it gives
//!   `1 << (width − 1)`.
//! - int → int truncates or extends (sign-extending a signed source);
//!   `.sat` clamps to the destination's range.
//! - `.ftz` flushes f32 subnormal inputs and f32 subnormal results only.
//! - `.sat` on a float destination clamps to [0.0, 1.0], NaN to +0.0;
//!   `.relu` clamps negatives to +0 and turns NaN into the canonical NaN.
//! - NaN into f16/bf16/f32 becomes the canonical NaN (`0x7FFF`,
//!   `0x7FFFFFFF`: what CUDA's own host emulations of `cvt.rn.f16.f32`,
//!   `cvt.rn.bf16.f32` and `cvt.f32.f16` return); NaN into f64 keeps its
//!   sign and payload and is made quiet, as double-precision instructions
//!   do.

use super::arith::{saturate, widen};
use super::format::{
    convert_finite, f16_to_f32_bits, f32_to_bf16, f32_to_f16_rn, round_pack, shift_round, Fmt,
    CANON32, F32, F64,
};
use super::{CvtMode, CvtTy, FloatTy, IntTy, Rnd};

impl FloatTy {
    /// Width in bits.
    #[inline]
    pub const fn bits(self) -> u32 {
        match self {
            FloatTy::F16 | FloatTy::Bf16 => 16,
            FloatTy::F32 => 32,
            FloatTy::F64 => 64,
        }
    }
}

impl IntTy {
    /// Width in bits.
    #[inline]
    pub const fn bits(self) -> u32 {
        match self {
            IntTy::U8 | IntTy::S8 => 8,
            IntTy::U16 | IntTy::S16 => 16,
            IntTy::U32 | IntTy::S32 => 32,
            IntTy::U64 | IntTy::S64 => 64,
        }
    }

    /// Whether the type is signed.
    #[inline]
    pub const fn signed(self) -> bool {
        matches!(self, IntTy::S8 | IntTy::S16 | IntTy::S32 | IntTy::S64)
    }

    /// The smallest value.
    #[inline]
    pub const fn min(self) -> i128 {
        if self.signed() {
            -(1i128 << (self.bits() - 1))
        } else {
            0
        }
    }

    /// The largest value.
    #[inline]
    pub const fn max(self) -> i128 {
        if self.signed() {
            (1i128 << (self.bits() - 1)) - 1
        } else {
            (1i128 << self.bits()) - 1
        }
    }

    /// The value held in the low bits of `x` (sign-extended when signed;
    /// wider bits ignored, as PTX uses the low bits of a wider register).
    #[inline]
    pub const fn value(self, x: u64) -> i128 {
        let sh = 64 - self.bits();
        if self.signed() {
            (((x << sh) as i64) >> sh) as i128
        } else {
            ((x << sh) >> sh) as i128
        }
    }

    /// `v` truncated to the type's width, zero-extended to 64 bits.
    #[inline]
    pub const fn encode(self, v: i128) -> u64 {
        (v as u64) & (u64::MAX >> (64 - self.bits()))
    }
}

/// See [`super::cvt`]. A small dispatcher: the hot forms (`cvt.u32.u64`,
/// the f32 ↔ f64/f16/bf16 conversions without modifiers) take short paths
/// before the general ones.
#[inline]
pub(crate) fn cvt(dst: CvtTy, src: CvtTy, mode: CvtMode, bits: u64) -> u64 {
    match (dst, src) {
        (CvtTy::Int(d), CvtTy::Int(s)) => {
            if mode.sat {
                d.encode(s.value(bits).clamp(d.min(), d.max()))
            } else {
                // Extend from the source width, truncate to the destination's.
                let sh = 64 - s.bits();
                let v = if s.signed() {
                    ((bits << sh) as i64 >> sh) as u64
                } else {
                    (bits << sh) >> sh
                };
                v & (u64::MAX >> (64 - d.bits()))
            }
        }
        (CvtTy::Float(d), CvtTy::Float(s)) => {
            let plain = !(mode.integral || mode.ftz || mode.sat || mode.relu);
            match (plain, d, s) {
                (true, FloatTy::F64, FloatTy::F32) => f32_to_f64(bits as u32),
                (true, FloatTy::F32, FloatTy::F16) => f16_to_f32_bits(bits as u16) as u64,
                (true, FloatTy::F32, FloatTy::Bf16) => bf16_to_f32_bits(bits as u16) as u64,
                (true, FloatTy::Bf16, FloatTy::F32) => {
                    f32_to_bf16(bits as u32, mode.rnd.unwrap_or(Rnd::Rn)) as u64
                }
                (true, FloatTy::F16, FloatTy::F32) if mode.rnd.unwrap_or(Rnd::Rn) == Rnd::Rn => {
                    f32_to_f16_rn(bits as u32) as u64
                }
                (true, FloatTy::F32, FloatTy::F64) if mode.rnd.unwrap_or(Rnd::Rn) == Rnd::Rn => {
                    f64_to_f32_rn(bits)
                }
                // `cvt{.ftz}.sat.f32.f32` and the like: a move with clamps.
                (false, _, _) if d == s && !mode.integral && !mode.relu => {
                    let f = Fmt::of(d);
                    let x = bits & f.mask();
                    let x = if mode.ftz && d == FloatTy::F32 {
                        f.flush(x)
                    } else {
                        x
                    };
                    if mode.sat {
                        saturate(f, x)
                    } else {
                        x
                    }
                }
                _ => float_to_float(d, s, mode, bits),
            }
        }
        (CvtTy::Int(d), CvtTy::Float(s)) => float_to_int(d, s, mode, bits),
        (CvtTy::Float(d), CvtTy::Int(s)) => {
            let r = int_to_float(d, s.value(bits), s.signed(), mode.rnd.unwrap_or(Rnd::Rn));
            post(Fmt::of(d), r, mode)
        }
    }
}

/// f32 → f64, exact; a NaN keeps its sign and payload and is made quiet.
#[inline]
fn f32_to_f64(x: u32) -> u64 {
    let v = f32::from_bits(x);
    if v.is_nan() {
        return convert_nan(F64, F32, x as u64);
    }
    (v as f64).to_bits()
}

/// bfloat16 → f32, exact; a NaN becomes the canonical NaN.
#[inline]
fn bf16_to_f32_bits(h: u16) -> u32 {
    if h & 0x7fff > 0x7f80 {
        CANON32
    } else {
        (h as u32) << 16
    }
}

/// f64 → f32 to nearest (the host's cast); a NaN becomes the canonical NaN.
#[inline]
fn f64_to_f32_rn(x: u64) -> u64 {
    let v = f64::from_bits(x);
    if v.is_nan() {
        CANON32 as u64
    } else {
        (v as f32).to_bits() as u64
    }
}

/// `.relu` and `.sat` on a float result.
#[inline]
fn post(f: Fmt, r: u64, mode: CvtMode) -> u64 {
    let r = if mode.relu {
        if f.is_nan(r) {
            f.canonical_nan()
        } else if f.is_neg(r) {
            0
        } else {
            r
        }
    } else {
        r
    };
    if mode.sat {
        saturate(f, r)
    } else {
        r
    }
}

/// An integer value rounded into a float type.
#[inline]
fn int_to_float(d: FloatTy, v: i128, signed: bool, rnd: Rnd) -> u64 {
    match (d, rnd) {
        // The host's int → float casts round to nearest, ties to even.
        (FloatTy::F64, Rnd::Rn) => if signed {
            v as i64 as f64
        } else {
            v as u64 as f64
        }
        .to_bits(),
        (FloatTy::F32, Rnd::Rn) => if signed {
            v as i64 as f32
        } else {
            v as u64 as f32
        }
        .to_bits() as u64,
        _ => round_pack(Fmt::of(d), v < 0, v.unsigned_abs(), 0, false, rnd),
    }
}

/// float → int: integer rounding, then clamped to the destination range.
fn float_to_int(d: IntTy, s: FloatTy, mode: CvtMode, bits: u64) -> u64 {
    let f = Fmt::of(s);
    let mut x = bits & f.mask();
    if mode.ftz && s == FloatTy::F32 {
        x = f.flush(x);
    }
    if f.is_nan(x) {
        return if s == FloatTy::F64 || d.bits() == 64 {
            1 << (d.bits() - 1)
        } else {
            0
        };
    }
    // Every format's value is exact in f64, and the host's integral
    // roundings and saturating casts are exact.
    let v = widen(f, x);
    let r = match mode.rnd.unwrap_or(Rnd::Rz) {
        Rnd::Rn => v.round_ties_even(),
        // The casts below truncate towards zero themselves.
        Rnd::Rz => v,
        Rnd::Rm => v.floor(),
        Rnd::Rp => v.ceil(),
    };
    let i = if d.signed() {
        (r as i64 as i128).clamp(d.min(), d.max())
    } else {
        (r as u64 as i128).min(d.max())
    };
    d.encode(i)
}

/// A NaN of format `from` as a NaN of format `to`: into f64 the sign and
/// payload are kept (made quiet); into the narrower formats the canonical
/// NaN.
#[inline]
fn convert_nan(to: Fmt, from: Fmt, x: u64) -> u64 {
    if to == F64 {
        let sign = if from.is_neg(x) { F64.sign() } else { 0 };
        sign | F64.inf() | F64.quiet() | ((x & from.frac_mask()) << (F64.man - from.man))
    } else {
        to.canonical_nan()
    }
}

/// A float of format `fs` converted into `fd` in direction `rnd`.
#[inline]
fn convert(d: FloatTy, s: FloatTy, x: u64, rnd: Rnd) -> u64 {
    let (fd, fs) = (Fmt::of(d), Fmt::of(s));
    if fs.is_nan(x) {
        return convert_nan(fd, fs, x);
    }
    match (d, s, rnd) {
        (FloatTy::F64, FloatTy::F32, _) => f32_to_f64(x as u32),
        (FloatTy::F32, FloatTy::F64, Rnd::Rn) => f64_to_f32_rn(x),
        (FloatTy::F16, FloatTy::F32, Rnd::Rn) => f32_to_f16_rn(x as u32) as u64,
        (FloatTy::Bf16, FloatTy::F32, _) => f32_to_bf16(x as u32, rnd) as u64,
        (FloatTy::F32, FloatTy::F16, _) => f16_to_f32_bits(x as u16) as u64,
        (FloatTy::F32, FloatTy::Bf16, _) => x << 16,
        _ => convert_finite(fd, fs, x, rnd),
    }
}

/// `x` rounded to an integral value in its own format (`.rni` …); the
/// sign of a zero result is the input's.
fn round_integral(f: Fmt, x: u64, rnd: Rnd) -> u64 {
    if f.is_nan(x) {
        return f.pass_nan(x);
    }
    match f.bits {
        32 => {
            let v = f32::from_bits(x as u32);
            let r = match rnd {
                Rnd::Rn => v.round_ties_even(),
                Rnd::Rz => v.trunc(),
                Rnd::Rm => v.floor(),
                Rnd::Rp => v.ceil(),
            };
            r.to_bits() as u64
        }
        64 => {
            let v = f64::from_bits(x);
            let r = match rnd {
                Rnd::Rn => v.round_ties_even(),
                Rnd::Rz => v.trunc(),
                Rnd::Rm => v.floor(),
                Rnd::Rp => v.ceil(),
            };
            r.to_bits()
        }
        _ => {
            if f.is_inf(x) || f.is_zero(x) {
                return x;
            }
            let (neg, m, e) = f.unpack(x);
            if e >= 0 {
                return x;
            }
            let (q, _) = shift_round(neg, m as u128, (-e) as u32, false, rnd);
            // q ≤ 2^(man+1) is representable: exact.
            round_pack(f, neg, q, 0, false, Rnd::Rn)
        }
    }
}

/// float → float: a rounding conversion, or a rounding to integral.
fn float_to_float(d: FloatTy, s: FloatTy, mode: CvtMode, bits: u64) -> u64 {
    let (fd, fs) = (Fmt::of(d), Fmt::of(s));
    let mut x = bits & fs.mask();
    if mode.ftz && s == FloatTy::F32 {
        x = fs.flush(x);
    }
    let rnd = mode.rnd.unwrap_or(Rnd::Rn);
    let r = if mode.integral {
        let xi = round_integral(fs, x, rnd);
        if d == s {
            xi
        } else {
            convert(d, s, xi, Rnd::Rn)
        }
    } else if d == s {
        // A move (`cvt.f32.f32`, with `.ftz`/`.sat` doing the work).
        x
    } else {
        convert(d, s, x, rnd)
    };
    let r = if mode.ftz && d == FloatTy::F32 {
        fd.flush(r)
    } else {
        r
    };
    post(fd, r, mode)
}
