//! Hand-written PTX for instruction forms NVRTC's output for leangrad uses
//! rarely or not at all: carry chains, two-destination `setp` with a
//! predicate combination, recursion, generic addressing of shared and local
//! memory, bit-field operations, `set`/`slct`, votes, vector accesses,
//! signed narrow loads, 3-D grids.
// Index loops mirror the kernels' thread indices, which reads clearer here.
#![allow(clippy::needless_range_loop)]

mod ptx_common;
use ptx_common::*;

const HEADER: &str = ".version 8.0\n.target sm_80\n.address_size 64\n";

/// out[tid*W + k] addressing used by every kernel below: %rd9 = out + 8*W*tid.
fn kernel(name: &str, words: u32, body: &str) -> String {
    format!(
        ".visible .entry {name}(.param .u64 a, .param .u64 b, .param .u64 out)\n{{\n\
         .reg .pred %p<9>;\n.reg .b16 %rs<9>;\n.reg .b32 %r<40>;\n.reg .b64 %rd<40>;\n\
         ld.param.u64 %rd1, [a];\nld.param.u64 %rd2, [b];\nld.param.u64 %rd3, [out];\n\
         mov.u32 %r1, %tid.x;\nmul.wide.u32 %rd4, %r1, 8;\nadd.s64 %rd5, %rd1, %rd4;\n\
         add.s64 %rd6, %rd2, %rd4;\nld.global.u64 %rd7, [%rd5];\nld.global.u64 %rd8, [%rd6];\n\
         mul.wide.u32 %rd9, %r1, {};\nadd.s64 %rd9, %rd3, %rd9;\n{body}\nret;\n}}\n",
        8 * words
    )
}

fn run(ptx: &str, name: &str, a: &[u64], b: &[u64], words: usize) -> Vec<u64> {
    let mut d = Dev::text(&format!("{HEADER}{ptx}"));
    let n = a.len();
    let aa = d.upload(&a.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>());
    let ba = d.upload(&b.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>());
    let out = d.zeros(8 * words * n);
    d.launch(name, 1, n as u32, &[p64(aa), p64(ba), p64(out)])
        .unwrap();
    to_i64(&d.download(out, 8 * words * n))
        .into_iter()
        .map(|x| x as u64)
        .collect()
}

fn inputs() -> (Vec<u64>, Vec<u64>) {
    let mut rng = Rng(21);
    let mut a: Vec<u64> = (0..64).map(|_| rng.next()).collect();
    let mut b: Vec<u64> = (0..64).map(|_| rng.next() >> (rng.next() % 64)).collect();
    a[0] = u64::MAX;
    b[0] = 1;
    a[1] = 0;
    b[1] = u64::MAX;
    a[2] = 0xffff_ffff;
    b[2] = 0xffff_ffff;
    (a, b)
}

#[test]
fn carry_chains() {
    let body = "
        mov.b64 {%r2, %r3}, %rd7;
        mov.b64 {%r4, %r5}, %rd8;
        add.cc.u32 %r6, %r2, %r4;
        addc.u32 %r7, %r3, %r5;
        mov.b64 %rd10, {%r6, %r7};
        st.global.u64 [%rd9], %rd10;
        sub.cc.u32 %r6, %r2, %r4;
        subc.u32 %r7, %r3, %r5;
        mov.b64 %rd10, {%r6, %r7};
        st.global.u64 [%rd9+8], %rd10;
        mad.lo.cc.u32 %r6, %r2, %r4, 0;
        madc.hi.u32 %r7, %r2, %r4, 0;
        mov.b64 %rd10, {%r6, %r7};
        st.global.u64 [%rd9+16], %rd10;
        add.cc.u32 %r8, %r2, %r4;
        addc.cc.u32 %r9, %r3, %r5;
        addc.u32 %r10, 0, 0;
        cvt.u64.u32 %rd11, %r10;
        st.global.u64 [%rd9+24], %rd11;
        sub.cc.u32 %r8, %r2, %r4;
        subc.cc.u32 %r9, %r3, %r5;
        subc.u32 %r10, 0, 0;
        cvt.u64.u32 %rd11, %r10;
        st.global.u64 [%rd9+32], %rd11;
        mad.lo.cc.u32 %r8, %r2, %r4, %r3;
        madc.hi.cc.u32 %r9, %r2, %r4, %r5;
        addc.u32 %r10, 0, 0;
        mov.b64 %rd12, {%r8, %r9};
        st.global.u64 [%rd9+40], %rd12;
        cvt.u64.u32 %rd11, %r10;
        st.global.u64 [%rd9+48], %rd11;";
    let (a, b) = inputs();
    let got = run(&kernel("carry", 7, body), "carry", &a, &b, 7);
    for i in 0..a.len() {
        let (x, y) = (a[i], b[i]);
        let (xl, xh, yl, yh) = (x & 0xffff_ffff, x >> 32, y & 0xffff_ffff, y >> 32);
        let p = xl * yl;
        let t = p as u128 + ((yh as u128) << 32 | xh as u128);
        let want = [
            x.wrapping_add(y),
            x.wrapping_sub(y),
            p,
            ((x as u128 + y as u128) >> 64) as u64,
            if y > x { 0xffff_ffff } else { 0 },
            t as u64,
            (t >> 64) as u64,
        ];
        assert_eq!(&got[7 * i..7 * i + 7], &want, "i={i} a={x:#x} b={y:#x}");
    }
}

#[test]
fn predicates_with_two_destinations_and_combination() {
    let body = "
        cvt.u32.u64 %r2, %rd7;
        cvt.u32.u64 %r3, %rd8;
        setp.gt.s32 %p1, %r2, 0;
        setp.lt.and.s32 %p2|%p3, %r2, %r3, %p1;
        setp.ge.or.u32 %p4, %r2, %r3, !%p1;
        xor.pred %p5, %p2, %p4;
        not.pred %p6, %p5;
        selp.u64 %rd10, 1, 0, %p2;
        selp.u64 %rd11, 2, 0, %p3;
        selp.u64 %rd12, 4, 0, %p4;
        selp.u64 %rd13, 8, 0, %p6;
        or.b64 %rd10, %rd10, %rd11;
        or.b64 %rd10, %rd10, %rd12;
        or.b64 %rd10, %rd10, %rd13;
        st.global.u64 [%rd9], %rd10;
        @!%p1 bra SKIP;
        st.global.u64 [%rd9], 99;
        SKIP:";
    let (a, b) = inputs();
    let got = run(&kernel("preds", 1, body), "preds", &a, &b, 1);
    for i in 0..a.len() {
        let (x, y) = (a[i] as u32 as i32, b[i] as u32 as i32);
        let p1 = x > 0;
        let (p2, p3) = ((x < y) && p1, (x >= y) && p1);
        let p4 = (x as u32 >= y as u32) || !p1;
        let p6 = !(p2 ^ p4);
        let want = if p1 {
            99
        } else {
            p2 as u64 | (p3 as u64) << 1 | (p4 as u64) << 2 | (p6 as u64) << 3
        };
        assert_eq!(got[i], want, "i={i} x={x} y={y}");
    }
}

#[test]
fn bit_fields_set_slct_votes_vectors_and_narrow_loads() {
    let body = "
        cvt.u32.u64 %r2, %rd7;
        cvt.u32.u64 %r3, %rd8;
        and.b32 %r4, %r3, 31;
        bfe.u32 %r5, %r2, %r4, 7;
        bfe.s32 %r6, %r2, %r4, 7;
        bfi.b32 %r7, %r3, %r2, %r4, 5;
        brev.b32 %r8, %r2;
        popc.b32 %r9, %r2;
        clz.b32 %r10, %r3;
        set.lt.u32.s32 %r11, %r2, %r3;
        slct.u32.s32 %r12, %r2, %r3, %r3;
        mov.b64 %rd10, {%r5, %r6};
        mov.b64 %rd11, {%r7, %r8};
        mov.b64 %rd12, {%r9, %r10};
        mov.b64 %rd13, {%r11, %r12};
        st.global.v2.u64 [%rd9], {%rd10, %rd11};
        st.global.v2.u64 [%rd9+16], {%rd12, %rd13};
        setp.ne.s32 %p1, %r9, 0;
        vote.sync.all.pred %p2, %p1, -1;
        vote.sync.any.pred %p3, %p1, -1;
        setp.gt.u32 %p4, %r9, 40;
        vote.sync.any.pred %p5, %p4, -1;
        selp.u32 %r13, 1, 0, %p2;
        selp.u32 %r14, 2, 0, %p3;
        selp.u32 %r15, 4, 0, %p5;
        add.s32 %r13, %r13, %r14;
        add.s32 %r13, %r13, %r15;
        ld.global.s8 %r16, [%rd5];
        ld.global.u8 %rs1, [%rd5+1];
        ld.global.v4.u16 {%rs2, %rs3, %rs4, %rs5}, [%rd5];
        cvt.u32.u16 %r17, %rs1;
        cvt.u32.u16 %r18, %rs5;
        mov.b32 %r19, {%rs2, %rs3};
        mov.b64 %rd14, {%r13, %r16};
        mov.b64 %rd15, {%r17, %r18};
        st.global.v2.u64 [%rd9+32], {%rd14, %rd15};
        cvt.u64.u32 %rd16, %r19;
        st.global.u64 [%rd9+48], %rd16;";
    let (a, b) = inputs();
    let got = run(&kernel("bits", 8, body), "bits", &a, &b, 8);
    for i in 0..a.len() {
        let (x, y) = (a[i] as u32, b[i] as u32);
        let pos = y & 31;
        let field = |signed: bool| {
            let mut v = 0u32;
            let sbit = if pos + 6 <= 31 {
                (x >> (pos + 6)) & 1
            } else {
                x >> 31
            };
            for k in 0..32 {
                let bit = if k < 7 && pos + k < 32 {
                    (x >> (pos + k)) & 1
                } else if signed {
                    sbit
                } else {
                    0
                };
                v |= bit << k;
            }
            v
        };
        let bfi = {
            let mut v = x;
            for k in 0..5 {
                if pos + k < 32 {
                    v = (v & !(1 << (pos + k))) | (((y >> k) & 1) << (pos + k));
                }
            }
            v
        };
        let pk = |lo: u32, hi: u32| lo as u64 | (hi as u64) << 32;
        // Votes are per warp.
        let warp = &a[i / 32 * 32..i / 32 * 32 + 32];
        let all = warp.iter().all(|&v| (v as u32).count_ones() != 0);
        let any40 = warp.iter().any(|&v| (v as u32).count_ones() > 40);
        let votes = all as u32 | 2 | (any40 as u32) << 2;
        let bytes = a[i].to_le_bytes();
        let h = |k: usize| u16::from_le_bytes([bytes[2 * k], bytes[2 * k + 1]]) as u32;
        let want = [
            pk(field(false), field(true)),
            pk(bfi, x.reverse_bits()),
            pk(x.count_ones(), y.leading_zeros()),
            pk(
                if (x as i32) < (y as i32) { !0 } else { 0 },
                if (y as i32) >= 0 { x } else { y },
            ),
            pk(votes, bytes[0] as i8 as i32 as u32),
            pk(bytes[1] as u32, h(3)),
            (h(0) | h(1) << 16) as u64,
        ];
        // (8 words per thread: the v2 stores need 16-byte alignment.)
        assert_eq!(&got[8 * i..8 * i + 7], &want, "i={i} x={x:#x} y={y:#x}");
    }
}

const RECURSION: &str = r#"
.func (.param .b32 r) fact(.param .b32 n)
{
    .reg .pred %p<2>;
    .reg .b32 %r<5>;
    ld.param.b32 %r1, [n];
    setp.le.s32 %p1, %r1, 1;
    @%p1 bra BASE;
    add.s32 %r2, %r1, -1;
    {
    .param .b32 arg;
    .param .b32 res;
    st.param.b32 [arg], %r2;
    call.uni (res), fact, (arg);
    ld.param.b32 %r3, [res];
    }
    mul.lo.s32 %r4, %r3, %r1;
    st.param.b32 [r], %r4;
    ret;
BASE:
    st.param.b32 [r], 1;
    ret;
}
.visible .entry rec(.param .u64 out)
{
    .reg .b32 %r<6>;
    .reg .b64 %rd<5>;
    mov.u32 %r1, %tid.x;
    rem.u32 %r2, %r1, 11;
    {
    .param .b32 a0;
    .param .b32 r0;
    st.param.b32 [a0], %r2;
    call.uni (r0), fact, (a0);
    ld.param.b32 %r3, [r0];
    }
    ld.param.u64 %rd1, [out];
    mul.wide.u32 %rd2, %r1, 4;
    add.s64 %rd3, %rd1, %rd2;
    st.global.u32 [%rd3], %r3;
    ret;
}
"#;

#[test]
fn recursive_calls_with_divergent_depths() {
    let mut d = Dev::text(&format!("{HEADER}{RECURSION}"));
    let out = d.zeros(4 * 64);
    d.launch("rec", 1, 64, &[p64(out)]).unwrap();
    let got = to_u32(&d.download(out, 256));
    for t in 0..64u32 {
        let want: u32 = (1..=(t % 11).max(1)).product();
        assert_eq!(got[t as usize], want, "t={t}");
    }
}

const GENERIC: &str = r#"
.visible .entry generic(.param .u64 out)
{
    .local .align 8 .b8 depot[64];
    .shared .align 8 .b8 sh[256];
    .reg .b32 %r<6>;
    .reg .b64 %rd<12>;
    mov.u32 %r1, %tid.x;
    mov.u64 %rd1, sh;
    cvta.shared.u64 %rd2, %rd1;
    mul.wide.u32 %rd3, %r1, 8;
    add.s64 %rd4, %rd2, %rd3;
    cvt.u64.u32 %rd5, %r1;
    mul.lo.s64 %rd5, %rd5, 3;
    st.u64 [%rd4], %rd5;
    bar.sync 0;
    xor.b32 %r2, %r1, 1;
    mul.wide.u32 %rd6, %r2, 8;
    add.s64 %rd7, %rd2, %rd6;
    ld.u64 %rd8, [%rd7];
    mov.u64 %rd9, depot;
    cvta.local.u64 %rd10, %rd9;
    st.u64 [%rd10+16], %rd8;
    ld.local.u64 %rd11, [depot+16];
    ld.param.u64 %rd1, [out];
    add.s64 %rd1, %rd1, %rd3;
    st.global.u64 [%rd1], %rd11;
    ret;
}
"#;

#[test]
fn generic_addresses_of_shared_and_local_memory() {
    let mut d = Dev::text(&format!("{HEADER}{GENERIC}"));
    let out = d.zeros(8 * 32);
    d.launch("generic", 1, 32, &[p64(out)]).unwrap();
    let got = to_i64(&d.download(out, 256));
    for t in 0..32 {
        assert_eq!(got[t], 3 * (t as i64 ^ 1), "t={t}");
    }
}

const GRID3: &str = r#"
.visible .entry grid3(.param .u64 out)
{
    .reg .b32 %r<20>;
    .reg .b64 %rd<5>;
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, %tid.y;
    mov.u32 %r3, %tid.z;
    mov.u32 %r4, %ctaid.x;
    mov.u32 %r5, %ctaid.y;
    mov.u32 %r6, %ntid.x;
    mov.u32 %r7, %ntid.y;
    mov.u32 %r8, %nctaid.x;
    mad.lo.s32 %r9, %r3, %r7, %r2;
    mad.lo.s32 %r9, %r9, %r6, %r1;
    mad.lo.s32 %r10, %r5, %r8, %r4;
    mul.lo.s32 %r11, %r6, %r7;
    mov.u32 %r12, %ntid.z;
    mul.lo.s32 %r11, %r11, %r12;
    mad.lo.s32 %r13, %r10, %r11, %r9;
    mad.lo.s32 %r14, %r2, 10, %r1;
    mad.lo.s32 %r14, %r3, 100, %r14;
    mad.lo.s32 %r14, %r4, 1000, %r14;
    mad.lo.s32 %r14, %r5, 10000, %r14;
    ld.param.u64 %rd1, [out];
    mul.wide.u32 %rd2, %r13, 4;
    add.s64 %rd3, %rd1, %rd2;
    st.global.u32 [%rd3], %r14;
    ret;
}
"#;

#[test]
fn three_dimensional_grids_and_blocks() {
    let mut d = Dev::text(&format!("{HEADER}{GRID3}"));
    let (grid, block) = ([2u32, 3, 1], [5u32, 3, 2]);
    let n = 6 * 30;
    let out = d.zeros(4 * n);
    d.launch3("grid3", grid, block, &[p64(out)]).unwrap();
    let got = to_u32(&d.download(out, 4 * n));
    let mut k = 0;
    for by in 0..3 {
        for bx in 0..2 {
            for z in 0..2 {
                for y in 0..3 {
                    for x in 0..5 {
                        assert_eq!(
                            got[k],
                            x + 10 * y + 100 * z + 1000 * bx + 10000 * by,
                            "k={k}"
                        );
                        k += 1;
                    }
                }
            }
        }
    }
}

const EXIT_THEN_BARRIER: &str = r#"
.visible .entry exit_barrier(.param .u64 out)
{
    .shared .align 4 .b8 sh[256];
    .reg .pred %p<2>;
    .reg .b32 %r<8>;
    .reg .b64 %rd<5>;
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, sh;
    shl.b32 %r3, %r1, 2;
    add.s32 %r4, %r2, %r3;
    st.shared.u32 [%r4], %r1;
    and.b32 %r5, %r1, 1;
    setp.ne.s32 %p1, %r5, 0;
    @%p1 ret;
    bar.sync 0;
    xor.b32 %r6, %r3, 4;
    add.s32 %r6, %r2, %r6;
    ld.shared.u32 %r7, [%r6];
    ld.param.u64 %rd1, [out];
    mul.wide.u32 %rd2, %r1, 4;
    add.s64 %rd3, %rd1, %rd2;
    st.global.u32 [%rd3], %r7;
    ret;
}
"#;

#[test]
fn exited_threads_count_as_arrived_at_barriers() {
    let mut d = Dev::text(&format!("{HEADER}{EXIT_THEN_BARRIER}"));
    // 48 threads: the second warp has 16 lanes, half of which exit.
    let out = d.upload(&[0xffu8; 4 * 48]);
    d.launch("exit_barrier", 2, 48, &[p64(out)]).unwrap();
    let got = to_u32(&d.download(out, 4 * 48));
    for t in 0..48u32 {
        let want = if t % 2 == 0 { t + 1 } else { 0xffff_ffff };
        assert_eq!(got[t as usize], want, "t={t}");
    }
}

#[test]
fn module_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<leangrad_gpusim::ptx::Module>();
}

const ATOM_F32: &str = r#"
.visible .entry atom_f32(.param .u64 p, .param .u64 q, .param .u32 v)
{
    .reg .f32 %f<4>;
    .reg .b64 %rd<3>;
    ld.param.u64 %rd1, [p];
    ld.param.u64 %rd2, [q];
    ld.param.f32 %f1, [v];
    atom.global.add.f32 %f2, [%rd1], %f1;
    red.global.add.f64 [%rd2], 0d0000000000000001;
    ret;
}
"#;

#[test]
fn atomic_f32_add_flushes_subnormals() {
    let mut d = Dev::text(&format!("{HEADER}{ATOM_F32}"));
    let p = d.upload(&f32s(&[0.0]));
    let q = d.zeros(8);
    let tiny = f32::from_bits(1); // subnormal
    d.launch("atom_f32", 1, 32, &[p64(p), p64(q), p32(tiny.to_bits())])
        .unwrap();
    // Without the flush the sum would be 32 * 2^-149.
    assert_eq!(to_f32(&d.download(p, 4))[0].to_bits(), 0);
    // f64 keeps subnormals: 32 lanes add the smallest one.
    assert_eq!(to_i64(&d.download(q, 8))[0], 32);
}

/// Each of 64 threads applies every atomic once with its own operand;
/// slots: 0 exch.b32, 1 min.s32, 2 max.u32, 3 and.b32, 4 xor.b32, 5 inc.u32,
/// 6 dec.u32, 7 cas.b32 (counter), 8-9 cas.b64, 10-11 min.u64; 12 shared
/// add.u32 read back after a barrier.
const ATOMS: &str = r#"
.visible .entry atoms(.param .u64 p, .param .u64 olds)
{
    .shared .align 4 .b8 sh[4];
    .reg .pred %p<3>;
    .reg .b32 %r<20>;
    .reg .b64 %rd<12>;
    ld.param.u64 %rd1, [p];
    ld.param.u64 %rd2, [olds];
    mov.u32 %r1, %tid.x;
    mul.lo.s32 %r2, %r1, 7919;
    xor.b32 %r2, %r2, 0x5a5a;
    sub.s32 %r3, 20, %r1;
    atom.global.exch.b32 %r4, [%rd1], %r1;
    atom.global.min.s32 %r5, [%rd1+4], %r3;
    atom.global.max.u32 %r6, [%rd1+8], %r2;
    atom.global.and.b32 %r7, [%rd1+12], %r2;
    atom.global.xor.b32 %r8, [%rd1+16], %r2;
    atom.global.inc.u32 %r9, [%rd1+20], 9;
    atom.global.dec.u32 %r10, [%rd1+24], 5;
CAS:
    ld.global.u32 %r11, [%rd1+28];
    add.s32 %r12, %r11, 1;
    atom.global.cas.b32 %r13, [%rd1+28], %r11, %r12;
    setp.ne.s32 %p1, %r13, %r11;
    @%p1 bra CAS;
    cvt.u64.u32 %rd3, %r1;
    atom.global.cas.b64 %rd4, [%rd1+32], 0, %rd3;
    mul.lo.s64 %rd5, %rd3, -3;
    atom.global.min.u64 %rd6, [%rd1+40], %rd5;
    setp.eq.s32 %p2, %r1, 0;
    @%p2 st.shared.u32 [sh], 100;
    bar.sync 0;
    atom.shared.add.u32 %r14, [sh], %r1;
    bar.sync 0;
    ld.shared.u32 %r15, [sh];
    st.global.u32 [%rd1+48], %r15;
    mul.wide.u32 %rd7, %r1, 4;
    add.s64 %rd8, %rd2, %rd7;
    st.global.u32 [%rd8], %r4;
    ret;
}
"#;

#[test]
fn atomics_in_lane_order() {
    let mut d = Dev::text(&format!("{HEADER}{ATOMS}"));
    let init: [u32; 13] = [77, 1000, 3, !0, 0, 7, 2, 0, 0, 0, u32::MAX, u32::MAX, 0];
    assert_eq!(
        (0..64u64).map(|t| t.wrapping_mul(3).wrapping_neg()).min(),
        Some(0)
    );
    let p = d.upload(
        &init
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect::<Vec<u8>>(),
    );
    let olds = d.zeros(4 * 64);
    d.launch("atoms", 1, 64, &[p64(p), p64(olds)]).unwrap();
    let got = to_u32(&d.download(p, 52));
    let v = |t: u32| (t.wrapping_mul(7919)) ^ 0x5a5a;
    let mut inc = 7u32;
    let mut dec = 2u32;
    for _ in 0..64 {
        inc = if inc >= 9 { 0 } else { inc + 1 };
        dec = if dec == 0 || dec > 5 { 5 } else { dec - 1 };
    }
    let want = [
        63,
        (0..64).map(|t| 20 - t).min().unwrap() as u32,
        (0..64).map(v).max().unwrap().max(3),
        (0..64).map(v).fold(!0, |a, b| a & b),
        (0..64).map(v).fold(0, |a, b| a ^ b),
        inc,
        dec,
        64,
        0, // cas.b64: thread 0 swaps 0 for 0, then nobody matches 0... (below)
        0,
        // min.u64 of -3t: thread 0's 0 is below the initial all-ones.
        0,
        0,
        100 + (0..64).sum::<u32>(),
    ];
    // cas.b64: every thread compares with 0; thread 0 writes 0, thread 1
    // then finds 0 and writes 1, after which no one matches.
    let mut want = want;
    want[8] = 1;
    assert_eq!(got, want);
    // exch returns the previous value in lane order: 77, then 0, 1, 2, …
    let olds = to_u32(&d.download(olds, 256));
    assert_eq!(olds[0], 77);
    assert!((1..64).all(|t| olds[t] == t as u32 - 1), "{olds:?}");
}
