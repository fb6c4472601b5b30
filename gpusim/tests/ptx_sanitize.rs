//! The always-on sanitizer: deliberately broken kernels (tests/cuda/broken.cu
//! and hand-written PTX) must fail with the right fault, naming the kernel,
//! the thread, the instruction and the allocation involved.

mod ptx_common;
use leangrad_gpusim::memory::DeviceMemory;
use leangrad_gpusim::ptx::{FaultKind, Module};
use ptx_common::*;

#[test]
fn off_by_one_store_is_out_of_bounds() {
    let mut d = Dev::fixture("broken.ptx");
    let out = d.zeros(4 * 100);
    let f = d
        .launch("off_by_one", 1, 128, &[p32(100), p64(out)])
        .unwrap_err();
    assert_eq!(f.kind, FaultKind::OutOfBounds);
    assert_eq!(f.thread, [100, 0, 0]);
    assert_eq!(f.address, Some(out + 400));
    let msg = f.to_string();
    assert!(
        msg.contains("off_by_one") && msg.contains("st.global"),
        "{msg}"
    );
    assert!(
        msg.contains(&format!(
            "0 bytes past the end of allocation {out:#x} (400 bytes)"
        )),
        "{msg}"
    );
}

#[test]
fn read_of_unwritten_global_memory() {
    let mut d = Dev::fixture("broken.ptx");
    let x = d.mem.alloc(4 * 64).unwrap();
    d.mem.write(x, &[0u8; 4 * 40]).unwrap(); // elements 40.. never written
    let out = d.zeros(4 * 64);
    let f = d
        .launch("copy_f32", 1, 64, &[p32(64), p64(x), p64(out)])
        .unwrap_err();
    assert_eq!(f.kind, FaultKind::Uninitialized);
    assert_eq!(f.thread, [40, 0, 0]);
    assert_eq!(f.address, Some(x + 160));
    let msg = f.to_string();
    assert!(
        msg.contains("copy_f32")
            && msg.contains("ld.global")
            && msg.contains(&format!("allocation {x:#x}")),
        "{msg}"
    );
}

#[test]
fn host_pointer_and_use_after_free() {
    let mut d = Dev::fixture("broken.ptx");
    let out = d.zeros(4 * 32);
    let f = d
        .launch(
            "copy_f32",
            1,
            32,
            &[p32(32), p64(0x7ffd_1234_0000), p64(out)],
        )
        .unwrap_err();
    assert_eq!(f.kind, FaultKind::OutOfBounds);
    assert!(f.to_string().contains("not a device address"), "{f}");
    let x = d.zeros(4 * 32);
    d.mem.free(x).unwrap();
    let f = d
        .launch("copy_f32", 1, 32, &[p32(32), p64(x), p64(out)])
        .unwrap_err();
    assert_eq!(f.kind, FaultKind::OutOfBounds);
    assert!(f.to_string().contains("use after free"), "{f}");
}

#[test]
fn shared_memory_race_without_barrier() {
    let mut d = Dev::fixture("broken.ptx");
    let out = d.zeros(4 * 64);
    let f = d.launch("shared_race", 1, 64, &[p64(out)]).unwrap_err();
    assert_eq!(f.kind, FaultKind::SharedRace);
    let msg = f.to_string();
    assert!(msg.contains("shared_race") && msg.contains("race"), "{msg}");
}

#[test]
fn barrier_in_divergent_code() {
    let mut d = Dev::fixture("broken.ptx");
    let out = d.zeros(4 * 64);
    let f = d
        .launch("divergent_barrier", 1, 64, &[p64(out)])
        .unwrap_err();
    assert_eq!(f.kind, FaultKind::DivergentBarrier);
    assert!(f.to_string().contains("bar.sync"), "{f}");
}

#[test]
fn misaligned_load() {
    let mut d = Dev::fixture("broken.ptx");
    let p = d.zeros(4 * 40);
    let out = d.zeros(4 * 32);
    let f = d
        .launch("misaligned", 1, 32, &[p64(p), p64(out)])
        .unwrap_err();
    assert_eq!(f.kind, FaultKind::Misaligned);
    assert_eq!(f.address, Some(p + 1));
    assert!(f.to_string().contains(&format!("allocation {p:#x}")), "{f}");
}

#[test]
fn read_of_unwritten_shared_memory() {
    let mut d = Dev::fixture("broken.ptx");
    let out = d.zeros(4 * 64);
    let f = d.launch("shared_uninit", 1, 64, &[p64(out)]).unwrap_err();
    assert_eq!(f.kind, FaultKind::Uninitialized);
    assert_eq!(f.thread, [32, 0, 0]);
    assert!(f.to_string().contains("shared memory never written"), "{f}");
    // With 32 threads every element read was written: no fault.
    d.launch("shared_uninit", 1, 32, &[p64(out)]).unwrap();
}

#[test]
fn trap_names_its_thread() {
    let mut d = Dev::fixture("broken.ptx");
    let out = d.zeros(4 * 32);
    let f = d.launch("traps", 1, 32, &[p64(out)]).unwrap_err();
    assert_eq!(f.kind, FaultKind::Trap);
    assert_eq!(f.thread, [5, 0, 0]);
}

#[test]
fn wrong_parameter_sizes_fail_the_launch() {
    let mut d = Dev::fixture("broken.ptx");
    let out = d.zeros(4 * 32);
    let f = d.launch("traps", 1, 32, &[p32(out as u32)]).unwrap_err();
    assert_eq!(f.kind, FaultKind::Trap);
    assert!(f.to_string().contains("parameter 0 has 4 bytes"), "{f}");
}

const HEADER: &str = ".version 8.0\n.target sm_80\n.address_size 64\n";

/// Every thread stores 1 into the same shared word, then reads it back.
const SAME_VALUE: &str = r#"
.visible .entry same_value(.param .u64 out)
{
    .shared .align 4 .b8 s[4];
    .reg .b32 %r<4>;
    .reg .b64 %rd<4>;
    mov.u32 %r1, 1;
    st.shared.u32 [s], %r1;
    bar.sync 0;
    ld.shared.u32 %r2, [s];
    ld.param.u64 %rd1, [out];
    mov.u32 %r3, %tid.x;
    mul.wide.u32 %rd2, %r3, 4;
    add.s64 %rd3, %rd1, %rd2;
    st.global.u32 [%rd3], %r2;
    ret;
}
"#;

#[test]
fn same_value_writes_race_only_across_instructions() {
    let mut d = Dev::text(&format!("{HEADER}{SAME_VALUE}"));
    let out = d.zeros(4 * 64);
    // One warp: the lanes write the same value in one instruction — no race.
    d.launch("same_value", 1, 32, &[p64(out)]).unwrap();
    assert_eq!(to_u32(&d.download(out, 128)), vec![1; 32]);
    // Two warps write the same word in two executions: a race, even though
    // the value is the same.
    let f = d.launch("same_value", 1, 64, &[p64(out)]).unwrap_err();
    assert_eq!(f.kind, FaultKind::SharedRace);
    assert_eq!(f.thread, [32, 0, 0]);
    assert!(
        f.to_string()
            .contains("(write after write) with thread (31,0,0)"),
        "{f}"
    );
    assert!(f.to_string().contains("inside `s`"), "{f}");
}

#[test]
fn unsupported_instructions_fail_at_load() {
    let text = format!(
        "{HEADER}.visible .entry k(.param .u64 p)\n{{\n.reg .b32 %r<3>;\nmov.u32 %r1, 0;\n\
         fns.b32 %r2, %r1, 0, 1;\nret;\n}}\n"
    );
    let mut mem = DeviceMemory::new(1 << 20);
    let e = Module::load(&text, &mut mem).err().expect("must not load");
    assert_eq!(e.line, 8);
    assert!(
        e.message.contains("unsupported instruction `fns.b32"),
        "{e}"
    );
    // A type the operation does not support, and a bad modifier.
    for bad in [
        "add.f32.u32 %r1, %r1, %r1;",
        "and.s32 %r1, %r1, 1;",
        "mul.wide.u64 %r1, %r1, %r1;",
        "ld.const.u32 %r1, [%r1];",
    ] {
        let text = format!("{HEADER}.visible .entry k()\n{{\n.reg .b32 %r<3>;\n{bad}\nret;\n}}\n");
        let e = Module::load(&text, &mut mem)
            .err()
            .unwrap_or_else(|| panic!("{bad} loaded"));
        assert!(e.message.contains("unsupported instruction"), "{bad}: {e}");
    }
    assert_eq!(mem.live_count(), 0);
}
