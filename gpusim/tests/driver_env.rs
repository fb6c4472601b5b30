//! The machine's shape from the environment, and the primary context's
//! life: the last release destroys what the context owned. One test (the
//! environment is read once per process, at the first cuInit).

use leangrad_gpusim::driver::api_device::*;
use leangrad_gpusim::driver::api_memory::*;
use leangrad_gpusim::driver::consts::*;
use std::ffi::CStr;
use std::ptr::null_mut;

#[test]
fn environment_sets_devices_memory_and_compute_capability() {
    // SAFETY: set before any other thread of this process reads the
    // environment (this file has one test).
    unsafe {
        std::env::set_var("GPUSIM_DEVICE_COUNT", "2");
        std::env::set_var("GPUSIM_MEMORY_BYTES", "1M");
        std::env::set_var("GPUSIM_COMPUTE", "9.0");
    }
    unsafe {
        assert_eq!(cuInit(0), CUDA_SUCCESS);
        let mut n = 0;
        assert_eq!(cuDeviceGetCount(&mut n), CUDA_SUCCESS);
        assert_eq!(n, 2);
        for dev in 0..2 {
            let (mut major, mut minor, mut bytes) = (0, 0, 0usize);
            assert_eq!(cuDeviceGetAttribute(&mut major, 75, dev), CUDA_SUCCESS);
            assert_eq!(cuDeviceGetAttribute(&mut minor, 76, dev), CUDA_SUCCESS);
            assert_eq!((major, minor), (9, 0));
            assert_eq!(cuDeviceTotalMem_v2(&mut bytes, dev), CUDA_SUCCESS);
            assert_eq!(bytes, 1 << 20);
        }
        // Each device has its own memory and context.
        let (mut c0, mut c1) = (null_mut(), null_mut());
        assert_eq!(cuDevicePrimaryCtxRetain(&mut c0, 0), CUDA_SUCCESS);
        assert_eq!(cuDevicePrimaryCtxRetain(&mut c1, 1), CUDA_SUCCESS);
        assert_ne!(c0, c1);
        assert_eq!(cuCtxSetCurrent(c1), CUDA_SUCCESS);
        let mut p = 0;
        assert_eq!(cuMemAllocAsync(&mut p, 1 << 20, null_mut()), CUDA_SUCCESS);
        assert_eq!(
            cuMemAllocAsync(&mut p, 1, null_mut()),
            CUDA_ERROR_OUT_OF_MEMORY
        );
        let mut dev = -1;
        assert_eq!(cuCtxGetDevice(&mut dev), CUDA_SUCCESS);
        assert_eq!(dev, 1);
        assert_eq!(cuCtxSetCurrent(c0), CUDA_SUCCESS);
        let mut q = 0;
        assert_eq!(cuMemAllocAsync(&mut q, 1000, null_mut()), CUDA_SUCCESS);

        // Retained twice: the first release keeps the context.
        let mut again = null_mut();
        assert_eq!(cuDevicePrimaryCtxRetain(&mut again, 1), CUDA_SUCCESS);
        assert_eq!(again, c1);
        assert_eq!(cuDevicePrimaryCtxRelease_v2(1), CUDA_SUCCESS);
        assert_eq!(cuCtxSetCurrent(c1), CUDA_SUCCESS);
        // The last release frees its memory; the handle is then invalid.
        assert_eq!(cuDevicePrimaryCtxRelease_v2(1), CUDA_SUCCESS);
        assert_eq!(
            cuMemAllocAsync(&mut p, 8, null_mut()),
            CUDA_ERROR_INVALID_CONTEXT
        );
        assert_eq!(cuCtxSetCurrent(c1), CUDA_ERROR_INVALID_CONTEXT);
        assert_eq!(cuDevicePrimaryCtxRelease_v2(1), CUDA_ERROR_INVALID_CONTEXT);
        assert_eq!(cuDevicePrimaryCtxRetain(&mut c1, 1), CUDA_SUCCESS);
        assert_eq!(cuCtxSetCurrent(c1), CUDA_SUCCESS);
        let (mut free, mut total) = (0, 0);
        assert_eq!(cuMemGetInfo_v2(&mut free, &mut total), CUDA_SUCCESS);
        assert_eq!((free, total), (1 << 20, 1 << 20));
        // Device 0 was untouched.
        assert_eq!(cuCtxSetCurrent(c0), CUDA_SUCCESS);
        assert_eq!(cuMemGetInfo_v2(&mut free, &mut total), CUDA_SUCCESS);
        assert_eq!(free, (1 << 20) - 1000);
        let mut name = [0i8; 32];
        assert_eq!(cuDeviceGetName(name.as_mut_ptr(), 32, 1), CUDA_SUCCESS);
        assert_eq!(
            CStr::from_ptr(name.as_ptr()).to_str().unwrap(),
            "leangrad gpusim"
        );
    }
}
