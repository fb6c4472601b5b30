//! Dynamic shared memory (`.extern .shared`, tests/cuda/dynsmem.cu), device
//! `assert` (`__assertfail`, tests/cuda/assert.cu), and load errors that
//! name the unsupported feature.
// Index loops mirror the kernels' thread indices, which reads clearer here.
#![allow(clippy::needless_range_loop)]

mod ptx_common;
use leangrad_gpusim::memory::DeviceMemory;
use leangrad_gpusim::ptx::{FaultKind, Module};
use ptx_common::*;

#[test]
fn bitonic_sort_in_dynamic_shared_memory() {
    let mut d = Dev::fixture("dynsmem.ptx");
    let mut rng = Rng(12);
    for n in [32usize, 256, 1024] {
        let blocks = 3;
        let x: Vec<f32> = (0..n * blocks).map(|_| rng.unit() as f32).collect();
        let xa = d.upload(&f32s(&x));
        let out = d.zeros(4 * n * blocks);
        d.launch_dyn(
            "bitonic_sort",
            blocks as u32,
            n as u32,
            4 * n as u32,
            &[p64(xa), p64(out)],
        )
        .unwrap();
        let got = to_f32(&d.download(out, 4 * n * blocks));
        for b in 0..blocks {
            let mut want = x[b * n..(b + 1) * n].to_vec();
            want.sort_by(f32::total_cmp);
            assert_eq!(&got[b * n..(b + 1) * n], &want[..], "n {n} block {b}");
        }
        // Too little dynamic memory: the first access past it is a fault.
        let f = d
            .launch_dyn(
                "bitonic_sort",
                1,
                n as u32,
                4 * n as u32 - 4,
                &[p64(xa), p64(out)],
            )
            .unwrap_err();
        assert_eq!(f.kind, FaultKind::OutOfBounds);
        assert_eq!(f.thread, [n as u32 - 1, 0, 0]);
        assert!(f.to_string().contains("keys (dynamic"), "{f}");
    }
}

#[test]
fn scan_with_static_and_dynamic_shared_memory() {
    let mut d = Dev::fixture("dynsmem.ptx");
    let n = 128usize;
    let blocks = 4;
    let x: Vec<i32> = (0..n * blocks).map(|i| (i as i32 * 7) % 13 - 6).collect();
    let xa = d.upload(&i32s(&x));
    let out = d.zeros(4 * n * blocks);
    let totals = d.zeros(4 * blocks);
    d.launch_dyn(
        "block_scan",
        blocks as u32,
        n as u32,
        8 * n as u32,
        &[p64(xa), p64(out), p64(totals)],
    )
    .unwrap();
    let got = to_u32(&d.download(out, 4 * n * blocks));
    let tot = to_u32(&d.download(totals, 4 * blocks));
    for b in 0..blocks {
        let mut acc = 0i32;
        for t in 0..n {
            assert_eq!(got[b * n + t] as i32, acc, "block {b} thread {t}");
            acc += x[b * n + t];
        }
        assert_eq!(tot[b] as i32, acc, "block {b} total");
    }
}

#[test]
fn dynamic_shared_memory_is_bounded_by_the_launch() {
    let mut d = Dev::fixture("dynsmem.ptx");
    let out = d.zeros(4);
    // 32 ints written, a launch of 256 bytes: element 40 was never written,
    // element 64 is past the end.
    d.launch_dyn("dyn_read", 1, 32, 256, &[p32(31), p64(out)])
        .unwrap();
    assert_eq!(to_u32(&d.download(out, 4)), [31]);
    let f = d
        .launch_dyn("dyn_read", 1, 32, 256, &[p32(40), p64(out)])
        .unwrap_err();
    assert_eq!(f.kind, FaultKind::Uninitialized);
    let f = d
        .launch_dyn("dyn_read", 1, 32, 256, &[p32(64), p64(out)])
        .unwrap_err();
    assert_eq!(f.kind, FaultKind::OutOfBounds);
    assert!(
        f.to_string().contains("outside the block's 256 bytes"),
        "{f}"
    );
    // No dynamic memory at all: the kernel's first store faults.
    let f = d
        .launch_dyn("dyn_read", 1, 32, 0, &[p32(0), p64(out)])
        .unwrap_err();
    assert_eq!(f.kind, FaultKind::OutOfBounds);
    assert_eq!(f.thread, [0, 0, 0]);
}

#[test]
fn failing_device_assert_reports_message_file_line_and_function() {
    let mut d = Dev::fixture("assert.ptx");
    let n = 64;
    let x: Vec<i32> = (0..n).map(|i| 100 + i).collect();
    let mut y: Vec<i32> = (0..n).map(|i| 1 + i % 5).collect();
    let (xa, ya) = (d.upload(&i32s(&x)), d.upload(&i32s(&y)));
    let out = d.zeros(4 * n as usize);
    d.launch(
        "checked_div",
        1,
        64,
        &[p32(n as u32), p64(xa), p64(ya), p64(out)],
    )
    .unwrap();
    let got = to_u32(&d.download(out, 4 * n as usize));
    assert!((0..n as usize).all(|i| got[i] as i32 == x[i] / y[i]));
    y[37] = 0;
    y[39] = 0;
    let ya = d.upload(&i32s(&y));
    let f = d
        .launch(
            "checked_div",
            1,
            64,
            &[p32(n as u32), p64(xa), p64(ya), p64(out)],
        )
        .unwrap_err();
    assert_eq!(f.kind, FaultKind::Assert);
    assert_eq!(f.thread, [37, 0, 0]);
    let msg = f.to_string();
    for part in [
        "assert.cu:7: ",
        "checked_div",
        "Assertion `y[i] != 0 && \"division by zero\"` failed.",
        "thread: [37,0,0]",
        "1 more lanes",
        "__assertfail",
    ] {
        assert!(msg.contains(part), "{part:?} not in {msg}");
    }
}

const HEADER: &str = ".version 8.0\n.target sm_80\n.address_size 64\n";

#[test]
fn unsupported_features_name_themselves() {
    let mut mem = DeviceMemory::new(1 << 20);
    let body = ".visible .entry k()\n{\nret;\n}\n";
    for (decl, want) in [
        (".global .texref t;", "texture references are not supported"),
        (".extern .global .b8 g[];", "external `.global` variables"),
        (".const .align 4 .b8 c[16];", "constant memory"),
        (
            ".extern .func (.param .b32 r) vprintf (.param .b64 f, .param .b64 a);",
            "printf (`vprintf`) is not supported",
        ),
        (
            ".extern .func ext (.param .b64 a);",
            "calls outside the module are not supported",
        ),
        (".surfref s;", "surface references are not supported"),
    ] {
        let text = format!("{HEADER}{decl}\n{body}");
        let e = Module::load(&text, &mut mem)
            .err()
            .unwrap_or_else(|| panic!("{decl} loaded"));
        assert!(e.message.contains(want), "{decl}: {e}");
        assert!(!e.message.contains("unsupported directive .extern"), "{e}");
    }
    assert_eq!(mem.live_count(), 0);
}
