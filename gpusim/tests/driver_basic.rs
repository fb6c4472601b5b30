//! The driver entry points called directly: device queries, allocation,
//! copies, handle and pointer validation, error strings.

mod driver_common;
use driver_common::{alloc, error_string, make_current, read};
use leangrad_gpusim::driver::api_device::*;
use leangrad_gpusim::driver::api_memory::*;
use leangrad_gpusim::driver::api_module::*;
use leangrad_gpusim::driver::consts::*;
use leangrad_gpusim::driver::errors::{cuGetErrorName, cuGetErrorString};
use std::ffi::{c_void, CStr};
use std::ptr::null_mut;

#[test]
fn device_queries() {
    make_current();
    unsafe {
        let mut n = 0;
        assert_eq!(cuDeviceGetCount(&mut n), CUDA_SUCCESS);
        assert_eq!(n, 1);
        let mut name = [0i8; 64];
        assert_eq!(cuDeviceGetName(name.as_mut_ptr(), 64, 0), CUDA_SUCCESS);
        assert_eq!(
            CStr::from_ptr(name.as_ptr()).to_str().unwrap(),
            "leangrad gpusim"
        );
        let mut short = [1i8; 5];
        assert_eq!(cuDeviceGetName(short.as_mut_ptr(), 5, 0), CUDA_SUCCESS);
        assert_eq!(CStr::from_ptr(short.as_ptr()).to_str().unwrap(), "lean");
        let attr = |a: u32| {
            let mut v = -1;
            (cuDeviceGetAttribute(&mut v, a, 0), v)
        };
        assert_eq!(attr(75), (CUDA_SUCCESS, 8));
        assert_eq!(attr(76), (CUDA_SUCCESS, 0));
        assert_eq!(attr(115), (CUDA_SUCCESS, 1));
        assert_eq!(attr(1), (CUDA_SUCCESS, 1024));
        assert_eq!(attr(10), (CUDA_SUCCESS, 32));
        assert_eq!(attr(9999).0, CUDA_ERROR_INVALID_VALUE);
        assert!(error_string(CUDA_ERROR_INVALID_VALUE)
            .contains("device attribute 9999 is not simulated"));
        let mut bytes = 0usize;
        assert_eq!(cuDeviceTotalMem_v2(&mut bytes, 0), CUDA_SUCCESS);
        assert_eq!(bytes, 16 << 30);
        let mut dev = -1;
        assert_eq!(cuDeviceGet(&mut dev, 0), CUDA_SUCCESS);
        assert_eq!(dev, 0);
        assert_eq!(cuDeviceGet(&mut dev, 3), CUDA_ERROR_INVALID_DEVICE);
        assert_eq!(
            cuDeviceGetAttribute(&mut dev, 75, 1),
            CUDA_ERROR_INVALID_DEVICE
        );
        let mut v = 0;
        assert_eq!(cuDriverGetVersion(&mut v), CUDA_SUCCESS);
        assert_eq!(v, 13000);
        assert_eq!(cuCtxGetDevice(&mut dev), CUDA_SUCCESS);
        assert_eq!(dev, 0);
        assert_eq!(cuInit(1), CUDA_ERROR_INVALID_VALUE);
    }
}

#[test]
fn error_names_and_strings() {
    let mut p = std::ptr::null();
    unsafe {
        assert_eq!(
            cuGetErrorName(CUDA_ERROR_ILLEGAL_ADDRESS, &mut p),
            CUDA_SUCCESS
        );
        assert_eq!(
            CStr::from_ptr(p).to_str().unwrap(),
            "CUDA_ERROR_ILLEGAL_ADDRESS"
        );
        assert_eq!(cuGetErrorString(12345, &mut p), CUDA_ERROR_INVALID_VALUE);
        assert!(p.is_null());
        assert_eq!(
            cuGetErrorString(CUDA_ERROR_NO_BINARY_FOR_GPU, &mut p),
            CUDA_SUCCESS
        );
    }
    // Without an error of that code on this thread: the standard text alone.
    let t = std::thread::spawn(|| error_string(CUDA_ERROR_NOT_FOUND))
        .join()
        .unwrap();
    assert_eq!(t, "named symbol not found");
}

#[test]
fn copies_roundtrip_and_memset() {
    make_current();
    let a = alloc(100);
    let b = alloc(100);
    let host: Vec<u8> = (0..100).collect();
    unsafe {
        assert_eq!(
            cuMemcpyHtoDAsync_v2(a, host.as_ptr().cast(), 100, null_mut()),
            CUDA_SUCCESS
        );
        assert_eq!(
            cuMemcpyDtoDAsync_v2(b, a + 10, 50, null_mut()),
            CUDA_SUCCESS
        );
        assert_eq!(cuMemsetD8Async(b + 50, 0xab, 50, null_mut()), CUDA_SUCCESS);
    }
    assert_eq!(read(a, 100), host);
    let mut want: Vec<u8> = (10..60).collect();
    want.extend([0xab; 50]);
    assert_eq!(read(b, 100), want);
    unsafe {
        // The synchronous forms.
        let mut p = 0;
        assert_eq!(cuMemAlloc_v2(&mut p, 64), CUDA_SUCCESS);
        assert_eq!(cuMemsetD8_v2(p, 7, 64), CUDA_SUCCESS);
        assert_eq!(
            cuMemcpyHtoD_v2(p + 8, host.as_ptr().cast(), 8),
            CUDA_SUCCESS
        );
        assert_eq!(cuMemcpyDtoD_v2(p + 16, a + 90, 10), CUDA_SUCCESS);
        let mut out = [0u8; 64];
        assert_eq!(
            cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), p, 64),
            CUDA_SUCCESS
        );
        assert_eq!(&out[..8], &[7; 8]);
        assert_eq!(&out[8..16], &host[..8]);
        assert_eq!(&out[16..26], &host[90..]);
        assert_eq!(&out[26..], &[7; 38]);
        assert_eq!(cuMemFree_v2(p), CUDA_SUCCESS);
        assert_eq!(cuMemFree_v2(p), CUDA_ERROR_INVALID_VALUE);
        assert!(error_string(CUDA_ERROR_INVALID_VALUE).contains("freed allocation"));
        // Zero-byte copies are no-ops.
        assert_eq!(
            cuMemcpyHtoDAsync_v2(a, std::ptr::null(), 0, null_mut()),
            CUDA_SUCCESS
        );
        assert_eq!(cuMemFreeAsync(a, null_mut()), CUDA_SUCCESS);
        assert_eq!(cuMemFreeAsync(b, null_mut()), CUDA_SUCCESS);
        assert_eq!(cuStreamSynchronize(null_mut()), CUDA_SUCCESS);
    }
}

#[test]
fn out_of_bounds_and_host_pointers_are_refused() {
    make_current();
    let a = alloc(16);
    let host = [0u8; 32];
    unsafe {
        // 16 bytes past the end.
        assert_eq!(
            cuMemcpyHtoDAsync_v2(a, host.as_ptr().cast(), 32, null_mut()),
            CUDA_ERROR_INVALID_VALUE
        );
        let e = error_string(CUDA_ERROR_INVALID_VALUE);
        assert!(
            e.starts_with("invalid argument — gpusim: cuMemcpyHtoDAsync_v2: destination"),
            "{e}"
        );
        // A host pointer where a device pointer belongs.
        let hp = host.as_ptr() as u64;
        assert_eq!(
            cuMemsetD8Async(hp, 0, 4, null_mut()),
            CUDA_ERROR_INVALID_VALUE
        );
        assert!(error_string(CUDA_ERROR_INVALID_VALUE).contains("not a device address"));
        assert_eq!(
            cuMemcpyHtoD_v2(hp, host.as_ptr().cast(), 4),
            CUDA_ERROR_INVALID_VALUE
        );
        assert!(error_string(CUDA_ERROR_INVALID_VALUE).contains("not a device address"));
        // A device pointer where a host pointer belongs.
        assert_eq!(
            cuMemcpyDtoHAsync_v2(a as *mut c_void, a, 4, null_mut()),
            CUDA_ERROR_INVALID_VALUE
        );
        assert!(
            error_string(CUDA_ERROR_INVALID_VALUE).contains("is a device address, not host memory")
        );
        assert_eq!(
            cuMemcpyHtoDAsync_v2(a, std::ptr::null(), 4, null_mut()),
            CUDA_ERROR_INVALID_VALUE
        );
        // Frees: not a start, double.
        assert_eq!(cuMemFreeAsync(a + 4, null_mut()), CUDA_ERROR_INVALID_VALUE);
        assert!(error_string(CUDA_ERROR_INVALID_VALUE).contains("inside live allocation"));
        assert_eq!(cuMemFreeAsync(a, null_mut()), CUDA_SUCCESS);
        assert_eq!(cuMemFreeAsync(a, null_mut()), CUDA_ERROR_INVALID_VALUE);
        assert!(error_string(CUDA_ERROR_INVALID_VALUE).contains("double free"));
        let mut p = 0;
        assert_eq!(
            cuMemAllocAsync(&mut p, 0, null_mut()),
            CUDA_ERROR_INVALID_VALUE
        );
    }
}

#[test]
fn out_of_memory() {
    make_current();
    unsafe {
        let mut p = 0;
        assert_eq!(
            cuMemAllocAsync(&mut p, 32 << 30, null_mut()),
            CUDA_ERROR_OUT_OF_MEMORY
        );
        let e = error_string(CUDA_ERROR_OUT_OF_MEMORY);
        assert!(e.starts_with("out of memory — gpusim: cuMemAllocAsync: device 0: out of device memory: 34359738368 bytes requested"), "{e}");
        assert_eq!(cuMemAlloc_v2(&mut p, 1 << 50), CUDA_ERROR_OUT_OF_MEMORY);
        let (mut free, mut total) = (0, 0);
        assert_eq!(cuMemGetInfo_v2(&mut free, &mut total), CUDA_SUCCESS);
        assert_eq!(total, 16 << 30);
        assert!(free <= total && free > 15 << 30);
    }
}

#[test]
fn handles_are_checked() {
    make_current();
    unsafe {
        let bogus = 0x1234 as *mut c_void;
        assert_eq!(cuStreamSynchronize(bogus), CUDA_ERROR_INVALID_HANDLE);
        assert_eq!(cuCtxSetCurrent(bogus), CUDA_ERROR_INVALID_CONTEXT);
        let mut f = null_mut();
        let name = c"k";
        assert_eq!(
            cuModuleGetFunction(&mut f, bogus, name.as_ptr()),
            CUDA_ERROR_INVALID_HANDLE
        );
        assert_eq!(cuModuleUnload(bogus), CUDA_ERROR_INVALID_HANDLE);
        let mut args: [*mut c_void; 0] = [];
        let r = cuLaunchKernel(
            bogus,
            1,
            1,
            1,
            32,
            1,
            1,
            0,
            null_mut(),
            args.as_mut_ptr(),
            null_mut(),
        );
        assert_eq!(r, CUDA_ERROR_INVALID_HANDLE);
        let mut v = 0u64;
        assert_eq!(
            cuMemPoolGetAttribute(bogus, 7, (&mut v as *mut u64).cast()),
            CUDA_ERROR_INVALID_VALUE
        );
        // A created stream works until destroyed; other handles are not streams.
        let mut s = null_mut();
        assert_eq!(cuStreamCreate(&mut s, 1), CUDA_SUCCESS);
        assert_eq!(cuStreamSynchronize(s), CUDA_SUCCESS);
        assert_eq!(cuStreamDestroy_v2(s), CUDA_SUCCESS);
        assert_eq!(cuStreamSynchronize(s), CUDA_ERROR_INVALID_HANDLE);
        assert_eq!(cuStreamCreate(&mut s, 4), CUDA_ERROR_INVALID_VALUE);
    }
    // A thread with no current context.
    std::thread::spawn(|| unsafe {
        let mut p = 0;
        assert_eq!(cuMemAlloc_v2(&mut p, 8), CUDA_ERROR_INVALID_CONTEXT);
        assert_eq!(cuCtxSynchronize(), CUDA_ERROR_INVALID_CONTEXT);
        let mut c = 1 as CUcontext;
        assert_eq!(cuCtxGetCurrent(&mut c), CUDA_SUCCESS);
        assert!(c.is_null());
    })
    .join()
    .unwrap();
}

#[test]
fn binaries_are_refused_with_a_message() {
    make_current();
    unsafe {
        let mut m = null_mut();
        let elf = b"\x7fELF\x02\x01\x01\0\0\0";
        assert_eq!(
            cuModuleLoadData(&mut m, elf.as_ptr().cast()),
            CUDA_ERROR_NO_BINARY_FOR_GPU
        );
        assert_eq!(
            error_string(CUDA_ERROR_NO_BINARY_FOR_GPU),
            "no kernel image is available for execution on the device — gpusim: cuModuleLoadData: gpusim runs PTX only; load the PTX"
        );
        let fatbin = 0xBA55_ED50u32.to_le_bytes();
        assert_eq!(
            cuModuleLoadData(&mut m, fatbin.as_ptr().cast()),
            CUDA_ERROR_NO_BINARY_FOR_GPU
        );
        let bad = [0xffu8, 0xfe, 0x41, 0];
        assert_eq!(
            cuModuleLoadData(&mut m, bad.as_ptr().cast()),
            CUDA_ERROR_INVALID_PTX
        );
        assert!(error_string(CUDA_ERROR_INVALID_PTX).contains("not UTF-8"));
    }
}
