//! Half-precision PTX (tests/cuda/half.cu and hand-written PTX): packed
//! `.f16x2`/`.bf16x2` arithmetic bit-exact against host references
//! rounding once to nearest even, comparisons of halves and half pairs
//! (`set`/`setp`), cuda_fp16.h's transcendentals (whose inline PTX writes
//! `.reg.b32 t;`), and `prmt.b32` in every mode.
// Index loops mirror the kernels' thread indices, which reads clearer here.
#![allow(clippy::needless_range_loop)]

mod ptx_common;
use half::{bf16, f16};
use ptx_common::*;

fn u32s(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Interesting half bit patterns: zeros, subnormals, normals, infinities, NaN.
fn specials(bf: bool) -> Vec<u16> {
    if bf {
        vec![
            0x0000, 0x8000, 0x0001, 0x3f80, 0xbf80, 0x7f80, 0xff80, 0x7fc0, 0x4049,
        ]
    } else {
        vec![
            0x0000, 0x8000, 0x0001, 0x03ff, 0x3c00, 0xbc00, 0x7c00, 0xfc00, 0x7e00, 0x7bff,
        ]
    }
}

/// Random half pairs of moderate magnitude mixed with the specials.
fn pairs(rng: &mut Rng, n: usize, bf: bool) -> Vec<u32> {
    let sp = specials(bf);
    (0..n)
        .map(|i| {
            let mut h = |k: usize| -> u16 {
                if (i + k).is_multiple_of(5) {
                    sp[rng.next() as usize % sp.len()]
                } else {
                    let v = rng.unit() * 6.0;
                    if bf {
                        bf16::from_f64(v).to_bits()
                    } else {
                        f16::from_f64(v).to_bits()
                    }
                }
            };
            h(0) as u32 | (h(1) as u32) << 16
        })
        .collect()
}

/// A half's value.
fn val(h: u16, bf: bool) -> f64 {
    if bf {
        bf16::from_bits(h).to_f64()
    } else {
        f16::from_bits(h).to_f64()
    }
}

/// `v` rounded once to the half type; NaN is the canonical NaN.
fn round(v: f64, bf: bool) -> u16 {
    if v.is_nan() {
        0x7fff
    } else if bf {
        bf16::from_f64(v).to_bits()
    } else {
        f16::from_f64(v).to_bits()
    }
}

fn is_nan(h: u16, bf: bool) -> bool {
    h & 0x7fff > if bf { 0x7f80 } else { 0x7c00 }
}

/// min/max of halves: a NaN operand gives the other; -0 < +0.
fn minmax(x: u16, y: u16, bf: bool, max: bool) -> u16 {
    match (is_nan(x, bf), is_nan(y, bf)) {
        (true, true) => 0x7fff,
        (true, false) => y,
        (false, true) => x,
        _ => {
            let (a, b) = (val(x, bf), val(y, bf));
            let key = |h: u16, v: f64| (v, h & 0x8000 == 0);
            let x_first = key(x, a) < key(y, b);
            if x_first != max {
                x
            } else {
                y
            }
        }
    }
}

/// The eight results of half2_arith / bf162_arith for one half.
fn half_ref(x: u16, y: u16, z: u16, bf: bool) -> [u16; 8] {
    let (a, b, c) = (val(x, bf), val(y, bf), val(z, bf));
    [
        round(a + b, bf),
        round(a - b, bf),
        round(a * b, bf),
        round(a.mul_add(b, c), bf),
        // neg/abs pass a NaN through unchanged (the simulator's choice,
        // see crate::numeric).
        if is_nan(x, bf) { x } else { x ^ 0x8000 },
        if is_nan(x, bf) { x } else { x & 0x7fff },
        minmax(x, y, bf, false),
        minmax(x, y, bf, true),
    ]
}

fn run_pair_arith(kernel: &str, bf: bool) {
    let mut d = Dev::fixture("half.ptx");
    let n = 512;
    let mut rng = Rng(if bf { 5 } else { 9 });
    let (a, b, c) = (
        pairs(&mut rng, n, bf),
        pairs(&mut rng, n, bf),
        pairs(&mut rng, n, bf),
    );
    let (aa, ba, ca) = (
        d.upload(&u32s(&a)),
        d.upload(&u32s(&b)),
        d.upload(&u32s(&c)),
    );
    let out = d.zeros(4 * 8 * n);
    d.launch(
        kernel,
        (n / 128) as u32,
        128,
        &[p32(n as u32), p64(aa), p64(ba), p64(ca), p64(out)],
    )
    .unwrap();
    let got = to_u32(&d.download(out, 4 * 8 * n));
    for i in 0..n {
        let lo = half_ref(a[i] as u16, b[i] as u16, c[i] as u16, bf);
        let hi = half_ref(
            (a[i] >> 16) as u16,
            (b[i] >> 16) as u16,
            (c[i] >> 16) as u16,
            bf,
        );
        for k in 0..8 {
            let want = lo[k] as u32 | (hi[k] as u32) << 16;
            assert_eq!(
                got[8 * i + k],
                want,
                "{kernel} op {k} a {:#010x} b {:#010x} c {:#010x}",
                a[i],
                b[i],
                c[i]
            );
        }
    }
}

#[test]
fn f16x2_arithmetic_is_bit_exact() {
    run_pair_arith("half2_arith", false);
}

#[test]
fn bf16x2_arithmetic_is_bit_exact() {
    run_pair_arith("bf162_arith", true);
}

#[test]
fn half_and_half2_comparisons() {
    let mut d = Dev::fixture("half.ptx");
    let n = 256;
    let mut rng = Rng(21);
    let a = pairs(&mut rng, n, false);
    let mut b = pairs(&mut rng, n, false);
    for i in (0..n).step_by(3) {
        b[i] = a[i]
            ^ if i.is_multiple_of(2) {
                0
            } else {
                0xffff_0000 & b[i]
            }; // equal low halves
    }
    let (aa, ba) = (d.upload(&u32s(&a)), d.upload(&u32s(&b)));
    let out = d.zeros(4 * 8 * n);
    d.launch(
        "half_cmp",
        (n / 64) as u32,
        64,
        &[p32(n as u32), p64(aa), p64(ba), p64(out)],
    )
    .unwrap();
    let got = to_u32(&d.download(out, 4 * 8 * n));
    let f = |h: u32| f16::from_bits(h as u16).to_f32();
    for i in 0..n {
        let (xl, yl, xh, yh) = (f(a[i]), f(b[i]), f(a[i] >> 16), f(b[i] >> 16));
        let un = |x: f32, y: f32| x.is_nan() || y.is_nan();
        let bits = [
            xl == yl,
            xl != yl && !un(xl, yl),
            xl < yl,
            xl <= yl,
            xl > yl,
            xl >= yl,
            xl.is_nan(),
            xl == yl || un(xl, yl),
            xl < yl || un(xl, yl),
            xl >= yl || un(xl, yl),
        ];
        let want0 = bits
            .iter()
            .enumerate()
            .fold(0, |s, (k, &t)| s | (t as u32) << k);
        let want1 = ((xl == yl && xh == yh) as u32)
            | ((xl < yl && xh < yh) as u32) << 1
            | (((xl >= yl || un(xl, yl)) && (xh >= yh || un(xh, yh))) as u32) << 2;
        let pair = |lo: bool, hi: bool, one: u32| (lo as u32 * one) | (hi as u32 * one) << 16;
        let want = [
            want0,
            want1,
            pair(xl == yl, xh == yh, 0x3c00),
            pair(xl < yl, xh < yh, 0x3c00),
            pair(xl > yl || un(xl, yl), xh > yh || un(xh, yh), 0x3c00),
            pair(xl == yl, xh == yh, 0xffff),
            pair(xl < yl, xh < yh, 0xffff),
            minmax(a[i] as u16, b[i] as u16, false, true) as u32,
        ];
        assert_eq!(
            &got[8 * i..8 * i + 8],
            &want,
            "a {:#010x} b {:#010x}",
            a[i],
            b[i]
        );
    }
}

#[test]
fn cuda_fp16_transcendentals_are_close() {
    let mut d = Dev::fixture("half.ptx");
    let n = 400;
    let x: Vec<u16> = (0..n)
        .map(|i| f16::from_f64(-7.9 + 15.8 * i as f64 / n as f64 + 1e-3).to_bits())
        .collect();
    let xa = d.upload(&x.iter().flat_map(|h| h.to_le_bytes()).collect::<Vec<u8>>());
    let out = d.zeros(2 * 8 * n);
    d.launch("half_math", 4, 100, &[p32(n as u32), p64(xa), p64(out)])
        .unwrap();
    let got = to_u16(&d.download(out, 2 * 8 * n));
    for i in 0..n {
        let v = f16::from_bits(x[i]).to_f64();
        let want = [
            v.exp(),
            v.abs().sqrt(),
            v.abs().ln(),
            v.sin(),
            v.cos(),
            v.exp2(),
            1.0 / v.abs().sqrt(),
            1.0 / v,
        ];
        for k in 0..8 {
            let g = f16::from_bits(got[8 * i + k]).to_f64();
            let w = want[k];
            if w.abs() > 65504.0 {
                assert!(g.is_infinite() || g.abs() >= 32768.0, "op {k} x {v}: {g}");
                continue;
            }
            // Two half ulps at the exact value, or 1e-3 near zero.
            let ulp = f16::from_f64(w.abs()).to_f64().max(6.1e-5) * 2f64.powi(-10);
            let tol = (2.0 * ulp).max(1e-3 * (k == 3 || k == 4) as u8 as f64);
            assert!((g - w).abs() <= tol, "op {k} x {v}: got {g}, exact {w}");
        }
    }
}

#[test]
fn byte_perm_of_the_cuda_api() {
    let mut d = Dev::fixture("half.ptx");
    let n = 256;
    let mut rng = Rng(77);
    let a: Vec<u32> = (0..n).map(|_| rng.next() as u32).collect();
    let b: Vec<u32> = (0..n).map(|_| rng.next() as u32).collect();
    // Selector nibbles 0-7 (bit 3 clear: the plain byte pick).
    let s: Vec<u32> = (0..n).map(|_| rng.next() as u32 & 0x7777).collect();
    let (aa, ba, sa) = (
        d.upload(&u32s(&a)),
        d.upload(&u32s(&b)),
        d.upload(&u32s(&s)),
    );
    let out = d.zeros(4 * n);
    d.launch(
        "byte_perm",
        4,
        64,
        &[p32(n as u32), p64(aa), p64(ba), p64(sa), p64(out)],
    )
    .unwrap();
    let got = to_u32(&d.download(out, 4 * n));
    for i in 0..n {
        let bytes = (b[i] as u64) << 32 | a[i] as u64;
        let want = (0..4).fold(0u32, |r, k| {
            let sel = s[i] >> (4 * k) & 7;
            r | ((bytes >> (8 * sel)) as u32 & 0xff) << (8 * k)
        });
        assert_eq!(got[i], want, "a {:#x} b {:#x} s {:#x}", a[i], b[i], s[i]);
    }
}

const HEADER: &str = ".version 8.0\n.target sm_80\n.address_size 64\n";

/// `prmt.b32<mode> d, a, b, c` per thread over arrays a, b, c.
fn prmt_kernel(mode: &str) -> String {
    format!(
        "{HEADER}.visible .entry k(.param .u64 x, .param .u64 out)\n{{\n\
         .reg.b32 %r<8>;\n.reg .b64 %rd<8>;\n\
         ld.param.u64 %rd1, [x];\nld.param.u64 %rd2, [out];\n\
         mov.u32 %r1, %tid.x;\nmul.wide.u32 %rd3, %r1, 12;\nadd.s64 %rd4, %rd1, %rd3;\n\
         ld.global.u32 %r2, [%rd4];\nld.global.u32 %r3, [%rd4+4];\nld.global.u32 %r4, [%rd4+8];\n\
         prmt.b32{mode} %r5, %r2, %r3, %r4;\n\
         mul.wide.u32 %rd5, %r1, 4;\nadd.s64 %rd6, %rd2, %rd5;\n\
         st.global.u32 [%rd6], %r5;\nret;\n}}\n"
    )
}

#[test]
fn prmt_every_mode_matches_the_isa_tables() {
    // The ISA's tables: source byte of d.b3 d.b2 d.b1 d.b0 per c[1:0].
    let tables: [(&str, [[u32; 4]; 4]); 6] = [
        (
            ".f4e",
            [[3, 2, 1, 0], [4, 3, 2, 1], [5, 4, 3, 2], [6, 5, 4, 3]],
        ),
        (
            ".b4e",
            [[5, 6, 7, 0], [6, 7, 0, 1], [7, 0, 1, 2], [0, 1, 2, 3]],
        ),
        (
            ".rc8",
            [[0, 0, 0, 0], [1, 1, 1, 1], [2, 2, 2, 2], [3, 3, 3, 3]],
        ),
        (
            ".ecl",
            [[3, 2, 1, 0], [3, 2, 1, 1], [3, 2, 2, 2], [3, 3, 3, 3]],
        ),
        (
            ".ecr",
            [[0, 0, 0, 0], [1, 1, 1, 0], [2, 2, 1, 0], [3, 2, 1, 0]],
        ),
        (
            ".rc16",
            [[1, 0, 1, 0], [3, 2, 3, 2], [1, 0, 1, 0], [3, 2, 3, 2]],
        ),
    ];
    let mut rng = Rng(31);
    let n = 64;
    let mut x = Vec::new();
    for _ in 0..n {
        // c with random upper bits: only c[1:0] counts in these modes.
        x.extend([rng.next() as u32, rng.next() as u32, rng.next() as u32]);
    }
    let bytes = |i: usize| (x[3 * i + 1] as u64) << 32 | x[3 * i] as u64;
    for (mode, table) in tables {
        let mut d = Dev::text(&prmt_kernel(mode));
        let xa = d.upload(&u32s(&x));
        let out = d.zeros(4 * n);
        d.launch("k", 1, n as u32, &[p64(xa), p64(out)]).unwrap();
        let got = to_u32(&d.download(out, 4 * n));
        for i in 0..n {
            let row = table[(x[3 * i + 2] & 3) as usize];
            let want = (0..4).fold(0u32, |r, k| {
                r | ((bytes(i) >> (8 * row[3 - k])) as u32 & 0xff) << (8 * k)
            });
            assert_eq!(got[i], want, "prmt{mode} c {:#x}", x[3 * i + 2]);
        }
    }
    // Default mode with the sign-replicating selector bit 3.
    let mut d = Dev::text(&prmt_kernel(""));
    let xa = d.upload(&u32s(&x));
    let out = d.zeros(4 * n);
    d.launch("k", 1, n as u32, &[p64(xa), p64(out)]).unwrap();
    let got = to_u32(&d.download(out, 4 * n));
    for i in 0..n {
        let c = x[3 * i + 2];
        let want = (0..4).fold(0u32, |r, k| {
            let sel = c >> (4 * k) & 0xf;
            let byte = (bytes(i) >> (8 * (sel & 7))) as u32 & 0xff;
            let byte = if sel & 8 == 0 {
                byte
            } else if byte & 0x80 != 0 {
                0xff
            } else {
                0
            };
            r | byte << (8 * k)
        });
        assert_eq!(got[i], want, "prmt c {c:#x}");
    }
}

#[test]
fn setp_on_half_pairs_sets_two_predicates() {
    let ptx = format!(
        "{HEADER}.visible .entry k(.param .u64 x, .param .u64 out)\n{{\n\
         .reg .pred %p<3>;\n.reg .b32 %r<8>;\n.reg .b64 %rd<8>;\n\
         ld.param.u64 %rd1, [x];\nld.param.u64 %rd2, [out];\n\
         mov.u32 %r1, %tid.x;\nmul.wide.u32 %rd3, %r1, 8;\nadd.s64 %rd4, %rd1, %rd3;\n\
         ld.global.u32 %r2, [%rd4];\nld.global.u32 %r3, [%rd4+4];\n\
         setp.ltu.f16x2 %p1|%p2, %r2, %r3;\nselp.u32 %r4, 1, 0, %p1;\nselp.u32 %r5, 2, 0, %p2;\n\
         or.b32 %r6, %r4, %r5;\nmul.wide.u32 %rd5, %r1, 4;\nadd.s64 %rd6, %rd2, %rd5;\n\
         st.global.u32 [%rd6], %r6;\nret;\n}}\n"
    );
    let mut d = Dev::text(&ptx);
    let mut rng = Rng(4);
    let n = 64;
    let x: Vec<u32> = pairs(&mut rng, 2 * n, false);
    let xa = d.upload(&u32s(&x));
    let out = d.zeros(4 * n);
    d.launch("k", 1, n as u32, &[p64(xa), p64(out)]).unwrap();
    let got = to_u32(&d.download(out, 4 * n));
    let f = |h: u32| f16::from_bits(h as u16).to_f32();
    for i in 0..n {
        let (a, b) = (x[2 * i], x[2 * i + 1]);
        let ltu = |x: f32, y: f32| x < y || x.is_nan() || y.is_nan();
        let want = ltu(f(a), f(b)) as u32 | (ltu(f(a >> 16), f(b >> 16)) as u32) << 1;
        assert_eq!(got[i], want, "a {a:#x} b {b:#x}");
    }
}
