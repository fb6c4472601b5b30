//! Tensor-core instructions (tests/cuda/mma.cu): every `mma.sync` form's
//! fragment mapping and arithmetic against a host reference (exact
//! products summed in f64 after C, in k order, rounded once; integer sums
//! wrapped or saturated), `.tf32` truncation against `cvt.rna.tf32.f32`
//! rounding, `ldmatrix` and `stmatrix` in every form, and a tensor-core GEMM (cp.async + ldmatrix + mma) bit-exact
//! against a host GEMM with the same rounding; and the sanitizer's
//! reports of wrong uses (tests/cuda/mma_broken.cu).
// Index loops mirror the kernels' lane and matrix indices.
#![allow(clippy::needless_range_loop)]

mod ptx_common;
use leangrad_gpusim::ptx::FaultKind;
use ptx_common::*;

/// An f16's value (exact in f64).
fn f16_val(h: u16) -> f64 {
    let s = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
    let (e, f) = ((h >> 10 & 0x1f) as i32, (h & 0x3ff) as f64);
    match e {
        0 => s * f * 2f64.powi(-24),
        _ => s * (1.0 + f / 1024.0) * 2f64.powi(e - 15),
    }
}

/// A bf16's value.
fn bf16_val(h: u16) -> f64 {
    f32::from_bits((h as u32) << 16) as f64
}

/// A finite f64 rounded to f16 bits, to nearest even (overflow: infinity).
fn f16_of(x: f64) -> u16 {
    let sign = if x < 0.0 { 0x8000u16 } else { 0 };
    let a = x.abs();
    if a >= 65520.0 {
        return sign | 0x7c00;
    }
    let e = if a == 0.0 {
        -14
    } else {
        a.log2().floor().max(-14.0) as i32
    };
    let ulp = 2f64.powi(e - 10);
    let mut q = (a / ulp).round_ties_even() as u32;
    let mut e = e;
    if q == 2048 {
        q = 1024;
        e += 1;
    }
    if q < 1024 {
        return sign | q as u16; // subnormal (e = -14)
    }
    sign | (((e + 15) as u16) << 10) | (q - 1024) as u16
}

/// Random finite f16 bits of moderate range (a few subnormals).
fn rand_f16(rng: &mut Rng) -> u16 {
    let r = rng.next();
    let exp = if r.is_multiple_of(16) {
        0
    } else {
        8 + (r >> 8) % 14
    } as u16;
    (r as u16 & 0x8000) | exp << 10 | (r >> 20) as u16 & 0x3ff
}

/// Random finite bf16 bits.
fn rand_bf16(rng: &mut Rng) -> u16 {
    let r = rng.next();
    let exp = (110 + (r >> 8) % 30) as u16;
    (r as u16 & 0x8000) | exp << 7 | (r >> 20) as u16 & 0x7f
}

fn u16s(v: &[u16]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// D = C + A·B (A m × k, B k × n, C m × n row-major), each element summed
/// in f64 after C in k order, rounded once to f32.
fn mma_ref(m: usize, n: usize, k: usize, a: &[f64], b: &[f64], c: &[f64]) -> Vec<f32> {
    let mut d = vec![0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut acc = c[i * n + j];
            for kk in 0..k {
                acc += a[i * k + kk] * b[kk * n + j];
            }
            d[i * n + j] = acc as f32;
        }
    }
    d
}

/// An f32 as the tensor core reads a `.tf32` operand: low 13 bits dropped.
fn tf32_trunc(x: f32) -> f64 {
    f32::from_bits(x.to_bits() & !0x1fff) as f64
}

/// `cvt.rna.tf32.f32` computed in f64: 11 significant bits, ties away.
fn tf32_rna(x: f32) -> f64 {
    let x = x as f64;
    if x == 0.0 {
        return x;
    }
    let ulp = 2f64.powi(x.abs().log2().floor() as i32 - 10);
    (x / ulp).round() * ulp
}

fn assert_bits(got: &[f32], want: &[f32], what: &str) {
    for i in 0..want.len() {
        assert_eq!(got[i].to_bits(), want[i].to_bits(), "{what}: element {i}");
    }
}

/// Runs a one-warp mma kernel on A (16 × k), B (k × 8), C (16 × 8), returns D.
fn run_mma(name: &str, a: &[u8], b: &[u8], c: &[u8], extra: Option<u32>) -> Vec<f32> {
    let mut d = Dev::fixture("mma.ptx");
    let (aa, ba, ca) = (d.upload(a), d.upload(b), d.upload(c));
    let out = d.zeros(4 * 128);
    let mut params = vec![p64(aa), p64(ba), p64(ca), p64(out)];
    params.extend(extra.map(p32));
    d.launch(name, 1, 32, &params)
        .unwrap_or_else(|f| panic!("{name}: {f}"));
    to_f32(&d.download(out, 4 * 128))
}

#[test]
fn tf32_mma_truncates_raw_f32_and_takes_rounded_tf32() {
    let mut rng = Rng(5);
    for k in [8usize, 4] {
        let a: Vec<f32> = (0..16 * k).map(|_| rng.unit() as f32 * 3.0).collect();
        let b: Vec<f32> = (0..k * 8).map(|_| rng.unit() as f32).collect();
        let c: Vec<f32> = (0..128).map(|_| rng.unit() as f32).collect();
        let cw: Vec<f64> = c.iter().map(|&x| x as f64).collect();
        let tr = |v: &[f32]| v.iter().map(|&x| tf32_trunc(x)).collect::<Vec<_>>();
        let want = mma_ref(16, 8, k, &tr(&a), &tr(&b), &cw);
        let (ab, bb, cb) = (f32s(&a), f32s(&b), f32s(&c));
        let got = if k == 8 {
            run_mma("mma_tf32_k8", &ab, &bb, &cb, Some(0))
        } else {
            run_mma("mma_tf32_k4", &ab, &bb, &cb, None)
        };
        assert_bits(&got, &want, &format!("m16n8k{k} tf32, raw f32 inputs"));
        if k == 8 {
            let rn = |v: &[f32]| v.iter().map(|&x| tf32_rna(x)).collect::<Vec<_>>();
            let want_rna = mma_ref(16, 8, 8, &rn(&a), &rn(&b), &cw);
            let got = run_mma("mma_tf32_k8", &ab, &bb, &cb, Some(1));
            assert_bits(&got, &want_rna, "m16n8k8 tf32 after cvt.rna.tf32.f32");
            // Truncating and rounding differ: the test tells them apart.
            assert_ne!(want, want_rna);
        }
    }
}

#[test]
fn half_mma_fragments_and_sums() {
    let mut rng = Rng(9);
    for (name, k, bf) in [
        ("mma_f16_k16", 16usize, false),
        ("mma_bf16_k16", 16, true),
        ("mma_f16_k8", 8, false),
        ("mma_bf16_k8", 8, true),
    ] {
        let gen = |rng: &mut Rng| if bf { rand_bf16(rng) } else { rand_f16(rng) };
        let val = |h: u16| if bf { bf16_val(h) } else { f16_val(h) };
        let a: Vec<u16> = (0..16 * k).map(|_| gen(&mut rng)).collect();
        let b: Vec<u16> = (0..k * 8).map(|_| gen(&mut rng)).collect();
        let c: Vec<f32> = (0..128).map(|_| rng.unit() as f32).collect();
        let want = mma_ref(
            16,
            8,
            k,
            &a.iter().map(|&h| val(h)).collect::<Vec<_>>(),
            &b.iter().map(|&h| val(h)).collect::<Vec<_>>(),
            &c.iter().map(|&x| x as f64).collect::<Vec<_>>(),
        );
        let got = run_mma(name, &u16s(&a), &u16s(&b), &f32s(&c), None);
        assert_bits(&got, &want, name);
    }
}

#[test]
fn f16_accumulators_round_once_to_half() {
    let mut rng = Rng(21);
    let a: Vec<u16> = (0..256).map(|_| rand_f16(&mut rng)).collect();
    let b: Vec<u16> = (0..128).map(|_| rand_f16(&mut rng)).collect();
    let c: Vec<u16> = (0..128).map(|_| rand_f16(&mut rng)).collect();
    let v = |x: &[u16]| x.iter().map(|&h| f16_val(h)).collect::<Vec<_>>();
    let (av, bv, cv) = (v(&a), v(&b), v(&c));
    let mut d = Dev::fixture("mma.ptx");
    let (aa, ba, ca) = (
        d.upload(&u16s(&a)),
        d.upload(&u16s(&b)),
        d.upload(&u16s(&c)),
    );
    let out = d.zeros(256);
    d.launch(
        "mma_f16_k16_f16acc",
        1,
        32,
        &[p64(aa), p64(ba), p64(ca), p64(out)],
    )
    .unwrap();
    let got = to_u16(&d.download(out, 256));
    for i in 0..16 {
        for j in 0..8 {
            let mut acc = cv[i * 8 + j];
            for kk in 0..16 {
                acc += av[i * 16 + kk] * bv[kk * 8 + j];
            }
            assert_eq!(got[i * 8 + j], f16_of(acc), "D[{i}][{j}]");
        }
    }
}

#[test]
fn mma_special_values() {
    // Inf · 0 gives NaN (canonical), an infinite product wins, overflow of
    // the rounded sum gives infinity.
    let mut a = vec![0f32; 128];
    let mut b = vec![0f32; 64];
    let mut c = vec![0f32; 128];
    a[0] = f32::INFINITY; // row 0, k 0
    b[0] = 0.0; // k 0, column 0: NaN in D[0][0]
    b[1] = 2.0; // column 1: +inf in D[0][1]
    a[8] = 3.0e38; // row 1, k 0
    b[2] = 2.0; // D[1][2] = 6e38 overflows f32
    c[2 * 8 + 3] = -1.5; // D[2][3] = C
    let got = run_mma("mma_tf32_k8", &f32s(&a), &f32s(&b), &f32s(&c), Some(0));
    assert_eq!(got[0].to_bits(), 0x7fff_ffff);
    assert_eq!(got[1], f32::INFINITY);
    assert_eq!(got[8 + 2], f32::INFINITY);
    assert_eq!(got[2 * 8 + 3], -1.5);
}

/// What lane `l` receives in register `j` of an ldmatrix of the 32 × 8
/// array `s` (matrix j = rows 8j…8j+7).
fn ldmatrix_ref(s: &[u16], j: usize, l: usize, trans: bool) -> u32 {
    let at = |r: usize, c: usize| s[(8 * j + r) * 8 + c] as u32;
    let (g, t) = (l / 4, 2 * (l % 4));
    if trans {
        at(t, g) | at(t + 1, g) << 16
    } else {
        at(g, t) | at(g, t + 1) << 16
    }
}

#[test]
fn ldmatrix_distributes_rows_as_the_isa_says() {
    let mut rng = Rng(4);
    let s: Vec<u16> = (0..256).map(|_| rng.next() as u16).collect();
    let mut d = Dev::fixture("mma.ptx");
    let sa = d.upload(&u16s(&s));
    for (name, n, trans) in [
        ("ldmatrix_x1", 1, false),
        ("ldmatrix_x2", 2, false),
        ("ldmatrix_x4", 4, false),
        ("ldmatrix_x1_trans", 1, true),
        ("ldmatrix_x2_trans", 2, true),
        ("ldmatrix_x4_trans", 4, true),
        ("ldmatrix_generic", 4, false),
    ] {
        let out = d.zeros(4 * 32 * n);
        d.launch(name, 1, 32, &[p64(sa), p64(out)])
            .unwrap_or_else(|f| panic!("{name}: {f}"));
        let got = to_u32(&d.download(out, 4 * 32 * n));
        for l in 0..32 {
            for j in 0..n {
                let want = ldmatrix_ref(&s, j, l, trans);
                assert_eq!(got[l * n + j], want, "{name}: lane {l} register {j}");
            }
        }
    }
}

/// The GEMM of tc_gemm: each 16-deep k-step is one mma, the f32
/// accumulator plus the step's 16 exact products summed in f64, rounded
/// once.
fn gemm_ref(m: usize, n: usize, k: usize, a: &[f64], b: &[f64]) -> Vec<f32> {
    let mut c = vec![0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut acc = 0f32;
            for k0 in (0..k).step_by(16) {
                let mut s = acc as f64;
                for kk in k0..k0 + 16 {
                    s += a[i * k + kk] * b[kk * n + j];
                }
                acc = s as f32;
            }
            c[i * n + j] = acc;
        }
    }
    c
}

#[test]
fn tensor_core_gemm_with_async_copies_and_ldmatrix() {
    let mut rng = Rng(77);
    let mut d = Dev::fixture("mma.ptx");
    for (name, bf) in [("tc_gemm_f16", false), ("tc_gemm_bf16", true)] {
        let (m, n, k) = (64usize, 96usize, 80usize);
        let gen = |rng: &mut Rng| if bf { rand_bf16(rng) } else { rand_f16(rng) };
        let val = |h: u16| if bf { bf16_val(h) } else { f16_val(h) };
        let a: Vec<u16> = (0..m * k).map(|_| gen(&mut rng)).collect();
        let b: Vec<u16> = (0..k * n).map(|_| gen(&mut rng)).collect();
        let (aa, ba) = (d.upload(&u16s(&a)), d.upload(&u16s(&b)));
        let c = d.zeros(4 * m * n);
        let params = [
            p32(m as u32),
            p32(n as u32),
            p32(k as u32),
            p64(aa),
            p64(ba),
            p64(c),
        ];
        let grid = [(n / 32) as u32, (m / 32) as u32, 1];
        d.launch3(name, grid, [128, 1, 1], &params)
            .unwrap_or_else(|f| panic!("{name}: {f}"));
        let got = to_f32(&d.download(c, 4 * m * n));
        let av: Vec<f64> = a.iter().map(|&h| val(h)).collect();
        let bv: Vec<f64> = b.iter().map(|&h| val(h)).collect();
        assert_bits(&got, &gemm_ref(m, n, k, &av, &bv), name);
    }
}

fn broken(name: &str, block: u32, params: &[Vec<u8>]) -> leangrad_gpusim::ptx::Fault {
    let mut d = Dev::fixture("mma_broken.ptx");
    // Word l of x is l · 0x01010101: odd in odd lanes.
    let x: Vec<u8> = (0..1024).map(|i| (i / 4) as u8).collect();
    let xa = d.upload(&x);
    let out = d.zeros(1024);
    let mut p = params.to_vec();
    p.extend([p64(xa), p64(out)]);
    d.launch(name, 1, block, &p)
        .expect_err("the sanitizer must report this kernel")
}

#[test]
fn mma_and_ldmatrix_need_the_whole_warp() {
    let f = broken("mma_divergent", 32, &[]);
    assert_eq!(f.kind, FaultKind::DivergentBarrier, "{f}");
    assert!(f.detail.contains("not converged"), "{f}");
    assert!(f.instruction.contains("mma.sync"), "{f}");

    let f = broken("mma_after_exit", 32, &[p32(24)]);
    assert_eq!(f.kind, FaultKind::DivergentBarrier, "{f}");
    assert!(f.detail.contains("lanes 0xff000000 have exited"), "{f}");

    let f = broken("ldmatrix_divergent", 32, &[]);
    assert_eq!(f.kind, FaultKind::DivergentBarrier, "{f}");
    assert!(f.instruction.contains("ldmatrix"), "{f}");

    // A block of 16 threads: lanes 16–31 do not exist.
    let mut d = Dev::fixture("mma.ptx");
    let z = d.zeros(1024);
    let f = d
        .launch("mma_f16_k16", 1, 16, &[p64(z), p64(z), p64(z), p64(z)])
        .unwrap_err();
    assert_eq!(f.kind, FaultKind::DivergentBarrier, "{f}");
    assert!(f.detail.contains("do not exist"), "{f}");
}

#[test]
fn ldmatrix_rows_are_checked_as_shared_loads() {
    let f = broken("ldmatrix_rows", 32, &[p32(2), p32(1)]);
    assert_eq!(f.kind, FaultKind::Misaligned, "{f}");
    let f = broken("ldmatrix_rows", 32, &[p32(16), p32(1)]);
    assert_eq!(f.kind, FaultKind::OutOfBounds, "{f}");
    assert_eq!(f.thread, [31, 0, 0]);
    let f = broken("ldmatrix_rows", 32, &[p32(0), p32(0)]);
    assert_eq!(f.kind, FaultKind::Uninitialized, "{f}");

    let f = broken("ldmatrix_race", 64, &[]);
    assert_eq!(f.kind, FaultKind::SharedRace, "{f}");
    assert!(f.detail.contains("read after write"), "{f}");
    assert_eq!(f.thread, [32, 0, 0]);

    let f = broken("ldmatrix_before_wait", 32, &[]);
    assert_eq!(f.kind, FaultKind::SharedRace, "{f}");
    assert!(f.instruction.contains("ldmatrix"), "{f}");
    assert!(f.detail.contains("pending asynchronous copy"), "{f}");

    let f = broken("ldmatrix_global", 32, &[]);
    assert_eq!(f.kind, FaultKind::OutOfBounds, "{f}");
    assert!(f.detail.contains("not in shared memory"), "{f}");
}

/// A kernel of hand-written PTX around one line.
fn raw(body: &str) -> String {
    format!(
        ".version 8.0\n.target sm_80\n.address_size 64\n.visible .entry k()\n{{\n\
         .reg .b32 %r<16>;\n.reg .f32 %f<16>;\n.reg .b16 %h<4>;\n{body}\nret;\n}}\n"
    )
}

#[test]
fn unsupported_forms_are_load_errors() {
    let ok = [
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%f1,%f2,%f3,%f4}, \
         {%r1,%r2,%r3,%r4}, {%r5,%r6}, {%f1,%f2,%f3,%f4};",
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%f1,%f2,%f3,%f4}, \
         {%r1,%r2,%r3,%r4}, {%r5,%r6}, {0f00000000,%f2,%f3,%f4};",
        "ldmatrix.sync.aligned.m8n8.x2.trans.shared::cta.b16 {%r1,%r2}, [%r3];",
        "stmatrix.sync.aligned.m8n8.x4.shared.b16 [%r3], {%r1,%r2,%r3,%r4};",
        "mma.sync.aligned.m16n8k32.row.col.satfinite.s32.u8.u8.s32 {%r1,%r2,%r3,%r4}, \
         {%r1,%r2,%r3,%r4}, {%r5,%r6}, {%r1,%r2,%r3,%r4};",
        "cvt.rna.satfinite.tf32.f32 %r1, %f1;",
    ];
    for text in ok {
        Dev::text(&raw(text));
    }
    let bad = [
        // .col.row layouts, f16 accumulators with bf16 inputs, integer mma.
        "mma.sync.aligned.m16n8k16.col.row.f32.f16.f16.f32 {%f1,%f2,%f3,%f4}, \
         {%r1,%r2,%r3,%r4}, {%r5,%r6}, {%f1,%f2,%f3,%f4};",
        "mma.sync.aligned.m16n8k16.row.col.f16.bf16.bf16.f16 {%r1,%r2}, \
         {%r1,%r2,%r3,%r4}, {%r5,%r6}, {%r1,%r2};",
        "mma.sync.aligned.m8n8k16.row.col.s32.s8.s8.s32 {%r1,%r2}, \
         {%r1}, {%r5}, {%r1,%r2};",
        "mma.sync.aligned.m16n8k16.row.col.satfinite.f32.f16.f16.f32 {%f1,%f2,%f3,%f4}, \
         {%r1,%r2,%r3,%r4}, {%r5,%r6}, {%f1,%f2,%f3,%f4};",
        // Wrong register count.
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%f1,%f2,%f3,%f4}, \
         {%r1,%r2}, {%r5,%r6}, {%f1,%f2,%f3,%f4};",
        "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%r1,%r2}, [%r3];",
        "ldmatrix.sync.aligned.m16n16.x1.trans.shared.b8 {%r1,%r2}, [%r3];",
        "cvt.rn.tf32.f32 %r1, %f1;",
        "stmatrix.sync.aligned.m16n8.x1.trans.shared.b8 [%r3], {%r1};",
    ];
    for text in bad {
        let mut mem = leangrad_gpusim::memory::DeviceMemory::new(1 << 20);
        let e = leangrad_gpusim::ptx::Module::load(&raw(text), &mut mem)
            .err()
            .unwrap_or_else(|| panic!("`{text}` loaded"));
        assert!(
            e.message.contains("unsupported") || e.message.contains("expected"),
            "{text}: {e}"
        );
    }
}

#[test]
fn cvt_rna_tf32_rounds_ties_away_and_satfinite_clamps() {
    let text = ".version 8.0\n.target sm_80\n.address_size 64\n\
        .visible .entry k(.param .u64 x, .param .u64 y)\n{\n\
        .reg .b32 %r<8>;\n.reg .f32 %f<2>;\n.reg .b64 %rd<8>;\n\
        ld.param.u64 %rd1, [x];\nld.param.u64 %rd2, [y];\n\
        mov.u32 %r1, %tid.x;\nmul.wide.u32 %rd3, %r1, 4;\nadd.s64 %rd4, %rd1, %rd3;\n\
        ld.global.f32 %f1, [%rd4];\n\
        cvt.rna.tf32.f32 %r2, %f1;\ncvt.rna.satfinite.tf32.f32 %r3, %f1;\n\
        mul.wide.u32 %rd5, %r1, 8;\nadd.s64 %rd6, %rd2, %rd5;\n\
        st.global.v2.b32 [%rd6], {%r2, %r3};\nret;\n}\n";
    let cases: [(u32, u32, u32); 9] = [
        (0x3f80_1000, 0x3f80_2000, 0x3f80_2000), // 1 + 2^-11: a tie, away from zero
        (0xbf80_1000, 0xbf80_2000, 0xbf80_2000), // its negative
        (0x3f80_0fff, 0x3f80_0000, 0x3f80_0000), // just below the tie
        (0x3f80_3000, 0x3f80_4000, 0x3f80_4000), // a tie above an odd mantissa
        (0x0000_1000, 0x0000_2000, 0x0000_2000), // a subnormal tie
        (0x7f7f_ffff, 0x7f80_0000, 0x7f7f_e000), // rounds past the largest
        (0xff80_0000, 0xff80_0000, 0xff7f_e000), // -inf
        (0x7fc0_1234, 0x7fff_ffff, 0x7fff_ffff), // NaN: canonical
        (0x8000_0000, 0x8000_0000, 0x8000_0000), // -0
    ];
    let mut d = Dev::text(text);
    let x: Vec<u8> = cases.iter().flat_map(|c| c.0.to_le_bytes()).collect();
    let xa = d.upload(&x);
    let out = d.zeros(8 * cases.len());
    d.launch("k", 1, cases.len() as u32, &[p64(xa), p64(out)])
        .unwrap();
    let got = to_u32(&d.download(out, 8 * cases.len()));
    for (i, &(x, rna, sat)) in cases.iter().enumerate() {
        assert_eq!(got[2 * i], rna, "cvt.rna.tf32.f32 {x:#010x}");
        assert_eq!(got[2 * i + 1], sat, "cvt.rna.satfinite.tf32.f32 {x:#010x}");
    }
}

/// D = C + A·B on integers (A 16 × k, B k × 8 bytes; signedness per
/// operand), exact.
fn imma_ref(k: usize, a: &[u8], a_s: bool, b: &[u8], b_s: bool, c: &[i32]) -> Vec<i64> {
    let v = |x: u8, s: bool| if s { x as i8 as i64 } else { x as i64 };
    let mut d = vec![0i64; 128];
    for i in 0..16 {
        for j in 0..8 {
            let mut acc = c[i * 8 + j] as i64;
            for kk in 0..k {
                acc += v(a[i * k + kk], a_s) * v(b[kk * 8 + j], b_s);
            }
            d[i * 8 + j] = acc;
        }
    }
    d
}

#[test]
fn integer_mma_fragments_wrap_and_satfinite() {
    let mut rng = Rng(31);
    let mut d = Dev::fixture("mma.ptx");
    for (name, k, a_s, b_s, sat) in [
        ("mma_s8_u8_k32", 32usize, true, false, false),
        ("mma_s8_s8_k32_sat", 32, true, true, true),
        ("mma_u8_s8_k16", 16, false, true, false),
    ] {
        let a: Vec<u8> = (0..16 * k).map(|_| rng.next() as u8).collect();
        let b: Vec<u8> = (0..k * 8).map(|_| rng.next() as u8).collect();
        // Some accumulators near the s32 limits, so sums overflow.
        let c: Vec<i32> = (0..128)
            .map(|i| match i % 4 {
                0 => i32::MAX - (rng.next() % 1000) as i32,
                1 => i32::MIN + (rng.next() % 1000) as i32,
                _ => rng.next() as i32 >> 8,
            })
            .collect();
        let want = imma_ref(k, &a, a_s, &b, b_s, &c);
        let (aa, ba, ca) = (d.upload(&a), d.upload(&b), d.upload(&i32s(&c)));
        let out = d.zeros(4 * 128);
        d.launch(name, 1, 32, &[p64(aa), p64(ba), p64(ca), p64(out)])
            .unwrap_or_else(|f| panic!("{name}: {f}"));
        let got = to_u32(&d.download(out, 4 * 128));
        let mut overflowed = 0;
        for i in 0..128 {
            let w = want[i];
            overflowed += (w != w as i32 as i64) as u32;
            let expect = if sat {
                w.clamp(i32::MIN as i64, i32::MAX as i64) as i32
            } else {
                w as i32 // two's complement wrap
            };
            assert_eq!(got[i] as i32, expect, "{name}: element {i} (exact {w})");
        }
        assert!(overflowed > 0, "{name}: no sum overflowed");
    }
}

#[test]
fn stmatrix_is_the_inverse_of_ldmatrix() {
    // Each lane holds values = its lane and register index; stmatrix writes
    // them to a 32 × 8 tile (row i at lane i's address), the tile is copied
    // out and compared with where ldmatrix would have read each value.
    for (num, trans) in [
        (1usize, false),
        (2, false),
        (4, false),
        (1, true),
        (4, true),
    ] {
        let regs = (0..num)
            .map(|j| format!("%r{}", 10 + j))
            .collect::<Vec<_>>();
        let fill = (0..num)
            .map(|j| {
                format!(
                    "mad.lo.u32 %r{}, %r1, 65537, {};\n",
                    10 + j,
                    0x0100_0100 * j
                )
            })
            .collect::<String>();
        let text = format!(
            ".version 8.0\n.target sm_90\n.address_size 64\n\
             .visible .entry k(.param .u64 out)\n{{\n\
             .reg .b32 %r<16>;\n.reg .b64 %rd<8>;\n.reg .b16 %h<2>;\n\
             .shared .align 16 .b8 s[512];\n\
             ld.param.u64 %rd1, [out];\nmov.u32 %r1, %tid.x;\n\
             mov.u32 %r2, s;\nmad.lo.u32 %r3, %r1, 16, %r2;\n\
             {fill}\
             mov.u32 %r5, 0;\nst.shared.v4.u32 [%r3], {{%r5, %r5, %r5, %r5}};\n\
             bar.warp.sync -1;\n\
             stmatrix.sync.aligned.m8n8.x{num}{}.shared.b16 [%r3], {{{}}};\n\
             bar.warp.sync -1;\n\
             ld.shared.v4.u32 {{%r6, %r7, %r8, %r9}}, [%r3];\n\
             mul.wide.u32 %rd2, %r1, 16;\nadd.s64 %rd3, %rd1, %rd2;\n\
             st.global.v4.u32 [%rd3], {{%r6, %r7, %r8, %r9}};\nret;\n}}\n",
            if trans { ".trans" } else { "" },
            regs.join(", ")
        );
        let mut d = Dev::text(&text);
        let out = d.zeros(512);
        d.launch("k", 1, 32, &[p64(out)])
            .unwrap_or_else(|f| panic!("x{num} trans {trans}: {f}"));
        let tile = to_u16(&d.download(out, 512));
        for j in 0..num {
            for l in 0..32 {
                // Lane l's register j is (lane + 256 j) in both halves.
                let v = (l + 256 * j) as u32 * 65537;
                let want = ldmatrix_ref(&tile, j, l, trans);
                assert_eq!(want, v, "x{num} trans {trans}: lane {l} register {j}");
            }
        }
        // Rows of matrices not stored stay 0.
        assert!(tile[8 * 8 * num..].iter().all(|&h| h == 0));
    }
}

#[test]
fn stmatrix_rows_are_checked_as_shared_stores() {
    let kernel = |addr: &str, guard: &str| {
        format!(
            ".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry k()\n{{\n\
             .reg .b32 %r<8>;\n.reg .pred %p<2>;\n.shared .align 16 .b8 s[512];\n\
             mov.u32 %r1, %tid.x;\nmov.u32 %r2, s;\n{addr}\n\
             setp.lt.u32 %p1, %r1, 16;\n\
             {guard}stmatrix.sync.aligned.m8n8.x1.shared.b16 [%r3], {{%r1}};\nret;\n}}\n"
        )
    };
    // Lanes 0–7 all name row 0: their different rows collide.
    let mut d = Dev::text(&kernel("mov.u32 %r3, %r2;", ""));
    let f = d.launch("k", 1, 32, &[]).unwrap_err();
    assert_eq!(f.kind, FaultKind::SharedRace, "{f}");
    assert!(f.detail.contains("write after write"), "{f}");
    // Executed by half of the warp.
    let mut d = Dev::text(&kernel("mad.lo.u32 %r3, %r1, 16, %r2;", "@%p1 "));
    let f = d.launch("k", 1, 32, &[]).unwrap_err();
    assert_eq!(f.kind, FaultKind::DivergentBarrier, "{f}");
    assert!(f.instruction.contains("stmatrix"), "{f}");
}
