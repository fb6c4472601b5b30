//! `cvt`: every half value exhaustively, f32 → f16/bf16 and f64 → narrower
//! in all four roundings on boundaries and random patterns, int ↔ float in
//! all roundings with the 64-bit extremes, int ↔ int, and the modifiers —
//! against the exact references of `numeric_common` (and the `half` crate
//! for round-to-nearest).

mod numeric_common;

use leangrad_gpusim::numeric::{cvt, CvtMode, CvtTy, FloatTy, IntTy, Rnd};
use numeric_common::*;
use std::cmp::Ordering;

const FLOATS: [FloatTy; 4] = [FloatTy::F16, FloatTy::Bf16, FloatTy::F32, FloatTy::F64];
const INTS: [IntTy; 8] = [
    IntTy::U8,
    IntTy::U16,
    IntTy::U32,
    IntTy::U64,
    IntTy::S8,
    IntTy::S16,
    IntTy::S32,
    IntTy::S64,
];

fn ff(d: FloatTy, s: FloatTy, rnd: Rnd, x: u64) -> u64 {
    let mode = CvtMode {
        rnd: Some(rnd),
        ..Default::default()
    };
    cvt(CvtTy::Float(d), CvtTy::Float(s), mode, x)
}

/// The reference conversion of finite-or-special `x` (format `fs`) into
/// `fd`: NaN to the canonical NaN (or, into f64, the payload made quiet).
fn ref_convert(fd: Fm, fs: Fm, x: u64, rnd: Rnd) -> u64 {
    let sign = if fs.neg(x) { fd.sign() } else { 0 };
    if fs.is_nan(x) {
        return if fd == F64 {
            sign | F64.inf() | (1 << 51) | ((x & ((1 << fs.man) - 1)) << (52 - fs.man))
        } else {
            fd.canon()
        };
    }
    if fs.is_inf(x) {
        return sign | fd.inf();
    }
    if fs.is_zero(x) {
        return sign;
    }
    round_ref(fd, &Dy::of(fs, x), rnd)
}

#[test]
fn half_to_wider_exhaustive() {
    for h in 0..=0xffffu64 {
        // f16
        let r = ff(FloatTy::F32, FloatTy::F16, Rnd::Rn, h);
        if F16.is_nan(h) {
            assert_eq!(r, 0x7fff_ffff, "f16 NaN {h:#x}");
        } else {
            let want = half::f16::from_bits(h as u16).to_f32().to_bits() as u64;
            assert_eq!(r, want, "f16 {h:#x}");
            assert_eq!(r, ref_convert(F32, F16, h, Rnd::Rn));
        }
        assert_eq!(
            ff(FloatTy::F64, FloatTy::F16, Rnd::Rn, h),
            ref_convert(F64, F16, h, Rnd::Rn),
            "f16→f64 {h:#x}"
        );
        // bf16
        let r = ff(FloatTy::F32, FloatTy::Bf16, Rnd::Rz, h);
        if BF16.is_nan(h) {
            assert_eq!(r, 0x7fff_ffff, "bf16 NaN {h:#x}");
        } else {
            assert_eq!(r, h << 16, "bf16 {h:#x}");
            assert_eq!(r, ref_convert(F32, BF16, h, Rnd::Rn));
        }
        assert_eq!(
            ff(FloatTy::F64, FloatTy::Bf16, Rnd::Rn, h),
            ref_convert(F64, BF16, h, Rnd::Rn),
            "bf16→f64 {h:#x}"
        );
        // f16 ↔ bf16 (same size, both directions, all roundings)
        for rnd in RNDS {
            assert_eq!(
                ff(FloatTy::Bf16, FloatTy::F16, rnd, h),
                ref_convert(BF16, F16, h, rnd),
                "f16→bf16 {h:#x} {rnd:?}"
            );
            assert_eq!(
                ff(FloatTy::F16, FloatTy::Bf16, rnd, h),
                ref_convert(F16, BF16, h, rnd),
                "bf16→f16 {h:#x} {rnd:?}"
            );
        }
    }
}

/// f32 inputs on every boundary of a 16-bit format: each value, each
/// midpoint, and their f32 neighbours; plus the f32 specials.
fn half_boundaries(f: Fm) -> Vec<u32> {
    let mut v = vec![
        0,
        0x8000_0000,
        1,
        0x8000_0001,
        0x007f_ffff,
        0x0080_0000,
        0x7f7f_ffff,
        0xff7f_ffff,
        0x7f80_0000,
        0xff80_0000,
        0x7fc0_0000,
        0x7f80_0001,
        0xffc0_1234,
        0x7fff_ffff,
    ];
    for h in 0..(f.inf() as u32) {
        let x = (Dy::of(f, h as u64), Dy::of(f, h as u64 + 1));
        for val in [x.0.clone(), {
            // midpoint of h and h+1 (exact in f32 for both 16-bit formats)
            let s = x.0.add(&x.1);
            Dy { e: s.e - 1, ..s }
        }] {
            if val.is_zero() {
                continue;
            }
            let b = round_ref(F32, &val, Rnd::Rn) as u32;
            for sign in [0, 0x8000_0000] {
                for d in [-1i32, 0, 1] {
                    v.push((b as i32 + d) as u32 | sign);
                }
            }
        }
    }
    v
}

fn check_f32_to_half(ty: FloatTy, f: Fm, inputs: &[u32]) {
    for &x in inputs {
        for rnd in RNDS {
            let got = ff(ty, FloatTy::F32, rnd, x as u64);
            let want = ref_convert(f, F32, x as u64, rnd);
            assert_eq!(got, want, "f32 {x:#010x} → {ty:?} {rnd:?}");
        }
        let rn = ff(ty, FloatTy::F32, Rnd::Rn, x as u64);
        if !F32.is_nan(x as u64) {
            let h = if ty == FloatTy::F16 {
                half::f16::from_f32(f32::from_bits(x)).to_bits()
            } else {
                half::bf16::from_f32(f32::from_bits(x)).to_bits()
            };
            assert_eq!(rn, h as u64, "half crate, f32 {x:#010x} → {ty:?}");
        }
    }
}

fn random_f32(rng: &mut Rng, n: usize, f: Fm) -> Vec<u32> {
    let mut v = Vec::with_capacity(n);
    for i in 0..n {
        let x = rng.next() as u32;
        if i % 2 == 0 {
            v.push(x);
        } else {
            // exponent within the 16-bit format's range and a little beyond
            let lo = 127 - f.bias() as u32 - f.man - 3;
            let hi = 127 + f.bias() as u32 + 2;
            let e = (lo + (rng.below((hi - lo) as u64) as u32)).min(254);
            v.push((x & 0x807f_ffff) | (e << 23));
        }
    }
    v
}

#[test]
fn f32_to_f16_boundaries_and_random() {
    let mut inputs = half_boundaries(F16);
    inputs.extend(random_f32(&mut Rng(1), 500_000, F16));
    check_f32_to_half(FloatTy::F16, F16, &inputs);
}

#[test]
fn f32_to_bf16_boundaries_and_random() {
    let mut inputs = half_boundaries(BF16);
    inputs.extend(random_f32(&mut Rng(2), 500_000, BF16));
    check_f32_to_half(FloatTy::Bf16, BF16, &inputs);
}

#[test]
fn f64_to_narrower_and_back() {
    let mut rng = Rng(3);
    for i in 0..200_000 {
        let x = if i % 2 == 0 {
            rng.next()
        } else {
            // exponents near the narrower formats' ranges
            let e = 1023 - 160 + rng.below(300);
            (rng.next() & 0x800f_ffff_ffff_ffff) | (e << 52)
        };
        for (ty, f) in [
            (FloatTy::F32, F32),
            (FloatTy::F16, F16),
            (FloatTy::Bf16, BF16),
        ] {
            for rnd in RNDS {
                assert_eq!(
                    ff(ty, FloatTy::F64, rnd, x),
                    ref_convert(f, F64, x, rnd),
                    "f64 {x:#018x} → {ty:?} {rnd:?}"
                );
            }
        }
        let y = rng.next() & 0xffff_ffff;
        assert_eq!(
            ff(FloatTy::F64, FloatTy::F32, Rnd::Rn, y),
            ref_convert(F64, F32, y, Rnd::Rn),
            "f32 {y:#x} → f64"
        );
        // f16 → f32 → f64 … the conversions compose exactly when widening.
        assert_eq!(ff(FloatTy::F64, FloatTy::F64, Rnd::Rz, x), x);
    }
}

/// The reference integer rounding of a finite value, clamped to `d`.
fn ref_to_int(d: IntTy, x: &Dy, rnd: Rnd) -> i128 {
    let (q, rem_vs_half, inexact) = if x.e >= 0 {
        (x.m.shl(x.e), Ordering::Less, false)
    } else {
        let q = x.m.shr(-x.e);
        let rem = x.m.sub(&q.shl(-x.e));
        let half = Big::from_u128(1).shl(-x.e - 1);
        (q, rem.cmp(&half), !rem.is_zero())
    };
    let up = match rnd {
        Rnd::Rn => rem_vs_half == Ordering::Greater || (rem_vs_half == Ordering::Equal && q.bit(0)),
        Rnd::Rz => false,
        Rnd::Rm => x.neg && inexact,
        Rnd::Rp => !x.neg && inexact,
    };
    let q = if up { q.add(&Big::from_u128(1)) } else { q };
    let (min, max) = (d.min(), d.max());
    if q.bit_len() > 100 {
        return if x.neg { min } else { max };
    }
    let mag = q.0.first().copied().unwrap_or(0) as i128
        | (q.0.get(1).copied().unwrap_or(0) as i128) << 64;
    let v = if x.neg { -mag } else { mag };
    v.clamp(min, max)
}

#[test]
fn float_to_int_all_roundings() {
    let mut rng = Rng(4);
    let mut specials: Vec<f64> = vec![
        0.5,
        1.5,
        2.5,
        -0.5,
        -1.5,
        -2.5,
        0.49999999999999994,
        127.5,
        128.0,
        255.5,
        256.0,
        -128.5,
        -129.0,
        32767.5,
        65535.5,
        65536.0,
        2147483647.5,
        2147483648.0,
        -2147483648.5,
        4294967295.5,
        4294967296.0,
        9.223372036854775e18,
        9.223372036854776e18,
        -9.223372036854776e18,
        -9.223372036854778e18,
        1.8446744073709552e19,
        1e30,
        -1e30,
        1e-300,
        -1e-300,
        0.0,
        -0.0,
    ];
    specials.extend([f64::INFINITY, f64::NEG_INFINITY]);
    for fty in FLOATS {
        let f = fm(fty);
        let mut inputs: Vec<u64> = specials
            .iter()
            .map(|&v| ref_convert(f, F64, v.to_bits(), Rnd::Rn))
            .collect();
        for _ in 0..20_000 {
            inputs.push(operand(&mut rng, f));
            // values of moderate size, where the fraction matters
            let e = f.bias() as u64 + rng.below(66);
            let x =
                (rng.next() & (f.sign() | ((1 << f.man) - 1))) | (e.min((1 << f.exp) - 2) << f.man);
            inputs.push(x & f.mask());
        }
        for &x in &inputs {
            for d in INTS {
                for rnd in RNDS {
                    let mode = CvtMode {
                        rnd: Some(rnd),
                        integral: true,
                        ..Default::default()
                    };
                    let got = cvt(CvtTy::Int(d), CvtTy::Float(fty), mode, x);
                    let want = if f.is_nan(x) {
                        if fty == FloatTy::F64 || d.bits() == 64 {
                            1u64 << (d.bits() - 1)
                        } else {
                            0
                        }
                    } else if f.is_inf(x) {
                        d.encode(if f.neg(x) { d.min() } else { d.max() })
                    } else {
                        d.encode(ref_to_int(d, &Dy::of(f, x), rnd))
                    };
                    assert_eq!(got, want, "{fty:?} {x:#x} → {d:?} {rnd:?}");
                }
            }
        }
    }
}

#[test]
fn int_to_float_all_roundings() {
    let mut rng = Rng(5);
    let mut vals: Vec<i128> = vec![0, 1, -1, 2, 3];
    for k in 1..64 {
        let p = 1i128 << k;
        vals.extend([p - 1, p, p + 1, -p - 1, -p, -p + 1]);
    }
    // ties and near-ties for 11/8/24/53-bit mantissas
    for bits in [8, 11, 24, 53] {
        for shift in 0..(64 - bits) {
            let base = ((1i128 << bits) + 1) << shift;
            vals.extend([base, base + 1, base - 1, -base]);
        }
    }
    for _ in 0..20_000 {
        let n = rng.below(64) as u32;
        vals.push((rng.next() >> n) as i128);
        vals.push((rng.next() as i64 >> n) as i128);
    }
    for s in INTS {
        for &v in &vals {
            let raw = s.encode(v);
            let val = s.value(raw);
            for dty in FLOATS {
                let f = fm(dty);
                for rnd in RNDS {
                    let mode = CvtMode {
                        rnd: Some(rnd),
                        ..Default::default()
                    };
                    let got = cvt(CvtTy::Float(dty), CvtTy::Int(s), mode, raw);
                    let want = if val == 0 {
                        0
                    } else {
                        round_ref(f, &Dy::int(val), rnd)
                    };
                    assert_eq!(got, want, "{s:?} {val} → {dty:?} {rnd:?}");
                }
            }
        }
    }
    // The cases host `as` gets wrong for directed rounding.
    let m = CvtMode {
        rnd: Some(Rnd::Rz),
        ..Default::default()
    };
    let u = CvtTy::Int(IntTy::U64);
    assert_eq!(
        cvt(CvtTy::Float(FloatTy::F32), u, m, u64::MAX),
        s(f32::from_bits(0x5f7f_ffff))
    );
    let m = CvtMode {
        rnd: Some(Rnd::Rp),
        ..m
    };
    assert_eq!(
        cvt(CvtTy::Float(FloatTy::F32), u, m, (1 << 24) + 1),
        s(16777218.0)
    );
    assert_eq!(
        cvt(CvtTy::Float(FloatTy::F64), u, m, (1 << 53) + 1),
        d(9007199254740994.0)
    );
}

#[test]
fn int_to_int() {
    let mut rng = Rng(6);
    let mut vals: Vec<u64> = vec![0, 1, u64::MAX, 0x7f, 0x80, 0xff, 0x7fff, 0x8000, 0xffff];
    vals.extend([
        0x7fff_ffff,
        0x8000_0000,
        0xffff_ffff,
        i64::MAX as u64,
        i64::MIN as u64,
    ]);
    for _ in 0..5_000 {
        vals.push(rng.next());
    }
    for s in INTS {
        for d in INTS {
            for &raw in &vals {
                let v = s.value(raw);
                // the value as the source type sees it: its low bits
                let sv = if s.signed() {
                    ((raw << (64 - s.bits())) as i64 >> (64 - s.bits())) as i128
                } else {
                    ((raw << (64 - s.bits())) >> (64 - s.bits())) as i128
                };
                assert_eq!(v, sv);
                let wrap = (sv as u64) & (u64::MAX >> (64 - d.bits()));
                let plain = CvtMode::default();
                assert_eq!(cvt(CvtTy::Int(d), CvtTy::Int(s), plain, raw), wrap);
                let clamped = sv.clamp(d.min(), d.max());
                let sat = CvtMode { sat: true, ..plain };
                assert_eq!(
                    cvt(CvtTy::Int(d), CvtTy::Int(s), sat, raw),
                    (clamped as u64) & (u64::MAX >> (64 - d.bits())),
                    "{s:?} {raw:#x} → {d:?} sat"
                );
            }
        }
    }
    // The interpreter's hot pair.
    let m = CvtMode::default();
    assert_eq!(
        cvt(
            CvtTy::Int(IntTy::U32),
            CvtTy::Int(IntTy::U64),
            m,
            0x1_2345_6789
        ),
        0x2345_6789
    );
    assert_eq!(
        cvt(CvtTy::Int(IntTy::S64), CvtTy::Int(IntTy::S8), m, 0x80),
        0xffff_ffff_ffff_ff80
    );
}

#[test]
fn float_to_int_nan_rules() {
    let m = CvtMode {
        rnd: Some(Rnd::Rz),
        integral: true,
        ..Default::default()
    };
    let c = |d, s, x| cvt(CvtTy::Int(d), CvtTy::Float(s), m, x);
    assert_eq!(c(IntTy::S32, FloatTy::F32, 0x7fc0_0000), 0);
    assert_eq!(c(IntTy::U16, FloatTy::F16, 0x7e00), 0);
    assert_eq!(c(IntTy::S32, FloatTy::F64, d(f64::NAN)), 0x8000_0000);
    assert_eq!(c(IntTy::U32, FloatTy::F64, d(f64::NAN)), 0x8000_0000);
    assert_eq!(c(IntTy::U8, FloatTy::F64, d(f64::NAN)), 0x80);
    assert_eq!(c(IntTy::S64, FloatTy::F32, 0xffc0_0000), 1 << 63);
    assert_eq!(c(IntTy::U64, FloatTy::Bf16, 0x7fc0), 1 << 63);
    assert_eq!(c(IntTy::S32, FloatTy::F32, s(-3.9)), (-3i32) as u32 as u64);
    assert_eq!(c(IntTy::U32, FloatTy::F32, s(-3.9)), 0);
    assert_eq!(c(IntTy::S8, FloatTy::F32, s(1e10)), 0x7f);
    assert_eq!(c(IntTy::S8, FloatTy::F32, s(-1e10)), 0x80);
}

#[test]
fn integral_rounding_float_to_float() {
    let mut rng = Rng(7);
    for fty in FLOATS {
        let f = fm(fty);
        for i in 0..40_000 {
            let x = if i < 20_000 {
                operand(&mut rng, f)
            } else {
                let e = f.bias() as u64 - 2 + rng.below(f.man as u64 + 4);
                (rng.next() & (f.sign() | ((1 << f.man) - 1))) | (e << f.man)
            } & f.mask();
            for rnd in RNDS {
                let mode = CvtMode {
                    rnd: Some(rnd),
                    integral: true,
                    ..Default::default()
                };
                let got = cvt(CvtTy::Float(fty), CvtTy::Float(fty), mode, x);
                let want = if f.is_nan(x) {
                    if fty == FloatTy::F64 {
                        x | (1 << 51)
                    } else {
                        f.canon()
                    }
                } else if f.is_inf(x) || f.is_zero(x) {
                    x
                } else {
                    let v = ref_to_int(IntTy::S64, &Dy::of(f, x), rnd);
                    if Dy::of(f, x).e >= 0 {
                        x
                    } else if v == 0 {
                        x & f.sign()
                    } else {
                        round_ref(f, &Dy::int(v), Rnd::Rn)
                    }
                };
                assert_eq!(got, want, "{fty:?} {x:#x} {rnd:?}");
            }
        }
    }
}

#[test]
fn modifiers_sat_relu_ftz() {
    let f32_ = CvtTy::Float(FloatTy::F32);
    let sat = CvtMode {
        sat: true,
        ..Default::default()
    };
    for (x, want) in [
        (-1.0f32, 0.0f32),
        (-0.0, 0.0),
        (0.25, 0.25),
        (1.0, 1.0),
        (1.5, 1.0),
        (f32::INFINITY, 1.0),
        (f32::NEG_INFINITY, 0.0),
        (f32::NAN, 0.0),
    ] {
        assert_eq!(cvt(f32_, f32_, sat, s(x)), s(want), "sat {x}");
    }
    // .sat on f64 → f32 and s32 → f32
    let satrn = CvtMode {
        rnd: Some(Rnd::Rn),
        ..sat
    };
    assert_eq!(cvt(f32_, CvtTy::Float(FloatTy::F64), satrn, d(2.0)), s(1.0));
    assert_eq!(
        cvt(f32_, CvtTy::Int(IntTy::S32), satrn, (-5i32) as u32 as u64),
        0
    );
    // .relu on f16/bf16 destinations
    let relu = CvtMode {
        rnd: Some(Rnd::Rn),
        relu: true,
        ..Default::default()
    };
    let h = CvtTy::Float(FloatTy::F16);
    let b = CvtTy::Float(FloatTy::Bf16);
    assert_eq!(cvt(h, f32_, relu, s(-2.0)), 0);
    assert_eq!(cvt(h, f32_, relu, s(-0.0)), 0);
    assert_eq!(cvt(h, f32_, relu, s(2.0)), 0x4000);
    assert_eq!(cvt(h, f32_, relu, s(f32::NAN)), 0x7fff);
    assert_eq!(cvt(b, f32_, relu, s(-1e-40)), 0);
    assert_eq!(cvt(b, f32_, relu, 0xffc0_0000), 0x7fff);
    // .ftz: f32 subnormal inputs and results
    let ftz = CvtMode {
        ftz: true,
        ..Default::default()
    };
    let sub = 0x0000_1234u64;
    assert_eq!(cvt(f32_, f32_, ftz, sub), 0);
    assert_eq!(cvt(f32_, f32_, ftz, sub | 0x8000_0000), 0x8000_0000);
    assert_eq!(cvt(f32_, f32_, CvtMode::default(), sub), sub);
    let f64_ = CvtTy::Float(FloatTy::F64);
    assert_eq!(cvt(f64_, f32_, ftz, sub | 0x8000_0000), d(-0.0));
    let ftzrp = CvtMode {
        rnd: Some(Rnd::Rp),
        ftz: true,
        ..Default::default()
    };
    assert_eq!(cvt(f32_, f64_, ftzrp, d(1e-300)), 0);
    assert_eq!(cvt(f32_, f64_, ftzrp, d(-1e-300)), 0x8000_0000);
    // just below the smallest normal: rounds up to it, so nothing to flush
    let below_min_normal = f64::powi(2.0, -126) * (1.0 - f64::powi(2.0, -30));
    assert_eq!(cvt(f32_, f64_, ftzrp, d(below_min_normal)), 0x0080_0000);
    let rz = CvtMode {
        rnd: Some(Rnd::Rz),
        ..ftzrp
    };
    assert_eq!(cvt(f32_, f64_, rz, d(below_min_normal)), 0);
    // .ftz does not touch f16 or f64 values
    assert_eq!(
        cvt(h, f64_, ftz, d(1e-7)),
        ref_convert(F16, F64, d(1e-7), Rnd::Rn)
    );
    // rpi with ftz: a subnormal is zero first
    let rpi = CvtMode {
        rnd: Some(Rnd::Rp),
        integral: true,
        ftz: true,
        ..Default::default()
    };
    assert_eq!(cvt(CvtTy::Int(IntTy::S32), f32_, rpi, 1), 0);
    let rpi = CvtMode { ftz: false, ..rpi };
    assert_eq!(cvt(CvtTy::Int(IntTy::S32), f32_, rpi, 1), 1);
    // wider source registers: only the low bits count
    assert_eq!(cvt(f32_, h, CvtMode::default(), 0xdead_3c00), s(1.0));
}
