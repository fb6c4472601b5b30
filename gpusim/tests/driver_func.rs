//! Through the driver: dynamic shared memory above 48 KiB after
//! `cuFuncSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)`,
//! the opt-in limits `cuDeviceGetAttribute` reports, and a failing device
//! `assert` returned as `CUDA_ERROR_ASSERT`.

mod driver_common;
use driver_common::*;
use leangrad_gpusim::driver::api_device::*;
use leangrad_gpusim::driver::api_func::*;
use leangrad_gpusim::driver::api_module::*;
use leangrad_gpusim::driver::consts::*;
use std::ffi::{c_void, CString};
use std::ptr::null_mut;

fn load(fixture: &str) -> CUmodule {
    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".into());
    let text = std::fs::read_to_string(format!("{dir}/tests/fixtures/{fixture}")).unwrap();
    let text = CString::new(text).unwrap();
    let mut m = null_mut();
    let r = unsafe { cuModuleLoadData(&mut m, text.as_ptr().cast()) };
    assert_eq!(r, CUDA_SUCCESS, "{}", error_string(r));
    m
}

fn function(m: CUmodule, name: &str) -> CUfunction {
    let mut f = null_mut();
    let name = CString::new(name).unwrap();
    assert_eq!(
        unsafe { cuModuleGetFunction(&mut f, m, name.as_ptr()) },
        CUDA_SUCCESS
    );
    f
}

fn launch(f: CUfunction, block: u32, shared: u32, params: &mut [*mut c_void]) -> CUresult {
    unsafe {
        cuLaunchKernel(
            f,
            1,
            1,
            1,
            block,
            1,
            1,
            shared,
            null_mut(),
            params.as_mut_ptr(),
            null_mut(),
        )
    }
}

#[test]
fn dynamic_shared_memory_opt_in() {
    make_current();
    let mut optin = 0;
    let mut per_block = 0;
    unsafe {
        assert_eq!(cuDeviceGetAttribute(&mut optin, 97, 0), CUDA_SUCCESS);
        assert_eq!(cuDeviceGetAttribute(&mut per_block, 8, 0), CUDA_SUCCESS);
    }
    // compute 8.0 (the default): 163 KiB opt-in, 48 KiB without.
    assert_eq!((optin, per_block), (163 * 1024, 48 * 1024));
    let m = load("dynsmem.ptx");
    let f = function(m, "dyn_read");
    let out = alloc(4);
    let (mut i, mut o) = (5i32, out);
    let mut params = [
        (&mut i as *mut i32).cast::<c_void>(),
        (&mut o as *mut u64).cast(),
    ];
    let big = 100 * 1024;
    assert_eq!(launch(f, 32, big, &mut params), CUDA_ERROR_INVALID_VALUE);
    assert!(error_string(CUDA_ERROR_INVALID_VALUE).contains("MAX_DYNAMIC_SHARED_SIZE_BYTES"));
    let mut v = 0;
    unsafe {
        assert_eq!(
            cuFuncGetAttribute(&mut v, ATTR_MAX_DYNAMIC_SHARED, f),
            CUDA_SUCCESS
        );
        assert_eq!(v, 48 * 1024);
        assert_eq!(
            cuFuncSetAttribute(f, ATTR_MAX_DYNAMIC_SHARED, optin + 1),
            CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            cuFuncSetAttribute(f, ATTR_MAX_DYNAMIC_SHARED, big as i32),
            CUDA_SUCCESS
        );
        assert_eq!(
            cuFuncGetAttribute(&mut v, ATTR_MAX_DYNAMIC_SHARED, f),
            CUDA_SUCCESS
        );
        assert_eq!(v, big as i32);
    }
    assert_eq!(launch(f, 32, big, &mut params), CUDA_SUCCESS);
    assert_eq!(read(out, 4), 5u32.to_le_bytes());
    assert_eq!(
        launch(f, 32, big + 4, &mut params),
        CUDA_ERROR_INVALID_VALUE
    );
    // Past the launch's size: a fault at the next synchronisation.
    // SAFETY: params[0] points at `i`, alive for the whole test.
    unsafe { *params[0].cast::<i32>() = (big / 4) as i32 };
    assert_eq!(launch(f, 32, big, &mut params), CUDA_SUCCESS);
    let r = cuCtxSynchronize();
    assert_eq!(r, CUDA_ERROR_ILLEGAL_ADDRESS);
    assert!(
        error_string(r).contains("dyn (dynamic"),
        "{}",
        error_string(r)
    );
    assert_eq!(cuModuleUnload(m), CUDA_SUCCESS);
}

#[test]
fn failing_assert_is_cuda_error_assert() {
    make_current();
    let m = load("assert.ptx");
    let f = function(m, "checked_div");
    let n = 32usize;
    let (x, y, out) = (alloc(4 * n), alloc(4 * n), alloc(4 * n));
    let ys: Vec<u8> = (0..n as i32)
        .flat_map(|i| if i == 9 { 0 } else { i + 1 }.to_le_bytes())
        .collect();
    unsafe {
        use leangrad_gpusim::driver::api_memory::cuMemcpyHtoDAsync_v2;
        let xs = vec![1u8; 4 * n];
        assert_eq!(
            cuMemcpyHtoDAsync_v2(x, xs.as_ptr().cast(), 4 * n, null_mut()),
            CUDA_SUCCESS
        );
        assert_eq!(
            cuMemcpyHtoDAsync_v2(y, ys.as_ptr().cast(), 4 * n, null_mut()),
            CUDA_SUCCESS
        );
    }
    let (mut nn, mut xp, mut yp, mut op) = (n as i32, x, y, out);
    let mut params = [
        (&mut nn as *mut i32).cast::<c_void>(),
        (&mut xp as *mut u64).cast(),
        (&mut yp as *mut u64).cast(),
        (&mut op as *mut u64).cast(),
    ];
    assert_eq!(launch(f, 32, 0, &mut params), CUDA_SUCCESS);
    let r = cuCtxSynchronize();
    assert_eq!(r, CUDA_ERROR_ASSERT);
    let e = error_string(r);
    assert!(e.starts_with("device-side assert triggered"), "{e}");
    assert!(
        e.contains("assert.cu:7: void checked_div(int") && e.contains("thread: [9,0,0]"),
        "{e}"
    );
    assert_eq!(cuCtxSynchronize(), CUDA_SUCCESS);
    assert_eq!(cuModuleUnload(m), CUDA_SUCCESS);
}
