//! Shared helpers of the driver tests: a current context, allocation,
//! reading device bytes back, error strings.

use leangrad_gpusim::driver::api_device::*;
use leangrad_gpusim::driver::api_memory::*;
use leangrad_gpusim::driver::consts::*;
use leangrad_gpusim::driver::errors::cuGetErrorString;
use std::ffi::CStr;
use std::ptr::null_mut;

/// Initialises, retains device 0's primary context and makes it current on
/// this thread.
pub fn make_current() -> CUcontext {
    unsafe {
        assert_eq!(cuInit(0), CUDA_SUCCESS);
        let mut ctx = null_mut();
        assert_eq!(cuDevicePrimaryCtxRetain(&mut ctx, 0), CUDA_SUCCESS);
        assert_eq!(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
        ctx
    }
}

/// This thread's description of the last error `code` (`cuGetErrorString`).
pub fn error_string(code: CUresult) -> String {
    let mut p = std::ptr::null();
    assert_eq!(unsafe { cuGetErrorString(code, &mut p) }, CUDA_SUCCESS);
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// `n` bytes of device memory, allocated on the default stream.
pub fn alloc(n: usize) -> u64 {
    let mut p = 0;
    assert_eq!(
        unsafe { cuMemAllocAsync(&mut p, n, null_mut()) },
        CUDA_SUCCESS
    );
    p
}

/// The `n` bytes at device address `p` (runs the queued work first).
pub fn read(p: u64, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    let r = unsafe { cuMemcpyDtoHAsync_v2(v.as_mut_ptr().cast(), p, n, null_mut()) };
    assert_eq!(r, CUDA_SUCCESS, "{}", error_string(r));
    v
}
