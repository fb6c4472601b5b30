//! min/max and comparisons on the ISA's NaN and signed-zero cases and on
//! random pairs, abs/neg/copysign, and the approximate instructions swept
//! against independent f64 references within the ISA's documented errors.

mod numeric_common;

use leangrad_gpusim::numeric::{
    approx, fabs, fcmp, fcopysign, fminmax, fneg, frcp, ApproxOp, CmpOp, FloatTy, Precision,
};
use numeric_common::*;

const TYPES: [FloatTy; 4] = [FloatTy::F16, FloatTy::Bf16, FloatTy::F32, FloatTy::F64];

/// Exact f64 value of non-NaN bits of any format.
fn val(ty: FloatTy, x: u64) -> f64 {
    match ty {
        FloatTy::F16 => half::f16::from_bits(x as u16).to_f64(),
        FloatTy::Bf16 => half::bf16::from_bits(x as u16).to_f64(),
        FloatTy::F32 => f32::from_bits(x as u32) as f64,
        FloatTy::F64 => f64::from_bits(x),
    }
}

/// Special and ordinary values of each format.
fn specials(f: Fm) -> Vec<u64> {
    let q = 1u64 << (f.man - 1);
    vec![
        0,
        f.sign(),
        1,
        f.sign() | 1,
        f.one(),
        f.one() | f.sign(),
        f.one() + 1,
        f.inf() - 1,
        f.inf(),
        f.inf() | f.sign(),
        f.inf() | q,
        f.inf() | q | f.sign(),
        f.inf() | 1,
        f.canon(),
    ]
}

fn ref_minmax(ty: FloatTy, a: u64, b: u64, is_max: bool, nan: bool) -> u64 {
    let f = fm(ty);
    let (an, bn) = (f.is_nan(a), f.is_nan(b));
    if (an && bn) || (nan && (an || bn)) {
        return f.canon();
    }
    if an {
        return b;
    }
    if bn {
        return a;
    }
    let (va, vb) = (val(ty, a), val(ty, b));
    // (x < y) ? x : y with −0 < +0
    let a_less = va < vb || (va == 0.0 && vb == 0.0 && f.neg(a) && !f.neg(b));
    let b_less = vb < va || (va == 0.0 && vb == 0.0 && f.neg(b) && !f.neg(a));
    if is_max {
        if b_less {
            a
        } else {
            b
        }
    } else if a_less {
        a
    } else {
        b
    }
}

#[test]
fn min_max_nan_and_zero_rules() {
    for ty in TYPES {
        let f = fm(ty);
        let nan = f.inf() | 1;
        let one = f.one();
        // one NaN: the other operand; both: canonical; .NaN: canonical
        assert_eq!(fminmax(ty, nan, one, false, false, false), one);
        assert_eq!(fminmax(ty, one, nan, true, false, false), one);
        assert_eq!(
            fminmax(ty, nan, nan | f.sign(), false, false, false),
            f.canon()
        );
        assert_eq!(fminmax(ty, nan, one, true, false, true), f.canon());
        assert_eq!(fminmax(ty, one, nan, false, false, true), f.canon());
        // −0.0 < +0.0, both orders
        let (pz, nz) = (0, f.sign());
        assert_eq!(fminmax(ty, pz, nz, false, false, false), nz);
        assert_eq!(fminmax(ty, nz, pz, false, false, false), nz);
        assert_eq!(fminmax(ty, pz, nz, true, false, false), pz);
        assert_eq!(fminmax(ty, nz, pz, true, false, false), pz);
        let all = specials(f);
        for &a in &all {
            for &b in &all {
                for is_max in [false, true] {
                    for nanm in [false, true] {
                        assert_eq!(
                            fminmax(ty, a, b, is_max, false, nanm),
                            ref_minmax(ty, a, b, is_max, nanm),
                            "{ty:?} {a:#x} {b:#x} max={is_max} nan={nanm}"
                        );
                    }
                }
            }
        }
        let mut rng = Rng(80 + ty as u64);
        for _ in 0..20_000 {
            let (a, b) = (operand(&mut rng, f), operand(&mut rng, f));
            for is_max in [false, true] {
                assert_eq!(
                    fminmax(ty, a, b, is_max, false, false),
                    ref_minmax(ty, a, b, is_max, false)
                );
            }
        }
    }
    // .ftz: subnormal inputs are zeros of their sign
    let sub = 0x0000_0005u64;
    assert_eq!(
        fminmax(FloatTy::F32, sub, 0x8000_0000, false, true, false),
        0x8000_0000
    );
    assert_eq!(
        fminmax(FloatTy::F32, sub, 0x8000_0000, true, true, false),
        0
    );
    assert_eq!(
        fminmax(FloatTy::F32, sub | 1 << 31, 0, false, true, false),
        0x8000_0000
    );
    assert_eq!(fminmax(FloatTy::F32, sub, 0, true, false, false), sub);
}

#[test]
fn comparisons_ordered_and_unordered() {
    let ops = [
        CmpOp::Eq,
        CmpOp::Ne,
        CmpOp::Lt,
        CmpOp::Le,
        CmpOp::Gt,
        CmpOp::Ge,
        CmpOp::Equ,
        CmpOp::Neu,
        CmpOp::Ltu,
        CmpOp::Leu,
        CmpOp::Gtu,
        CmpOp::Geu,
        CmpOp::Num,
        CmpOp::Nan,
    ];
    let reference = |op: CmpOp, x: f64, y: f64| {
        let u = x.is_nan() || y.is_nan();
        match op {
            CmpOp::Eq => x == y,
            CmpOp::Ne => !u && x != y,
            CmpOp::Lt => x < y,
            CmpOp::Le => x <= y,
            CmpOp::Gt => x > y,
            CmpOp::Ge => x >= y,
            CmpOp::Equ => u || x == y,
            CmpOp::Neu => x != y,
            CmpOp::Ltu => u || x < y,
            CmpOp::Leu => u || x <= y,
            CmpOp::Gtu => u || x > y,
            CmpOp::Geu => u || x >= y,
            CmpOp::Num => !u,
            CmpOp::Nan => u,
        }
    };
    let v = |ty, x| {
        if fm(ty).is_nan(x) {
            f64::NAN
        } else {
            val(ty, x)
        }
    };
    for ty in TYPES {
        let f = fm(ty);
        let mut pairs: Vec<(u64, u64)> = Vec::new();
        let sp = specials(f);
        for &a in &sp {
            for &b in &sp {
                pairs.push((a, b));
            }
        }
        let mut rng = Rng(90 + ty as u64);
        for _ in 0..20_000 {
            let a = operand(&mut rng, f);
            let b = if rng.below(4) == 0 {
                a
            } else {
                operand(&mut rng, f)
            };
            pairs.push((a, b));
        }
        for (a, b) in pairs {
            for op in ops {
                assert_eq!(
                    fcmp(ty, op, a, b, false),
                    reference(op, v(ty, a), v(ty, b)),
                    "{ty:?} {op:?} {a:#x} {b:#x}"
                );
            }
        }
    }
    // ±0 are equal; .ftz makes subnormals zeros
    assert!(fcmp(FloatTy::F32, CmpOp::Eq, 0, 0x8000_0000, false));
    assert!(!fcmp(FloatTy::F32, CmpOp::Eq, 1, 0, false));
    assert!(fcmp(FloatTy::F32, CmpOp::Eq, 1, 0, true));
    assert!(fcmp(FloatTy::F32, CmpOp::Ge, 0x8000_0001, 0, true));
    assert!(!fcmp(FloatTy::F32, CmpOp::Ge, 0x8000_0001, 0, false));
}

#[test]
fn abs_neg_copysign() {
    for ty in TYPES {
        let f = fm(ty);
        for &x in &specials(f) {
            if f.is_nan(x) {
                // NaN passes through (abs.f64: unchanged; others unspecified)
                assert!(f.is_nan(fabs(ty, x, false)));
                assert!(f.is_nan(fneg(ty, x, false)));
                continue;
            }
            assert_eq!(fabs(ty, x, false), x & !f.sign());
            assert_eq!(fneg(ty, x, false), x ^ f.sign());
        }
    }
    // .ftz (f32): subnormal → zero of its sign first
    assert_eq!(fneg(FloatTy::F32, 0x0000_0001, true), 0x8000_0000);
    assert_eq!(fabs(FloatTy::F32, 0x8000_0001, true), 0);
    assert_eq!(fneg(FloatTy::F32, 0x0000_0001, false), 0x8000_0001);
    assert_eq!(fneg(FloatTy::F64, 1, true), 1 | 1 << 63);
    // copysign d, a, b: sign of a, magnitude of b
    assert_eq!(fcopysign(FloatTy::F32, s(-1.0), s(2.5)), s(-2.5));
    assert_eq!(fcopysign(FloatTy::F32, s(1.0), s(-2.5)), s(2.5));
    assert_eq!(fcopysign(FloatTy::F64, d(-0.0), d(3.0)), d(-3.0));
    assert_eq!(
        fcopysign(FloatTy::F64, d(5.0), d(f64::NEG_INFINITY)),
        d(f64::INFINITY)
    );
}

/// f32 ulps between `r` (an f32 result) and the exact `want`.
fn ulp_err(r: f32, want: f64) -> f64 {
    let w = want as f32;
    let ulp = if w.is_finite() && w != 0.0 {
        let up = f32::from_bits(w.abs().to_bits() + 1) as f64;
        up - w.abs() as f64
    } else {
        f32::from_bits(1) as f64
    };
    ((r as f64) - want).abs() / ulp
}

/// sin by argument reduction with a two-part 2π and a Taylor series: an
/// f64 reference independent of libm's sin (|error| ≪ 2^-30 on ±100π).
fn sin_ref(x: f64) -> f64 {
    const TWO_PI_HI: f64 = std::f64::consts::TAU;
    const TWO_PI_LO: f64 = 2.4492935982947064e-16;
    let k = (x / TWO_PI_HI).round();
    let r = (x - k * TWO_PI_HI) - k * TWO_PI_LO;
    let (mut term, mut sum, mut n) = (r, r, 1.0);
    while term.abs() > 1e-300 && n < 80.0 {
        term *= -r * r / ((n + 1.0) * (n + 2.0));
        sum += term;
        n += 2.0;
    }
    sum
}

fn ap(op: ApproxOp, x: f32, ftz: bool) -> f32 {
    f32::from_bits(approx(op, FloatTy::F32, s(x), ftz) as u32)
}

#[test]
fn approx_f32_within_isa_bounds() {
    let ln2 = std::f64::consts::LN_2;
    let mut rng = Rng(100);
    for i in 0..200_000 {
        let t = i as f64 / 200_000.0;
        // ex2 over its whole range: max 2 ulp
        let x = (-160.0 + 290.0 * t) as f32;
        let want = (x as f64 * ln2).exp();
        let r = ap(ApproxOp::Ex2, x, false);
        if want < f32::MAX as f64 {
            assert!(ulp_err(r, want) <= 2.0, "ex2({x}) = {r}, want {want}");
        } else {
            assert_eq!(r, f32::INFINITY, "ex2({x})");
        }
        // lg2: 2^-22 absolute in (0.5, 2), 2^-22 relative elsewhere
        let y = f32::from_bits((rng.next() as u32) & 0x7fff_ffff);
        if y.is_finite() && y > 0.0 {
            let want = (y as f64).ln() / ln2;
            let r = ap(ApproxOp::Lg2, y, false) as f64;
            let err = (r - want).abs();
            if y > 0.5 && y < 2.0 {
                assert!(err <= 2f64.powi(-22), "lg2({y}) = {r}, want {want}");
            } else {
                assert!(
                    err <= 2f64.powi(-22) * want.abs(),
                    "lg2({y}) = {r}, want {want}"
                );
            }
        }
        // sin, cos: 2^-20.5 absolute on [-2π, 2π], 2^-14.7 on [-100π, 100π]
        let pi = std::f64::consts::PI;
        for (span, bound) in [(2.0 * pi, 2f64.powf(-20.5)), (100.0 * pi, 2f64.powf(-14.7))] {
            let z = ((2.0 * t - 1.0) * span) as f32;
            let zs = sin_ref(z as f64);
            let zc = sin_ref(z as f64 + pi / 2.0);
            assert!(
                (ap(ApproxOp::Sin, z, false) as f64 - zs).abs() <= bound,
                "sin({z})"
            );
            // cos(z) = sin(z + π/2): the shift's rounding is ~1e-16 here
            assert!(
                (ap(ApproxOp::Cos, z, false) as f64 - zc).abs() <= bound,
                "cos({z})"
            );
        }
        // rsqrt: 2^-22.9 relative over the positive finite range
        if y.is_finite() && y > 0.0 {
            let want = 1.0 / (y as f64).sqrt();
            let r = ap(ApproxOp::Rsqrt, y, false) as f64;
            assert!((r - want).abs() <= 2f64.powf(-22.9) * want, "rsqrt({y})");
        }
        // tanh: 2^-11 relative, via expm1 rather than libm's tanh
        let w = ((2.0 * t - 1.0) * 12.0) as f32;
        let e = (2.0 * w as f64).exp_m1();
        let want = e / (e + 2.0);
        let r = ap(ApproxOp::Tanh, w, false) as f64;
        assert!((r - want).abs() <= 2f64.powi(-11) * want.abs(), "tanh({w})");
    }
}

#[test]
fn approx_special_values() {
    use ApproxOp::*;
    let inf = f32::INFINITY;
    let table: [(ApproxOp, f32, f32); 30] = [
        (Ex2, -inf, 0.0),
        (Ex2, -0.0, 1.0),
        (Ex2, 0.0, 1.0),
        (Ex2, inf, inf),
        (Lg2, -inf, f32::NAN),
        (Lg2, -1.0, f32::NAN),
        (Lg2, -0.0, -inf),
        (Lg2, 0.0, -inf),
        (Lg2, inf, inf),
        (Sin, -inf, f32::NAN),
        (Sin, -0.0, -0.0),
        (Sin, 0.0, 0.0),
        (Sin, inf, f32::NAN),
        (Cos, -inf, f32::NAN),
        (Cos, -0.0, 1.0),
        (Cos, 0.0, 1.0),
        (Cos, inf, f32::NAN),
        (Rsqrt, -inf, f32::NAN),
        (Rsqrt, -1.0, f32::NAN),
        (Rsqrt, -0.0, -inf),
        (Rsqrt, 0.0, inf),
        (Rsqrt, inf, 0.0),
        (Tanh, -inf, -1.0),
        (Tanh, -0.0, -0.0),
        (Tanh, 0.0, 0.0),
        (Tanh, inf, 1.0),
        (Ex2, f32::NAN, f32::NAN),
        (Lg2, f32::NAN, f32::NAN),
        (Tanh, f32::NAN, f32::NAN),
        (Rsqrt, f32::NAN, f32::NAN),
    ];
    for (op, x, want) in table {
        for ftz in [false, true] {
            let r = approx(op, FloatTy::F32, s(x), ftz);
            let want = if want.is_nan() { 0x7fff_ffff } else { s(want) };
            assert_eq!(r, want, "{op:?}({x}) ftz={ftz}");
        }
    }
    // .ftz: subnormal inputs are zeros; subnormal results are flushed
    let sub = f32::from_bits(0x0000_0100);
    assert_eq!(ap(Ex2, -130.0, true), 0.0);
    assert_eq!(ap(Ex2, -130.0, false), 2f32.powi(-130));
    assert_eq!(ap(Lg2, sub, true), -inf);
    assert_eq!(ap(Lg2, sub, false), -141.0);
    assert_eq!(ap(Rsqrt, -sub, true), -inf);
    // tanh passes subnormals through
    assert_eq!(ap(Tanh, sub, false), sub);
}

#[test]
fn approx_half_types() {
    // ex2/tanh on f16 and bf16: within half an ulp of the type (their ISA
    // bounds are 2^-9.9/2^-7 relative for ex2, 2^-10.987/2^-8 for tanh).
    for ty in [FloatTy::F16, FloatTy::Bf16] {
        let f = fm(ty);
        let rel = if ty == FloatTy::F16 {
            2f64.powi(-11)
        } else {
            2f64.powi(-8)
        };
        for h in 0..=0xffffu64 {
            if f.is_nan(h) || f.is_inf(h) {
                continue;
            }
            let x = val(ty, h);
            let want = (x * std::f64::consts::LN_2).exp();
            let r = approx(ApproxOp::Ex2, ty, h, false);
            let rv = val(ty, r);
            let max = val(ty, f.inf() - 1);
            let min_normal = val(ty, 1 << f.man);
            if want > max * (1.0 + rel) {
                assert!(f.is_inf(r), "{ty:?} ex2({x})");
            } else if want >= min_normal {
                assert!(
                    (rv - want).abs() <= rel * want,
                    "{ty:?} ex2({x}) = {rv}, want {want}"
                );
            }
            let e = (2.0 * x).exp_m1();
            let want = if x.abs() > 20.0 {
                x.signum()
            } else {
                e / (e + 2.0)
            };
            let rv = val(ty, approx(ApproxOp::Tanh, ty, h, false));
            if want.abs() >= min_normal {
                assert!(
                    (rv - want).abs() <= rel * want.abs(),
                    "{ty:?} tanh({x}) = {rv}"
                );
            }
        }
    }
}

#[test]
fn rcp_rsqrt_approx_ftz_f64() {
    let hi = |x: f64| x.to_bits() & 0xffff_ffff_0000_0000;
    let rcp = |x: f64| frcp(FloatTy::F64, d(x), Precision::Approx, true);
    let rsq = |x: f64| approx(ApproxOp::Rsqrt, FloatTy::F64, d(x), true);
    let canon = 0x7fff_ffff_0000_0000u64;
    // the ISA's tables
    assert_eq!(rcp(f64::NEG_INFINITY), d(-0.0));
    assert_eq!(rcp(-1e-310), d(f64::NEG_INFINITY));
    assert_eq!(rcp(-0.0), d(f64::NEG_INFINITY));
    assert_eq!(rcp(0.0), d(f64::INFINITY));
    assert_eq!(rcp(1e-310), d(f64::INFINITY));
    assert_eq!(rcp(f64::INFINITY), d(0.0));
    assert_eq!(rcp(f64::NAN), canon);
    assert_eq!(
        frcp(FloatTy::F64, 0xfff8_0000_0000_1234, Precision::Approx, true),
        canon
    );
    assert_eq!(rsq(f64::NEG_INFINITY), canon);
    assert_eq!(rsq(-1.0), canon);
    assert_eq!(rsq(-1e-310), d(f64::NEG_INFINITY));
    assert_eq!(rsq(-0.0), d(f64::NEG_INFINITY));
    assert_eq!(rsq(0.0), d(f64::INFINITY));
    assert_eq!(rsq(f64::INFINITY), d(0.0));
    // a result below the normals is flushed
    assert_eq!(rcp(1.5e308), d(0.0));
    // gross approximations of the upper word: low word zero, ~2^-20 relative
    let mut rng = Rng(110);
    for _ in 0..100_000 {
        let field = 1 + rng.below(0x7fe);
        let x = f64::from_bits((field << 52) | (rng.next() & 0x000f_ffff_ffff_ffff));
        let t = f64::from_bits(hi(x));
        let r = rcp(x);
        assert_eq!(r & 0xffff_ffff, 0);
        let want = 1.0 / t;
        if want >= f64::MIN_POSITIVE {
            assert!(
                (f64::from_bits(r) - want).abs() <= 2f64.powi(-20) * want,
                "rcp {x:e}"
            );
        }
        let r = rsq(x);
        assert_eq!(r & 0xffff_ffff, 0);
        let want = 1.0 / t.sqrt();
        assert!(
            (f64::from_bits(r) - want).abs() <= 2f64.powi(-20) * want,
            "rsqrt {x:e}"
        );
        // rsqrt.approx.f64 (no .ftz): full precision
        let full = f64::from_bits(approx(ApproxOp::Rsqrt, FloatTy::F64, d(x), false));
        assert!((full - 1.0 / x.sqrt()).abs() <= 2f64.powi(-50) / x.sqrt());
    }
}
