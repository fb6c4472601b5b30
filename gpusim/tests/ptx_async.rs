//! Asynchronous copies (tests/cuda/async.cu): `cp.async` through
//! cuda_pipeline.h and inline PTX (src-size zero fill, ignore-src),
//! `commit_group`/`wait_group`/`wait_all` group accounting, a
//! double-buffered copy and a tiled matmul staged through shared memory;
//! and the sanitizer's reports of wrong uses (tests/cuda/async_broken.cu).
// Index loops mirror the kernels' thread indices, which reads clearer here.
#![allow(clippy::needless_range_loop)]

mod ptx_common;
use leangrad_gpusim::ptx::{Fault, FaultKind};
use ptx_common::*;

#[test]
fn double_buffered_copy_through_shared_memory() {
    let mut d = Dev::fixture("async.ptx");
    let mut rng = Rng(3);
    for (n, grid) in [(4096usize, 2u32), (1000, 3), (8, 1)] {
        let x: Vec<f32> = (0..n).map(|_| rng.unit() as f32).collect();
        let xa = d.upload(&f32s(&x));
        let out = d.zeros(4 * n);
        d.launch(
            "pipeline_double",
            grid,
            256,
            &[p32(n as u32), p64(xa), p64(out)],
        )
        .unwrap_or_else(|f| panic!("n {n}: {f}"));
        let got = to_f32(&d.download(out, 4 * n));
        for i in 0..n {
            assert_eq!(got[i], 2.0 * x[i], "n {n} element {i}");
        }
    }
}

/// The kernel's sum: f32 multiply then add (`--fmad=false`), in k order.
fn matmul_ref(m: usize, n: usize, k: usize, a: &[f32], b: &[f32]) -> Vec<f32> {
    let mut c = vec![0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut acc = 0f32;
            for kk in 0..k {
                acc += a[i * k + kk] * b[kk * n + j];
            }
            c[i * n + j] = acc;
        }
    }
    c
}

#[test]
fn tiled_matmul_staged_with_async_copies_and_zero_fill() {
    let mut d = Dev::fixture("async.ptx");
    let mut rng = Rng(11);
    for (m, n, k) in [(32usize, 48usize, 64usize), (19, 23, 37), (5, 7, 3)] {
        let a: Vec<f32> = (0..m * k).map(|_| rng.unit() as f32).collect();
        let b: Vec<f32> = (0..k * n).map(|_| rng.unit() as f32).collect();
        let (aa, ba) = (d.upload(&f32s(&a)), d.upload(&f32s(&b)));
        let c = d.zeros(4 * m * n);
        let grid = [n.div_ceil(16) as u32, m.div_ceil(16) as u32, 1];
        let params = [
            p32(m as u32),
            p32(n as u32),
            p32(k as u32),
            p64(aa),
            p64(ba),
            p64(c),
        ];
        d.launch3("async_matmul", grid, [16, 16, 1], &params)
            .unwrap_or_else(|f| panic!("{m}x{n}x{k}: {f}"));
        let got = to_f32(&d.download(c, 4 * m * n));
        let want = matmul_ref(m, n, k, &a, &b);
        for i in 0..m * n {
            assert_eq!(
                got[i].to_bits(),
                want[i].to_bits(),
                "{m}x{n}x{k} element {i}"
            );
        }
    }
}

#[test]
fn src_size_zero_fills_and_ignore_src_copies_zeros() {
    let mut d = Dev::fixture("async.ptx");
    let x: Vec<u8> = (0..512).map(|i| (i * 7 + 1) as u8).collect();
    let xa = d.upload(&x);
    let (o16, o8) = (d.zeros(512), d.zeros(256));
    d.launch("async_fill", 1, 32, &[p64(xa), p64(o16), p64(o8)])
        .unwrap();
    let (g16, g8) = (d.download(o16, 512), d.download(o8, 256));
    for t in 0..32 {
        for i in 0..16 {
            let want = if i < t % 17 { x[t * 16 + i] } else { 0 };
            assert_eq!(
                g16[t * 16 + i],
                want,
                "lane {t} byte {i} (src-size {})",
                t % 17
            );
        }
        for i in 0..8 {
            let want = if t % 3 == 0 { 0 } else { x[t * 8 + i] };
            assert_eq!(g8[t * 8 + i], want, "lane {t} byte {i} (ignore-src)");
        }
    }
}

#[test]
fn wait_group_completes_all_but_the_newest_groups() {
    let mut d = Dev::fixture("async.ptx");
    let x: Vec<i32> = (0..96).map(|i| i * 3 - 50).collect();
    let xa = d.upload(&i32s(&x));
    let out = d.zeros(4 * 96);
    d.launch("async_groups", 1, 32, &[p64(xa), p64(out)])
        .unwrap();
    assert_eq!(d.download(out, 4 * 96), i32s(&x));
}

/// Runs kernel `name` of async_broken.ptx on one block of 32 threads
/// (after `n`, when given, two buffers of 128 floats) and returns its fault.
fn broken(name: &str, n: Option<u32>) -> Fault {
    let mut d = Dev::fixture("async_broken.ptx");
    let x: Vec<f32> = (0..128).map(|i| i as f32).collect();
    let xa = d.upload(&f32s(&x));
    let out = d.zeros(4 * 128);
    let mut params = vec![p64(xa), p64(out)];
    if let Some(n) = n {
        params.insert(0, p32(n));
    }
    d.launch(name, 1, 32, &params)
        .expect_err("the sanitizer must report this kernel")
}

/// The PTX line of the first `text` in async_broken.ptx after the start of
/// kernel `name`.
fn line_of(name: &str, text: &str) -> usize {
    let src = std::fs::read_to_string(fixture("async_broken.ptx")).unwrap();
    let start = src.find(&format!(".entry {name}(")).unwrap();
    let at = start + src[start..].find(text).unwrap();
    src[..at].lines().count()
}

#[test]
fn reading_a_pending_destination_is_a_race_naming_the_copy() {
    let f = broken("read_before_wait", None);
    assert_eq!(f.kind, FaultKind::SharedRace, "{f}");
    assert!(f.instruction.contains("ld.shared"), "{f}");
    let cp = line_of("read_before_wait", "cp.async");
    assert!(f.detail.contains(&format!("cp.async at line {cp}")), "{f}");
    assert!(f.detail.contains("issued by this thread"), "{f}");
    assert_eq!(f.thread, [0, 0, 0]);

    // A barrier does not complete a copy: another thread's read still races.
    let f = broken("barrier_without_wait", None);
    assert_eq!(f.kind, FaultKind::SharedRace, "{f}");
    assert!(f.detail.contains("issued by thread (1,0,0)"), "{f}");
    assert!(f.detail.contains("pending asynchronous copy"), "{f}");

    // Data of the newest group, still in flight after wait_group 1.
    let f = broken("wait_too_shallow", None);
    assert_eq!(f.kind, FaultKind::SharedRace, "{f}");
    assert!(f.detail.contains("read of a pending"), "{f}");

    let f = broken("write_over_pending", None);
    assert_eq!(f.kind, FaultKind::SharedRace, "{f}");
    assert!(f.instruction.contains("st.shared"), "{f}");
    assert!(f.detail.contains("write over a pending"), "{f}");
}

#[test]
fn completed_copies_belong_to_the_issuing_thread() {
    // After its wait the copy is the issuer's write: other threads need a
    // barrier before reading it.
    let f = broken("wait_without_barrier", None);
    assert_eq!(f.kind, FaultKind::SharedRace, "{f}");
    assert!(f.detail.contains("read after write"), "{f}");
    assert!(f.detail.contains("thread (1,0,0)"), "{f}");
}

#[test]
fn copies_never_waited_for_are_reported_at_the_end_of_the_block() {
    let f = broken("never_waited", None);
    assert_eq!(f.kind, FaultKind::SharedRace, "{f}");
    assert!(f.detail.contains("never waited for"), "{f}");
    let cp = line_of("never_waited", "cp.async");
    assert!(f.instruction.starts_with(&format!("line {cp}:")), "{f}");

    let f = broken("never_committed", None);
    assert_eq!(f.kind, FaultKind::SharedRace, "{f}");
    assert!(f.detail.contains("never committed"), "{f}");
}

#[test]
fn copies_are_bounds_and_alignment_checked_at_issue() {
    // The source is read at issue, like ld.global.
    let f = broken("source_out_of_bounds", Some(128));
    assert_eq!(f.kind, FaultKind::OutOfBounds, "{f}");
    assert_eq!(f.thread, [16, 0, 0]);
    assert!(f.instruction.contains("cp.async"), "{f}");

    let f = broken("misaligned_destination", None);
    assert_eq!(f.kind, FaultKind::Misaligned, "{f}");
    assert!(f.detail.contains("shared destination"), "{f}");

    let f = broken("destination_out_of_bounds", None);
    assert_eq!(f.kind, FaultKind::OutOfBounds, "{f}");
    assert_eq!(f.thread, [8, 0, 0]);
}

#[test]
fn a_never_written_source_is_an_initcheck_fault() {
    let mut d = Dev::fixture("async_broken.ptx");
    let xa = d.mem.alloc(4 * 128).unwrap();
    let out = d.zeros(4 * 128);
    let f = d
        .launch("wait_without_barrier", 1, 32, &[p64(xa), p64(out)])
        .unwrap_err();
    assert_eq!(f.kind, FaultKind::Uninitialized, "{f}");
    assert!(f.instruction.contains("cp.async"), "{f}");
}

/// A kernel of hand-written PTX around one `cp.async` line.
fn raw(body: &str) -> String {
    format!(
        ".version 8.0\n.target sm_80\n.address_size 64\n\
         .visible .entry k(.param .u64 x, .param .u32 n)\n{{\n\
         .reg .b32 %r<8>;\n.reg .b64 %rd<4>;\n.reg .pred %p<2>;\n\
         .shared .align 16 .b8 s[64];\n\
         ld.param.u64 %rd1, [x];\nld.param.u32 %r1, [n];\nmov.u32 %r2, s;\n\
         {body}\nret;\n}}\n"
    )
}

#[test]
fn hand_written_forms_load_and_bad_ones_are_refused() {
    // cache hints and ::cta load; src-size above cp-size faults.
    let ok = raw(
        "cp.async.cg.shared::cta.global.L2::128B [%r2], [%rd1], 16, %r1;\n\
         cp.async.wait_all;",
    );
    let mut d = Dev::text(&ok);
    let xa = d.upload(&[7u8; 64]);
    d.launch("k", 1, 1, &[p64(xa), p32(16)]).unwrap();
    let f = d.launch("k", 1, 1, &[p64(xa), p32(17)]).unwrap_err();
    assert_eq!(f.kind, FaultKind::Trap, "{f}");
    assert!(f.detail.contains("src-size 17 exceeds cp-size 16"), "{f}");
    for bad in [
        "cp.async.cg.shared.global [%r2], [%rd1], 8;",
        "cp.async.ca.shared.global [%r2], [%rd1], 12;",
        "cp.async.ca.global.shared [%r2], [%rd1], 4;",
        "cp.async.mbarrier.arrive.shared.b64 [%r2];",
        "cp.async.wait_group %r1;",
    ] {
        let mut mem = leangrad_gpusim::memory::DeviceMemory::new(1 << 20);
        let e = leangrad_gpusim::ptx::Module::load(&raw(bad), &mut mem)
            .err()
            .unwrap_or_else(|| panic!("`{bad}` loaded"));
        assert!(e.message.contains("unsupported instruction"), "{bad}: {e}");
    }
}
