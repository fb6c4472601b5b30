//! Binary floating-point formats on raw bits, and the one rounding routine
//! every operation ends in: an exact value (an integer mantissa, a power
//! of two, and a sticky bit for what lies below) rounded into a format in
//! one of the four IEEE directions, with gradual underflow and overflow.

use super::{FloatTy, Rnd};

/// An IEEE-style binary format: total bits, fraction bits, exponent bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Fmt {
    /// Total width in bits.
    pub bits: u32,
    /// Fraction (stored mantissa) bits.
    pub man: u32,
    /// Exponent bits.
    pub exp: u32,
}

/// binary16.
pub(crate) const F16: Fmt = Fmt {
    bits: 16,
    man: 10,
    exp: 5,
};
/// bfloat16.
pub(crate) const BF16: Fmt = Fmt {
    bits: 16,
    man: 7,
    exp: 8,
};
/// binary32.
pub(crate) const F32: Fmt = Fmt {
    bits: 32,
    man: 23,
    exp: 8,
};
/// binary64.
pub(crate) const F64: Fmt = Fmt {
    bits: 64,
    man: 52,
    exp: 11,
};

/// The quiet NaN that single-precision and half-precision instructions
/// return (all bits but the sign set: `0x7FFF`, `0x7FFFFFFF`), and that
/// double-precision ones return when no input NaN is there to pass on.
pub(crate) const CANON32: u32 = 0x7FFF_FFFF;

impl Fmt {
    /// The format of `ty`.
    #[inline]
    pub const fn of(ty: FloatTy) -> Fmt {
        match ty {
            FloatTy::F16 => F16,
            FloatTy::Bf16 => BF16,
            FloatTy::F32 => F32,
            FloatTy::F64 => F64,
        }
    }

    /// All bits of the format.
    #[inline]
    pub const fn mask(self) -> u64 {
        u64::MAX >> (64 - self.bits)
    }

    /// The sign bit.
    #[inline]
    pub const fn sign(self) -> u64 {
        1 << (self.bits - 1)
    }

    /// Everything but the sign.
    #[inline]
    pub const fn abs_mask(self) -> u64 {
        self.sign() - 1
    }

    /// The fraction field.
    #[inline]
    pub const fn frac_mask(self) -> u64 {
        (1 << self.man) - 1
    }

    /// +infinity (the exponent field all ones).
    #[inline]
    pub const fn inf(self) -> u64 {
        self.abs_mask() & !self.frac_mask()
    }

    /// The largest finite magnitude.
    #[inline]
    pub const fn max_finite(self) -> u64 {
        self.inf() - 1
    }

    /// +1.0.
    #[inline]
    pub const fn one(self) -> u64 {
        (self.bias() as u64) << self.man
    }

    /// The canonical NaN (see [`CANON32`]).
    #[inline]
    pub const fn canonical_nan(self) -> u64 {
        self.abs_mask()
    }

    /// The quiet bit of a NaN.
    #[inline]
    pub const fn quiet(self) -> u64 {
        1 << (self.man - 1)
    }

    /// Exponent bias.
    #[inline]
    pub const fn bias(self) -> i32 {
        (1 << (self.exp - 1)) - 1
    }

    /// Exponent (unbiased) of the smallest normal binade.
    #[inline]
    pub const fn emin(self) -> i32 {
        1 - self.bias()
    }

    /// Whether `x` is a NaN.
    #[inline]
    pub const fn is_nan(self, x: u64) -> bool {
        x & self.abs_mask() > self.inf()
    }

    /// Whether `x` is ±infinity.
    #[inline]
    pub const fn is_inf(self, x: u64) -> bool {
        x & self.abs_mask() == self.inf()
    }

    /// Whether `x` is ±0.
    #[inline]
    pub const fn is_zero(self, x: u64) -> bool {
        x & self.abs_mask() == 0
    }

    /// Whether `x` is subnormal (nonzero, exponent field zero).
    #[inline]
    pub const fn is_subnormal(self, x: u64) -> bool {
        x & self.inf() == 0 && x & self.frac_mask() != 0
    }

    /// Whether the sign bit of `x` is set.
    #[inline]
    pub const fn is_neg(self, x: u64) -> bool {
        x & self.sign() != 0
    }

    /// `x` with a subnormal flushed to the zero of its sign.
    #[inline]
    pub const fn flush(self, x: u64) -> u64 {
        if self.is_subnormal(x) {
            x & self.sign()
        } else {
            x
        }
    }

    /// A finite `x` as `(negative, m, e)` with |x| = m · 2^e exactly.
    #[inline]
    pub const fn unpack(self, x: u64) -> (bool, u64, i32) {
        let neg = self.is_neg(x);
        let field = ((x >> self.man) & ((1 << self.exp) - 1)) as i32;
        let frac = x & self.frac_mask();
        if field == 0 {
            (neg, frac, self.emin() - self.man as i32)
        } else {
            (
                neg,
                frac | (1 << self.man),
                field - self.bias() - self.man as i32,
            )
        }
    }

    /// A NaN operand passed on: double precision keeps the payload (made
    /// quiet), as the PTX ISA says; the narrower formats return the
    /// canonical NaN ("single-precision instructions return an unspecified
    /// NaN").
    #[inline]
    pub const fn pass_nan(self, x: u64) -> u64 {
        if self.bits == 64 {
            x | self.quiet()
        } else {
            self.canonical_nan()
        }
    }

    /// The NaN an operation returns: the first NaN among `ops` passed on,
    /// or the canonical NaN for an invalid operation (∞−∞, 0·∞, …).
    #[inline]
    pub fn nan_of(self, ops: &[u64]) -> u64 {
        for &x in ops {
            if self.is_nan(x) {
                return self.pass_nan(x);
            }
        }
        self.canonical_nan()
    }

    /// The result of overflowing the largest finite value, by direction.
    #[inline]
    pub const fn overflow(self, neg: bool, rnd: Rnd) -> u64 {
        let to_inf = match rnd {
            Rnd::Rn => true,
            Rnd::Rz => false,
            Rnd::Rm => neg,
            Rnd::Rp => !neg,
        };
        let sign = if neg { self.sign() } else { 0 };
        sign | if to_inf {
            self.inf()
        } else {
            self.max_finite()
        }
    }
}

/// Number of significant bits of `m`.
#[inline]
pub(crate) const fn bit_len(m: u128) -> i32 {
    128 - m.leading_zeros() as i32
}

/// `m` shifted right by `s` ≥ 1 bits and rounded in direction `rnd` (of a
/// value whose sign is `neg`). `sticky` says the exact value is strictly
/// above `m` but below `m + 1` (in units of `m`'s last bit). Returns the
/// rounded quotient and whether it is inexact.
#[inline]
pub(crate) fn shift_round(neg: bool, m: u128, s: u32, sticky: bool, rnd: Rnd) -> (u128, bool) {
    let (q, above, tie, inexact) = if s as i32 > bit_len(m) {
        // Everything is shifted out and m < 2^(s-1): below one half.
        (0, false, false, m != 0 || sticky)
    } else {
        let q = m.checked_shr(s).unwrap_or(0);
        let r = m & (u128::MAX >> (128 - s));
        let half = 1u128 << (s - 1);
        (
            q,
            r > half || (r == half && sticky),
            r == half && !sticky,
            r != 0 || sticky,
        )
    };
    let up = match rnd {
        Rnd::Rn => above || (tie && q & 1 == 1),
        Rnd::Rz => false,
        Rnd::Rm => neg && inexact,
        Rnd::Rp => !neg && inexact,
    };
    (q + up as u128, inexact)
}

/// Rounds the exact value ±(m + sticky) · 2^e into `f` in direction `rnd`.
///
/// `sticky` means the true magnitude lies strictly between m·2^e and
/// (m+1)·2^e; it may only be set when m has at least one bit below the
/// result's last place (callers keep dozens), which makes the rounding
/// exact. Subnormal results round on the subnormal grid; overflow follows
/// the direction (infinity, or the largest finite value).
pub(crate) fn round_pack(f: Fmt, neg: bool, m: u128, e: i32, sticky: bool, rnd: Rnd) -> u64 {
    let sign = if neg { f.sign() } else { 0 };
    if m == 0 && !sticky {
        return sign;
    }
    let man = f.man as i32;
    // Exponent of the result's last place: from the binade of m's leading
    // bit, or the subnormal grid's when the value is below the normals.
    let top = e + bit_len(m) - 1;
    let mut lsb = top.max(f.emin()) - man;
    let s = lsb - e;
    let mut q = if s <= 0 {
        debug_assert!(!sticky, "sticky bits at or above the last place");
        // Exact: m has no bits below the last place; q < 2^(man+1).
        m << (-s) as u32
    } else {
        shift_round(neg, m, s as u32, sticky, rnd).0
    };
    if q >> (man + 1) != 0 {
        // Rounding carried into the next binade.
        q >>= 1;
        lsb += 1;
    }
    if q == 0 {
        return sign;
    }
    if q >> man == 0 {
        // Subnormal (lsb is the subnormal grid's).
        return sign | q as u64;
    }
    let field = lsb + man + f.bias();
    if field >= (1 << f.exp) - 1 {
        return f.overflow(neg, rnd);
    }
    sign | ((field as u64) << f.man) | (q as u64 & f.frac_mask())
}

/// [`round_pack`] for an exact value with a mantissa of at most 64 bits
/// and no sticky bit (conversions, and the f64 round-to-odd results of the
/// narrow arithmetic): the same steps in 64-bit arithmetic, which keeps the
/// per-lane conversions cheap.
#[inline(always)]
pub(crate) fn round_pack64(f: Fmt, neg: bool, m: u64, e: i32, rnd: Rnd) -> u64 {
    let sign = if neg { f.sign() } else { 0 };
    if m == 0 {
        return sign;
    }
    let man = f.man as i32;
    let top = e + 63 - m.leading_zeros() as i32;
    let mut lsb = top.max(f.emin()) - man;
    let s = lsb - e;
    let mut q = if s <= 0 {
        m << (-s) as u32
    } else if s > 64 {
        // Below half the last place: zero or the smallest subnormal.
        match rnd {
            Rnd::Rm if neg => 1,
            Rnd::Rp if !neg => 1,
            _ => 0,
        }
    } else {
        let s = s as u32;
        let q = m.checked_shr(s).unwrap_or(0);
        let r = m & (u64::MAX >> (64 - s));
        let half = 1u64 << (s - 1);
        let up = match rnd {
            Rnd::Rn => r > half || (r == half && q & 1 == 1),
            Rnd::Rz => false,
            Rnd::Rm => neg && r != 0,
            Rnd::Rp => !neg && r != 0,
        };
        q + up as u64
    };
    if q >> (man + 1) != 0 {
        q >>= 1;
        lsb += 1;
    }
    if q == 0 {
        return sign;
    }
    if q >> man == 0 {
        return sign | q;
    }
    let field = lsb + man + f.bias();
    if field >= (1 << f.exp) - 1 {
        return f.overflow(neg, rnd);
    }
    sign | ((field as u64) << f.man) | (q & f.frac_mask())
}

/// Converts a finite or infinite `x` of format `from` into `to`, rounding
/// in direction `rnd` (exact when `to` is wider). NaNs are the caller's.
#[inline(always)]
pub(crate) fn convert_finite(to: Fmt, from: Fmt, x: u64, rnd: Rnd) -> u64 {
    let neg = from.is_neg(x);
    let sign = if neg { to.sign() } else { 0 };
    if from.is_inf(x) {
        return sign | to.inf();
    }
    let (neg, m, e) = from.unpack(x);
    round_pack64(to, neg, m, e, rnd)
}

/// `x` (a finite f64 value) rounded into `f`: `round_pack` of its exact
/// mantissa and exponent.
#[inline(always)]
pub(crate) fn from_f64(f: Fmt, x: f64, rnd: Rnd) -> u64 {
    convert_finite(f, F64, x.to_bits(), rnd)
}

/// binary16 bits to binary32 bits, exactly; a NaN becomes the canonical
/// `0x7FFFFFFF` (as CUDA's own `__half2float` emulation does).
#[inline]
pub(crate) fn f16_to_f32_bits(h: u16) -> u32 {
    let sign = ((h & 0x8000) as u32) << 16;
    let field = ((h >> 10) & 0x1f) as u32;
    let frac = (h & 0x3ff) as u32;
    match field {
        0x1f => {
            if frac != 0 {
                CANON32
            } else {
                sign | 0x7f80_0000
            }
        }
        0 => {
            if frac == 0 {
                return sign;
            }
            // Normalize: shift the leading bit up to the implicit position.
            let s = frac.leading_zeros() - 21;
            sign | ((113 - s) << 23) | (((frac << s) & 0x3ff) << 13)
        }
        _ => sign | ((field + 112) << 23) | (frac << 13),
    }
}

/// binary32 bits to binary16 bits, rounded to nearest even; a NaN becomes
/// the canonical `0x7FFF` (CUDA's `__float2half_rn` emulation).
#[inline]
pub(crate) fn f32_to_f16_rn(x: u32) -> u16 {
    let sign = ((x >> 16) & 0x8000) as u16;
    let a = x & 0x7fff_ffff;
    if a > 0x7f80_0000 {
        return 0x7fff;
    }
    if a >= 0x477f_f000 {
        // ≥ 65520 (the largest finite half plus half an ulp), or infinity.
        return sign | 0x7c00;
    }
    if a >= 0x3880_0000 {
        // Normal half: re-bias the exponent, round away 13 bits.
        let r = a - 0x3800_0000;
        let r = r + 0xfff + ((r >> 13) & 1);
        return sign | (r >> 13) as u16;
    }
    if a <= 0x3300_0000 {
        // ≤ 2^-25: half the smallest subnormal or less rounds to zero.
        return sign;
    }
    let mant = (a & 0x7f_ffff) | 0x80_0000;
    let shift = 126 - (a >> 23);
    let q = mant >> shift;
    let rem = mant & ((1 << shift) - 1);
    let half = 1 << (shift - 1);
    let up = rem > half || (rem == half && q & 1 == 1);
    sign | (q + up as u32) as u16
}

/// binary32 bits to bfloat16 bits in direction `rnd`: bfloat16 is binary32
/// with 16 fraction bits fewer, so rounding is an integer add on the bits
/// (carries run into the exponent and on to infinity exactly as IEEE
/// rounding does). A NaN becomes the canonical `0x7FFF`.
#[inline]
pub(crate) fn f32_to_bf16(x: u32, rnd: Rnd) -> u16 {
    if x & 0x7fff_ffff > 0x7f80_0000 {
        return 0x7fff;
    }
    let neg = x >> 31 != 0;
    let low = x & 0xffff;
    let up = match rnd {
        Rnd::Rn => 0x7fff + ((x >> 16) & 1),
        Rnd::Rz => 0,
        Rnd::Rm => {
            if neg && low != 0 {
                0x1_0000
            } else {
                0
            }
        }
        Rnd::Rp => {
            if !neg && low != 0 {
                0x1_0000
            } else {
                0
            }
        }
    };
    // An infinity has low == 0, so it never carries.
    ((x + up) >> 16) as u16
}
