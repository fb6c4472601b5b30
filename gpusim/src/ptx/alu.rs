//! Lane-wise arithmetic, monomorphized per operation and type: the decoder
//! picks one function pointer per instruction, and the executor makes one
//! indirect call per warp-instruction whose body loops over the 32 lanes
//! (vectorizable when all lanes are active).
//!
//! Register values are canonical: the bits of the instruction type,
//! zero-extended to 64. Sources are truncated to the type on read.
//!
//! Choices where the PTX ISA leaves a result unspecified (documented here
//! because they are visible): integer division by zero gives all ones
//! (unsigned) or -1 (signed) and remainder by zero gives the dividend;
//! `MIN / -1` wraps to `MIN` with remainder 0.

use super::ir::Slot;

/// `d = f(a, b)` on the lanes of a mask.
pub(crate) type BinFn = fn(&mut [u64], u32, Slot, Slot, Slot);
/// `d = f(a, b, c)` on the lanes of a mask.
pub(crate) type TernFn = fn(&mut [u64], u32, Slot, Slot, Slot, Slot);
/// `d = f(a)` on the lanes of a mask.
pub(crate) type UnFn = fn(&mut [u64], u32, Slot, Slot);
/// A comparison of all 32 lanes, as a bit mask.
pub(crate) type CmpFn = fn(&[u64], Slot, Slot) -> u32;

/// The 32 lanes of slot `s`.
#[inline(always)]
pub(crate) fn lanes(r: &[u64], s: Slot) -> [u64; 32] {
    let mut v = [0u64; 32];
    let i = s as usize * 32;
    v.copy_from_slice(&r[i..i + 32]);
    v
}

/// All-ones in the low `w` bits.
#[inline(always)]
pub(crate) const fn mask(w: u32) -> u64 {
    if w >= 64 {
        !0
    } else {
        (1u64 << w) - 1
    }
}

/// `x`'s low `w` bits, sign-extended.
#[inline(always)]
pub(crate) const fn sext(x: u64, w: u32) -> i64 {
    if w >= 64 {
        x as i64
    } else {
        ((x << (64 - w)) as i64) >> (64 - w)
    }
}

/// A binary lane operation.
pub(crate) trait B2 {
    /// The operation on one lane.
    fn f(a: u64, b: u64) -> u64;
}
/// A ternary lane operation.
pub(crate) trait B3 {
    /// The operation on one lane.
    fn f(a: u64, b: u64, c: u64) -> u64;
}
/// A unary lane operation.
pub(crate) trait B1 {
    /// The operation on one lane.
    fn f(a: u64) -> u64;
}
/// A lane comparison.
pub(crate) trait C2 {
    /// The comparison on one lane.
    fn f(a: u64, b: u64) -> bool;
}

/// Runs a [`B2`] over the lanes of `m`.
pub(crate) fn bin<F: B2>(r: &mut [u64], m: u32, d: Slot, a: Slot, b: Slot) {
    let (av, bv) = (lanes(r, a), lanes(r, b));
    let i = d as usize * 32;
    let dv = &mut r[i..i + 32];
    if m == !0 {
        for l in 0..32 {
            dv[l] = F::f(av[l], bv[l]);
        }
    } else {
        for l in 0..32 {
            if m >> l & 1 != 0 {
                dv[l] = F::f(av[l], bv[l]);
            }
        }
    }
}

/// Runs a [`B3`] over the lanes of `m`.
pub(crate) fn tern<F: B3>(r: &mut [u64], m: u32, d: Slot, a: Slot, b: Slot, c: Slot) {
    let (av, bv, cv) = (lanes(r, a), lanes(r, b), lanes(r, c));
    let i = d as usize * 32;
    let dv = &mut r[i..i + 32];
    for l in 0..32 {
        if m >> l & 1 != 0 {
            dv[l] = F::f(av[l], bv[l], cv[l]);
        }
    }
}

/// Runs a [`B1`] over the lanes of `m`.
pub(crate) fn un<F: B1>(r: &mut [u64], m: u32, d: Slot, a: Slot) {
    let av = lanes(r, a);
    let i = d as usize * 32;
    let dv = &mut r[i..i + 32];
    if m == !0 {
        for l in 0..32 {
            dv[l] = F::f(av[l]);
        }
    } else {
        for l in 0..32 {
            if m >> l & 1 != 0 {
                dv[l] = F::f(av[l]);
            }
        }
    }
}

/// Runs a [`C2`] over all lanes (comparisons have no side effects; the
/// caller masks the result).
pub(crate) fn cmp<F: C2>(r: &[u64], a: Slot, b: Slot) -> u32 {
    let (av, bv) = (lanes(r, a), lanes(r, b));
    let mut out = 0u32;
    for l in 0..32 {
        out |= (F::f(av[l], bv[l]) as u32) << l;
    }
    out
}

macro_rules! op2 {
    ($name:ident, <$($g:ident : $gt:ty),*>, |$a:ident, $b:ident| $e:expr) => {
        pub(crate) struct $name<$(const $g: $gt),*>;
        impl<$(const $g: $gt),*> B2 for $name<$($g),*> {
            #[inline(always)]
            fn f($a: u64, $b: u64) -> u64 {
                $e
            }
        }
    };
}
macro_rules! op3 {
    ($name:ident, <$($g:ident : $gt:ty),*>, |$a:ident, $b:ident, $c:ident| $e:expr) => {
        pub(crate) struct $name<$(const $g: $gt),*>;
        impl<$(const $g: $gt),*> B3 for $name<$($g),*> {
            #[inline(always)]
            fn f($a: u64, $b: u64, $c: u64) -> u64 {
                $e
            }
        }
    };
}
macro_rules! op1 {
    ($name:ident, <$($g:ident : $gt:ty),*>, |$a:ident| $e:expr) => {
        pub(crate) struct $name<$(const $g: $gt),*>;
        impl<$(const $g: $gt),*> B1 for $name<$($g),*> {
            #[inline(always)]
            fn f($a: u64) -> u64 {
                $e
            }
        }
    };
}

/// Value of `x` as an i128 of a `w`-bit type with signedness `s`.
#[inline(always)]
const fn wide(x: u64, w: u32, s: bool) -> i128 {
    if s {
        sext(x, w) as i128
    } else {
        (x & mask(w)) as i128
    }
}

op2!(Add, <W: u32>, |a, b| a.wrapping_add(b) & mask(W));
op2!(Sub, <W: u32>, |a, b| a.wrapping_sub(b) & mask(W));
op2!(MulLo, <W: u32>, |a, b| a.wrapping_mul(b) & mask(W));
// (The i128 product of two u64 can exceed i128::MAX: wrapping keeps its low
// 128 bits, which are all that is used.)
op2!(MulHi, <W: u32, S: bool>, |a, b| (wide(a, W, S).wrapping_mul(wide(b, W, S)) >> W) as u64
    & mask(W));
op2!(MulWide, <W: u32, S: bool>, |a, b| (wide(a, W, S) * wide(b, W, S)) as u64 & mask(2 * W));
op2!(And, <W: u32>, |a, b| a & b & mask(W));
op2!(Or, <W: u32>, |a, b| (a | b) & mask(W));
op2!(Xor, <W: u32>, |a, b| (a ^ b) & mask(W));
op2!(Shl, <W: u32>, |a, b| {
    let s = b as u32;
    if s >= W { 0 } else { (a << s) & mask(W) }
});
op2!(Shr, <W: u32, S: bool>, |a, b| {
    // The shift amount is a u32; amounts >= W clamp (sign fill or 0).
    let s = b as u32;
    if S {
        (sext(a, W) >> s.min(W - 1)) as u64 & mask(W)
    } else if s >= W {
        0
    } else {
        (a & mask(W)) >> s
    }
});
op2!(Div, <W: u32, S: bool>, |a, b| {
    let (x, y) = (wide(a, W, S), wide(b, W, S));
    if y == 0 { mask(W) } else { (x / y) as u64 & mask(W) }
});
op2!(Rem, <W: u32, S: bool>, |a, b| {
    let (x, y) = (wide(a, W, S), wide(b, W, S));
    if y == 0 { a & mask(W) } else { (x % y) as u64 & mask(W) }
});
op2!(Min, <W: u32, S: bool>, |a, b| if wide(a, W, S) <= wide(b, W, S) { a & mask(W) } else { b & mask(W) });
op2!(Max, <W: u32, S: bool>, |a, b| if wide(a, W, S) >= wide(b, W, S) { a & mask(W) } else { b & mask(W) });
op2!(FAddRn, <D: bool>, |a, b| if D {
    (f64::from_bits(a) + f64::from_bits(b)).to_bits()
} else {
    (f32::from_bits(a as u32) + f32::from_bits(b as u32)).to_bits() as u64
});
op2!(FSubRn, <D: bool>, |a, b| if D {
    (f64::from_bits(a) - f64::from_bits(b)).to_bits()
} else {
    (f32::from_bits(a as u32) - f32::from_bits(b as u32)).to_bits() as u64
});
op2!(FMulRn, <D: bool>, |a, b| if D {
    (f64::from_bits(a) * f64::from_bits(b)).to_bits()
} else {
    (f32::from_bits(a as u32) * f32::from_bits(b as u32)).to_bits() as u64
});
op2!(FDivRn, <D: bool>, |a, b| if D {
    (f64::from_bits(a) / f64::from_bits(b)).to_bits()
} else {
    (f32::from_bits(a as u32) / f32::from_bits(b as u32)).to_bits() as u64
});

op3!(MadLo, <W: u32>, |a, b, c| a.wrapping_mul(b).wrapping_add(c) & mask(W));
op3!(MadHi, <W: u32, S: bool>, |a, b, c| ((wide(a, W, S).wrapping_mul(wide(b, W, S)) >> W) as u64)
    .wrapping_add(c)
    & mask(W));
op3!(MadWide, <W: u32, S: bool>, |a, b, c| ((wide(a, W, S) * wide(b, W, S)) as u64)
    .wrapping_add(c)
    & mask(2 * W));
op3!(Bfe, <W: u32, S: bool>, |a, b, c| {
    // PTX: pos = b[7:0], len = c[7:0]; the sign bit is bit min(pos+len-1, W-1).
    let (pos, len) = ((b & 0xff) as u32, (c & 0xff) as u32);
    let mut d = 0u64;
    let sbit = if S && len != 0 {
        let i = (pos + len - 1).min(W - 1);
        (a >> i) & 1
    } else {
        0
    };
    for i in 0..W {
        let bit = if i < len && pos + i < W { (a >> (pos + i)) & 1 } else { sbit };
        d |= bit << i;
    }
    d
});
op3!(FmaRn, <D: bool>, |a, b, c| if D {
    f64::from_bits(a).mul_add(f64::from_bits(b), f64::from_bits(c)).to_bits()
} else {
    f32::from_bits(a as u32)
        .mul_add(f32::from_bits(b as u32), f32::from_bits(c as u32))
        .to_bits() as u64
});

op1!(Not, <W: u32>, |a| !a & mask(W));
op1!(Neg, <W: u32>, |a| a.wrapping_neg() & mask(W));
op1!(Abs, <W: u32>, |a| (sext(a, W).wrapping_abs() as u64) & mask(W));
op1!(Clz, <W: u32>, |a| ((a & mask(W)).leading_zeros() - (64 - W)) as u64);
op1!(Popc, <W: u32>, |a| (a & mask(W)).count_ones() as u64);
op1!(Brev, <W: u32>, |a| (a & mask(W)).reverse_bits() >> (64 - W));
op1!(Cnot, <W: u32>, |a| ((a & mask(W)) == 0) as u64);
op1!(CvtInt, <SW: u32, SS: bool, DW: u32>, |a| wide(a, SW, SS) as u64 & mask(DW));
op1!(FSqrtRn, <D: bool>, |a| if D {
    f64::from_bits(a).sqrt().to_bits()
} else {
    f32::from_bits(a as u32).sqrt().to_bits() as u64
});

/// Integer comparisons (`cmp` codes: 0 eq, 1 ne, 2 lt, 3 le, 4 gt, 5 ge).
pub(crate) struct ICmp<const W: u32, const S: bool, const OP: u8>;
impl<const W: u32, const S: bool, const OP: u8> C2 for ICmp<W, S, OP> {
    #[inline(always)]
    fn f(a: u64, b: u64) -> bool {
        let (x, y) = (wide(a, W, S), wide(b, W, S));
        match OP {
            0 => x == y,
            1 => x != y,
            2 => x < y,
            3 => x <= y,
            4 => x > y,
            _ => x >= y,
        }
    }
}

/// Native float comparisons (exact IEEE; codes as [`crate::numeric::CmpOp`]
/// in declaration order).
pub(crate) struct FCmp<const D: bool, const OP: u8>;
impl<const D: bool, const OP: u8> C2 for FCmp<D, OP> {
    #[inline(always)]
    fn f(a: u64, b: u64) -> bool {
        let (x, y) = if D {
            (f64::from_bits(a), f64::from_bits(b))
        } else {
            (
                f32::from_bits(a as u32) as f64,
                f32::from_bits(b as u32) as f64,
            )
        };
        let un = x.is_nan() || y.is_nan();
        match OP {
            0 => x == y,
            1 => x != y && !un,
            2 => x < y,
            3 => x <= y,
            4 => x > y,
            5 => x >= y,
            6 => x == y || un,
            7 => x != y,
            8 => x < y || un,
            9 => x <= y || un,
            10 => x > y || un,
            11 => x >= y || un,
            12 => !un,
            _ => un,
        }
    }
}

/// The integer binary function for `op` on a `w`-bit type.
pub(crate) fn int_bin(op: &str, w: u32, s: bool) -> Option<BinFn> {
    macro_rules! w1 {
        ($T:ident) => {
            match w {
                16 => bin::<$T<16>> as BinFn,
                32 => bin::<$T<32>>,
                64 => bin::<$T<64>>,
                _ => return None,
            }
        };
    }
    macro_rules! w2 {
        ($T:ident) => {
            match (w, s) {
                (16, false) => bin::<$T<16, false>> as BinFn,
                (16, true) => bin::<$T<16, true>>,
                (32, false) => bin::<$T<32, false>>,
                (32, true) => bin::<$T<32, true>>,
                (64, false) => bin::<$T<64, false>>,
                (64, true) => bin::<$T<64, true>>,
                _ => return None,
            }
        };
    }
    Some(match op {
        "add" => w1!(Add),
        "sub" => w1!(Sub),
        "mul.lo" => w1!(MulLo),
        "mul.hi" => w2!(MulHi),
        "mul.wide" if w < 64 => w2!(MulWide),
        "div" => w2!(Div),
        "rem" => w2!(Rem),
        "min" => w2!(Min),
        "max" => w2!(Max),
        "and" => w1!(And),
        "or" => w1!(Or),
        "xor" => w1!(Xor),
        "shl" => w1!(Shl),
        "shr" => w2!(Shr),
        _ => return None,
    })
}

/// The integer ternary function for `op` on a `w`-bit type.
pub(crate) fn int_tern(op: &str, w: u32, s: bool) -> Option<TernFn> {
    macro_rules! w2 {
        ($T:ident) => {
            match (w, s) {
                (16, false) => tern::<$T<16, false>> as TernFn,
                (16, true) => tern::<$T<16, true>>,
                (32, false) => tern::<$T<32, false>>,
                (32, true) => tern::<$T<32, true>>,
                (64, false) => tern::<$T<64, false>>,
                (64, true) => tern::<$T<64, true>>,
                _ => return None,
            }
        };
    }
    Some(match op {
        "mad.lo" => match w {
            16 => tern::<MadLo<16>> as TernFn,
            32 => tern::<MadLo<32>>,
            64 => tern::<MadLo<64>>,
            _ => return None,
        },
        "mad.hi" => w2!(MadHi),
        "mad.wide" if w < 64 => w2!(MadWide),
        "bfe" if w >= 32 => w2!(Bfe),
        _ => return None,
    })
}

/// The integer unary function for `op` on a `w`-bit type.
pub(crate) fn int_un(op: &str, w: u32) -> Option<UnFn> {
    macro_rules! w1 {
        ($T:ident) => {
            match w {
                16 => un::<$T<16>> as UnFn,
                32 => un::<$T<32>>,
                64 => un::<$T<64>>,
                _ => return None,
            }
        };
    }
    Some(match op {
        "not" => w1!(Not),
        "neg" => w1!(Neg),
        "abs" => w1!(Abs),
        "clz" => w1!(Clz),
        "popc" => w1!(Popc),
        "brev" => w1!(Brev),
        "cnot" => w1!(Cnot),
        _ => return None,
    })
}

/// `cvt` between integer types (no `.sat`): extend by the source's
/// signedness, truncate to the destination.
pub(crate) fn cvt_int(sw: u32, ss: bool, dw: u32) -> Option<UnFn> {
    macro_rules! d {
        ($sw:literal, $ss:literal) => {
            match dw {
                8 => un::<CvtInt<$sw, $ss, 8>> as UnFn,
                16 => un::<CvtInt<$sw, $ss, 16>>,
                32 => un::<CvtInt<$sw, $ss, 32>>,
                64 => un::<CvtInt<$sw, $ss, 64>>,
                _ => return None,
            }
        };
    }
    Some(match (sw, ss) {
        (8, false) => d!(8, false),
        (8, true) => d!(8, true),
        (16, false) => d!(16, false),
        (16, true) => d!(16, true),
        (32, false) => d!(32, false),
        (32, true) => d!(32, true),
        (64, false) => d!(64, false),
        (64, true) => d!(64, true),
        _ => return None,
    })
}

/// Integer comparison `op` (eq, ne, lt, le, gt, ge, lo, ls, hi, hs).
pub(crate) fn int_cmp(op: &str, w: u32, s: bool) -> Option<CmpFn> {
    let (code, s) = match op {
        "eq" => (0, s),
        "ne" => (1, s),
        "lt" => (2, s),
        "le" => (3, s),
        "gt" => (4, s),
        "ge" => (5, s),
        "lo" => (2, false),
        "ls" => (3, false),
        "hi" => (4, false),
        "hs" => (5, false),
        _ => return None,
    };
    macro_rules! c {
        ($w:literal, $s:literal) => {
            match code {
                0 => cmp::<ICmp<$w, $s, 0>> as CmpFn,
                1 => cmp::<ICmp<$w, $s, 1>>,
                2 => cmp::<ICmp<$w, $s, 2>>,
                3 => cmp::<ICmp<$w, $s, 3>>,
                4 => cmp::<ICmp<$w, $s, 4>>,
                _ => cmp::<ICmp<$w, $s, 5>>,
            }
        };
    }
    Some(match (w, s) {
        (16, false) => c!(16, false),
        (16, true) => c!(16, true),
        (32, false) => c!(32, false),
        (32, true) => c!(32, true),
        (64, false) => c!(64, false),
        (64, true) => c!(64, true),
        _ => return None,
    })
}

/// Native f32/f64 comparison with code `op` (index in `CmpOp` order).
pub(crate) fn float_cmp(double: bool, op: u8) -> CmpFn {
    macro_rules! c {
        ($d:literal) => {
            match op {
                0 => cmp::<FCmp<$d, 0>> as CmpFn,
                1 => cmp::<FCmp<$d, 1>>,
                2 => cmp::<FCmp<$d, 2>>,
                3 => cmp::<FCmp<$d, 3>>,
                4 => cmp::<FCmp<$d, 4>>,
                5 => cmp::<FCmp<$d, 5>>,
                6 => cmp::<FCmp<$d, 6>>,
                7 => cmp::<FCmp<$d, 7>>,
                8 => cmp::<FCmp<$d, 8>>,
                9 => cmp::<FCmp<$d, 9>>,
                10 => cmp::<FCmp<$d, 10>>,
                11 => cmp::<FCmp<$d, 11>>,
                12 => cmp::<FCmp<$d, 12>>,
                _ => cmp::<FCmp<$d, 13>>,
            }
        };
    }
    if double {
        c!(true)
    } else {
        c!(false)
    }
}

/// Fast `.rn` f32/f64 binary ops (exactly IEEE, native).
pub(crate) fn float_bin_rn(op: &str, double: bool) -> Option<BinFn> {
    macro_rules! d {
        ($T:ident) => {
            if double {
                bin::<$T<true>> as BinFn
            } else {
                bin::<$T<false>>
            }
        };
    }
    Some(match op {
        "add" => d!(FAddRn),
        "sub" => d!(FSubRn),
        "mul" => d!(FMulRn),
        "div" => d!(FDivRn),
        _ => return None,
    })
}

/// Fast `fma.rn` f32/f64.
pub(crate) fn float_fma_rn(double: bool) -> TernFn {
    if double {
        tern::<FmaRn<true>>
    } else {
        tern::<FmaRn<false>>
    }
}

/// Fast `sqrt.rn` f32/f64.
pub(crate) fn float_sqrt_rn(double: bool) -> UnFn {
    if double {
        un::<FSqrtRn<true>>
    } else {
        un::<FSqrtRn<false>>
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_semantics() {
        assert_eq!(Shr::<32, true>::f(0x8000_0000, 40), 0xffff_ffff);
        assert_eq!(Shr::<32, false>::f(0x8000_0000, 40), 0);
        assert_eq!(Shr::<64, true>::f(-16i64 as u64, 2), -4i64 as u64);
        assert_eq!(Shl::<32>::f(1, 32), 0);
        assert_eq!(Shl::<16>::f(0x8001, 1), 2);
        assert_eq!(MulHi::<32, false>::f(0xffff_ffff, 0xffff_ffff), 0xffff_fffe);
        assert_eq!(MulHi::<32, true>::f(0xffff_ffff, 0xffff_ffff), 0);
        assert_eq!(MulWide::<32, true>::f(0xffff_fffe, 3), -6i64 as u64);
        assert_eq!(MulWide::<16, false>::f(0xffff, 0xffff), 0xfffe_0001);
        assert_eq!(
            Div::<32, true>::f(-7i32 as u32 as u64, 2),
            -3i32 as u32 as u64
        );
        assert_eq!(Rem::<64, true>::f(-7i64 as u64, 2), -1i64 as u64);
        assert_eq!(Div::<32, false>::f(5, 0), 0xffff_ffff);
        assert_eq!(Rem::<32, false>::f(5, 0), 5);
        assert_eq!(
            Div::<64, true>::f(i64::MIN as u64, -1i64 as u64),
            i64::MIN as u64
        );
        assert_eq!(Min::<32, true>::f(0xffff_ffff, 1), 0xffff_ffff);
        assert_eq!(Min::<32, false>::f(0xffff_ffff, 1), 1);
        assert_eq!(Clz::<32>::f(1), 31);
        assert_eq!(Clz::<64>::f(0), 64);
        assert_eq!(Brev::<32>::f(1), 0x8000_0000);
        assert_eq!(Abs::<32>::f(0xffff_fff6), 10);
        assert_eq!(Bfe::<32, false>::f(0xf0, 4, 4), 0xf);
        assert_eq!(Bfe::<32, true>::f(0xf0, 4, 4), 0xffff_ffff);
        assert_eq!(CvtInt::<32, true, 64>::f(0xffff_ffff), !0);
        assert_eq!(CvtInt::<32, false, 64>::f(0xffff_ffff), 0xffff_ffff);
        assert_eq!(CvtInt::<64, true, 16>::f(0x1_2345), 0x2345);
        assert_eq!(MadLo::<64>::f(3, 4, -20i64 as u64), -8i64 as u64);
        assert!(ICmp::<16, true, 2>::f(0x8000, 1));
        assert!(!ICmp::<16, false, 2>::f(0x8000, 1));
    }

    #[test]
    fn float_compares_follow_ieee() {
        let nan = f32::NAN.to_bits() as u64;
        let one = 1f32.to_bits() as u64;
        assert!(!FCmp::<false, 1>::f(nan, one)); // ne is ordered
        assert!(FCmp::<false, 7>::f(nan, one)); // neu
        assert!(FCmp::<false, 13>::f(nan, one)); // nan
        assert!(!FCmp::<false, 12>::f(nan, one)); // num
        assert!(FCmp::<false, 8>::f(nan, one)); // ltu
        assert!(FCmp::<true, 0>::f(0x8000_0000_0000_0000, 0)); // -0 == 0
    }
}
