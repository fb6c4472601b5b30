//! Slow exact references for the numeric tests: a small big-integer, exact
//! dyadic numbers ±M·2^E, and IEEE rounding written from its definition —
//! find the two representable neighbours of the exact value and compare
//! the value with them and their midpoint exactly. Shared by the
//! `numeric_*` test files (each uses part of it).
#![allow(dead_code)]

use leangrad_gpusim::numeric::{FloatTy, Rnd};
use std::cmp::Ordering;

/// splitmix64: a small deterministic generator.
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A value in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Format parameters: (total bits, fraction bits, exponent bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fm {
    pub bits: u32,
    pub man: u32,
    pub exp: u32,
}

pub const F16: Fm = Fm {
    bits: 16,
    man: 10,
    exp: 5,
};
pub const BF16: Fm = Fm {
    bits: 16,
    man: 7,
    exp: 8,
};
pub const F32: Fm = Fm {
    bits: 32,
    man: 23,
    exp: 8,
};
pub const F64: Fm = Fm {
    bits: 64,
    man: 52,
    exp: 11,
};

pub fn fm(ty: FloatTy) -> Fm {
    match ty {
        FloatTy::F16 => F16,
        FloatTy::Bf16 => BF16,
        FloatTy::F32 => F32,
        FloatTy::F64 => F64,
    }
}

impl Fm {
    pub fn sign(self) -> u64 {
        1 << (self.bits - 1)
    }
    pub fn inf(self) -> u64 {
        ((1u64 << self.exp) - 1) << self.man
    }
    pub fn mask(self) -> u64 {
        u64::MAX >> (64 - self.bits)
    }
    pub fn bias(self) -> i64 {
        (1 << (self.exp - 1)) - 1
    }
    pub fn is_nan(self, x: u64) -> bool {
        x & (self.sign() - 1) > self.inf()
    }
    pub fn is_inf(self, x: u64) -> bool {
        x & (self.sign() - 1) == self.inf()
    }
    pub fn is_zero(self, x: u64) -> bool {
        x & (self.sign() - 1) == 0
    }
    pub fn is_sub(self, x: u64) -> bool {
        x & self.inf() == 0 && !self.is_zero(x)
    }
    pub fn neg(self, x: u64) -> bool {
        x & self.sign() != 0
    }
    pub fn canon(self) -> u64 {
        self.sign() - 1
    }
    pub fn one(self) -> u64 {
        (self.bias() as u64) << self.man
    }
}

/// A big unsigned integer: little-endian 64-bit limbs, no zero top limb.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Big(pub Vec<u64>);

impl Big {
    pub fn from_u128(v: u128) -> Big {
        let mut b = Big(vec![v as u64, (v >> 64) as u64]);
        b.trim();
        b
    }
    fn trim(&mut self) {
        while self.0.last() == Some(&0) {
            self.0.pop();
        }
    }
    pub fn is_zero(&self) -> bool {
        self.0.is_empty()
    }
    pub fn bit_len(&self) -> i64 {
        match self.0.last() {
            None => 0,
            Some(&t) => 64 * (self.0.len() as i64 - 1) + 64 - t.leading_zeros() as i64,
        }
    }
    pub fn bit(&self, i: i64) -> bool {
        let (l, b) = ((i / 64) as usize, i % 64);
        l < self.0.len() && (self.0[l] >> b) & 1 == 1
    }
    pub fn shl(&self, n: i64) -> Big {
        if self.is_zero() {
            return self.clone();
        }
        let (limbs, bits) = ((n / 64) as usize, (n % 64) as u32);
        let mut v = vec![0u64; limbs];
        let mut carry = 0u64;
        for &x in &self.0 {
            v.push((x << bits) | carry);
            carry = if bits == 0 { 0 } else { x >> (64 - bits) };
        }
        v.push(carry);
        let mut b = Big(v);
        b.trim();
        b
    }
    /// Shifted right by n (bits shifted out are dropped).
    pub fn shr(&self, n: i64) -> Big {
        let (limbs, bits) = ((n / 64) as usize, (n % 64) as u32);
        if limbs >= self.0.len() {
            return Big(vec![]);
        }
        let src = &self.0[limbs..];
        let mut v = Vec::with_capacity(src.len());
        for i in 0..src.len() {
            let lo = src[i] >> bits;
            let hi = if bits == 0 || i + 1 >= src.len() {
                0
            } else {
                src[i + 1] << (64 - bits)
            };
            v.push(lo | hi);
        }
        let mut b = Big(v);
        b.trim();
        b
    }
    pub fn add(&self, o: &Big) -> Big {
        let n = self.0.len().max(o.0.len());
        let mut v = Vec::with_capacity(n + 1);
        let mut carry = 0u128;
        for i in 0..n {
            let s =
                *self.0.get(i).unwrap_or(&0) as u128 + *o.0.get(i).unwrap_or(&0) as u128 + carry;
            v.push(s as u64);
            carry = s >> 64;
        }
        v.push(carry as u64);
        let mut b = Big(v);
        b.trim();
        b
    }
    /// self − o, for self ≥ o.
    pub fn sub(&self, o: &Big) -> Big {
        assert!(self.cmp(o) != Ordering::Less);
        let mut v = Vec::with_capacity(self.0.len());
        let mut borrow = 0i128;
        for i in 0..self.0.len() {
            let d = self.0[i] as i128 - *o.0.get(i).unwrap_or(&0) as i128 - borrow;
            if d < 0 {
                v.push((d + (1i128 << 64)) as u64);
                borrow = 1;
            } else {
                v.push(d as u64);
                borrow = 0;
            }
        }
        let mut b = Big(v);
        b.trim();
        b
    }
    pub fn mul(&self, o: &Big) -> Big {
        let mut v = vec![0u64; self.0.len() + o.0.len() + 1];
        for (i, &x) in self.0.iter().enumerate() {
            let mut carry = 0u128;
            for (j, &y) in o.0.iter().enumerate() {
                let t = v[i + j] as u128 + x as u128 * y as u128 + carry;
                v[i + j] = t as u64;
                carry = t >> 64;
            }
            let mut k = i + o.0.len();
            while carry != 0 {
                let t = v[k] as u128 + carry;
                v[k] = t as u64;
                carry = t >> 64;
                k += 1;
            }
        }
        let mut b = Big(v);
        b.trim();
        b
    }
    pub fn cmp(&self, o: &Big) -> Ordering {
        if self.0.len() != o.0.len() {
            return self.0.len().cmp(&o.0.len());
        }
        for i in (0..self.0.len()).rev() {
            match self.0[i].cmp(&o.0[i]) {
                Ordering::Equal => {}
                r => return r,
            }
        }
        Ordering::Equal
    }
}

/// An exact dyadic number ±m·2^e.
#[derive(Clone, Debug)]
pub struct Dy {
    pub neg: bool,
    pub m: Big,
    pub e: i64,
}

impl Dy {
    pub fn zero() -> Dy {
        Dy {
            neg: false,
            m: Big(vec![]),
            e: 0,
        }
    }
    pub fn int(v: i128) -> Dy {
        Dy {
            neg: v < 0,
            m: Big::from_u128(v.unsigned_abs()),
            e: 0,
        }
    }
    pub fn pow2(e: i64) -> Dy {
        Dy {
            neg: false,
            m: Big::from_u128(1),
            e,
        }
    }
    /// The exact value of finite bits `x` of format `f`.
    pub fn of(f: Fm, x: u64) -> Dy {
        let field = ((x >> f.man) & ((1 << f.exp) - 1)) as i64;
        let frac = x & ((1 << f.man) - 1);
        let (m, e) = if field == 0 {
            (frac, 1 - f.bias() - f.man as i64)
        } else {
            (frac | (1 << f.man), field - f.bias() - f.man as i64)
        };
        Dy {
            neg: f.neg(x),
            m: Big::from_u128(m as u128),
            e,
        }
    }
    pub fn is_zero(&self) -> bool {
        self.m.is_zero()
    }
    pub fn negate(&self) -> Dy {
        Dy {
            neg: !self.neg,
            ..self.clone()
        }
    }
    pub fn abs(&self) -> Dy {
        Dy {
            neg: false,
            ..self.clone()
        }
    }
    pub fn mul(&self, o: &Dy) -> Dy {
        Dy {
            neg: self.neg != o.neg,
            m: self.m.mul(&o.m),
            e: self.e + o.e,
        }
    }
    /// Both magnitudes at the smaller exponent.
    fn align(&self, o: &Dy) -> (Big, Big, i64) {
        if self.is_zero() {
            return (Big(vec![]), o.m.clone(), o.e);
        }
        if o.is_zero() {
            return (self.m.clone(), Big(vec![]), self.e);
        }
        let e = self.e.min(o.e);
        (self.m.shl(self.e - e), o.m.shl(o.e - e), e)
    }
    pub fn add(&self, o: &Dy) -> Dy {
        let (a, b, e) = self.align(o);
        if self.neg == o.neg {
            return Dy {
                neg: self.neg,
                m: a.add(&b),
                e,
            };
        }
        match a.cmp(&b) {
            Ordering::Less => Dy {
                neg: o.neg,
                m: b.sub(&a),
                e,
            },
            _ => Dy {
                neg: self.neg,
                m: a.sub(&b),
                e,
            },
        }
    }
    /// Comparison of magnitudes: by leading-bit position first, aligning
    /// only when those agree.
    pub fn cmp_mag(&self, o: &Dy) -> Ordering {
        match (self.is_zero(), o.is_zero()) {
            (true, true) => return Ordering::Equal,
            (true, false) => return Ordering::Less,
            (false, true) => return Ordering::Greater,
            _ => {}
        }
        let (ta, tb) = (self.e + self.m.bit_len(), o.e + o.m.bit_len());
        if ta != tb {
            return ta.cmp(&tb);
        }
        let (a, b, _) = self.align(o);
        a.cmp(&b)
    }
    /// Signed comparison (zeros equal).
    pub fn cmp(&self, o: &Dy) -> Ordering {
        let (za, zb) = (self.is_zero(), o.is_zero());
        let na = self.neg && !za;
        let nb = o.neg && !zb;
        match (na, nb) {
            (false, true) => Ordering::Greater,
            (true, false) => Ordering::Less,
            (false, false) => self.cmp_mag(o),
            (true, true) => o.cmp_mag(self),
        }
    }
    /// Twice the value.
    pub fn twice(&self) -> Dy {
        Dy {
            e: self.e + 1,
            ..self.clone()
        }
    }
}

/// The representable magnitude just above magnitude bits `lo`, as an
/// exact value (2^(emax+1) standing for infinity).
fn next_val(f: Fm, lo: u64) -> (u64, Dy) {
    let hi = lo + 1;
    if hi == f.inf() {
        (hi, Dy::pow2(f.bias() + 1))
    } else {
        (hi, Dy::of(f, hi))
    }
}

/// The largest representable magnitude ≤ the nonzero magnitude `x`
/// (clamped to the largest finite one), as bits.
fn floor_bits(f: Fm, x: &Dy) -> u64 {
    let top = x.e + x.m.bit_len() - 1;
    let emin = 1 - f.bias();
    if top > f.bias() {
        return f.inf() - 1;
    }
    let lsb = top.max(emin) - f.man as i64;
    let q = if lsb >= x.e {
        x.m.shr(lsb - x.e)
    } else {
        x.m.shl(x.e - lsb)
    };
    let q = q.0.first().copied().unwrap_or(0);
    if q >> f.man == 0 {
        q
    } else {
        (((lsb + f.man as i64 + f.bias()) as u64) << f.man) | (q & ((1 << f.man) - 1))
    }
}

/// Picks lo or hi (magnitude bits) for a value strictly between them, from
/// the comparison of the value with their midpoint.
fn pick(f: Fm, neg: bool, lo: u64, hi: u64, vs_mid: Ordering, rnd: Rnd) -> u64 {
    let up = match rnd {
        Rnd::Rn => match vs_mid {
            Ordering::Less => false,
            Ordering::Greater => true,
            Ordering::Equal => lo & 1 == 1,
        },
        Rnd::Rz => false,
        Rnd::Rm => neg,
        Rnd::Rp => !neg,
    };
    let mag = if up { hi } else { lo };
    mag | if neg { f.sign() } else { 0 }
}

/// The exact nonzero value `x` rounded into `f` by the definition.
pub fn round_ref(f: Fm, x: &Dy, rnd: Rnd) -> u64 {
    assert!(!x.is_zero());
    let mag = x.abs();
    let lo = floor_bits(f, &mag);
    let lo_v = Dy::of(f, lo);
    if lo_v.cmp_mag(&mag) == Ordering::Equal {
        return lo | if x.neg { f.sign() } else { 0 };
    }
    let (hi, hi_v) = next_val(f, lo);
    let vs_mid = mag.twice().cmp_mag(&lo_v.add(&hi_v));
    pick(f, x.neg, lo, hi, vs_mid, rnd)
}

/// A quotient or root rounded by the definition: `below(c)` says whether
/// the candidate magnitude c (exact) is ≤ the true magnitude, `vs_mid(lo,
/// hi)` compares the true magnitude with (lo + hi)/2 and `exact(c)` says c
/// is the true magnitude. `seed` is any guess at the floor.
pub fn round_implicit(
    f: Fm,
    neg: bool,
    seed: u64,
    below: impl Fn(&Dy) -> bool,
    vs_mid: impl Fn(&Dy, &Dy) -> Ordering,
    exact: impl Fn(&Dy) -> bool,
    rnd: Rnd,
) -> u64 {
    let mut lo = seed.min(f.inf() - 1);
    while lo > 0 && !below(&Dy::of(f, lo)) {
        lo -= 1;
    }
    while lo + 1 < f.inf() && below(&Dy::of(f, lo + 1)) {
        lo += 1;
    }
    let lo_v = Dy::of(f, lo);
    if exact(&lo_v) {
        return lo | if neg { f.sign() } else { 0 };
    }
    let (hi, hi_v) = next_val(f, lo);
    pick(f, neg, lo, hi, vs_mid(&lo_v, &hi_v), rnd)
}

/// The sign of an exact zero sum of operands with signs `na`, `nb` (both
/// zero when `both_zero`): IEEE 754 §6.3.
pub fn zero_sum(f: Fm, na: bool, nb: bool, both_zero: bool, rnd: Rnd) -> u64 {
    let neg = if both_zero && na == nb {
        na
    } else {
        rnd == Rnd::Rm
    };
    if neg {
        f.sign()
    } else {
        0
    }
}

pub const RNDS: [Rnd; 4] = [Rnd::Rn, Rnd::Rz, Rnd::Rm, Rnd::Rp];

/// A random operand of format `f`, biased towards the places where
/// rounding goes wrong: extreme exponents, subnormals, all-ones and
/// single-bit mantissas, and specials.
pub fn operand(rng: &mut Rng, f: Fm) -> u64 {
    let sign = if rng.next() & 1 == 1 { f.sign() } else { 0 };
    let emax_field = (1u64 << f.exp) - 1;
    let field = match rng.below(10) {
        0 => 0,
        1 => 1 + rng.below(3),
        2 => emax_field - 1 - rng.below(3),
        3 => emax_field,
        4 => f.bias() as u64 - 2 + rng.below(5),
        _ => 1 + rng.below(emax_field - 1),
    };
    let fm = (1u64 << f.man) - 1;
    let frac = match rng.below(8) {
        0 => 0,
        1 => fm,
        2 => 1 << rng.below(f.man as u64),
        3 => fm ^ (1 << rng.below(f.man as u64)),
        4 => rng.below(4),
        _ => rng.next() & fm,
    };
    sign | (field << f.man) | frac
}

/// Bits of an f64 value.
pub fn d(x: f64) -> u64 {
    x.to_bits()
}

/// Bits of an f32 value.
pub fn s(x: f32) -> u64 {
    x.to_bits() as u64
}
