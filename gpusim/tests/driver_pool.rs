//! The default memory pool's counters, through the driver calls leangrad
//! makes (`cuDeviceGetMemPool`, `cuMemPoolGet/SetAttribute`). One test, so
//! that nothing else allocates meanwhile.

use leangrad_gpusim::driver::api_device::*;
use leangrad_gpusim::driver::api_memory::*;
use leangrad_gpusim::driver::consts::*;
use std::ffi::c_void;
use std::ptr::null_mut;

fn get(pool: CUmemoryPool, attr: u32) -> u64 {
    let mut v = u64::MAX;
    assert_eq!(
        unsafe { cuMemPoolGetAttribute(pool, attr, (&mut v as *mut u64).cast()) },
        CUDA_SUCCESS
    );
    v
}

fn set(pool: CUmemoryPool, attr: u32, mut v: u64) -> CUresult {
    unsafe { cuMemPoolSetAttribute(pool, attr, (&mut v as *mut u64).cast::<c_void>()) }
}

/// (used, used_high, reserved, reserved_high)
fn counters(pool: CUmemoryPool) -> (u64, u64, u64, u64) {
    (
        get(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT),
        get(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH),
        get(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT),
        get(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH),
    )
}

fn alloc(n: usize) -> u64 {
    let mut p = 0;
    assert_eq!(
        unsafe { cuMemAllocAsync(&mut p, n, null_mut()) },
        CUDA_SUCCESS
    );
    p
}

fn free_info() -> usize {
    let (mut free, mut total) = (0, 0);
    assert_eq!(
        unsafe { cuMemGetInfo_v2(&mut free, &mut total) },
        CUDA_SUCCESS
    );
    assert_eq!(total, 16 << 30);
    free
}

#[test]
fn pool_counters_follow_allocations_frees_and_synchronisations() {
    let pool = unsafe {
        assert_eq!(cuInit(0), CUDA_SUCCESS);
        let mut ctx = null_mut();
        assert_eq!(cuDevicePrimaryCtxRetain(&mut ctx, 0), CUDA_SUCCESS);
        assert_eq!(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
        let mut pool = null_mut();
        assert_eq!(cuDeviceGetMemPool(&mut pool, 0), CUDA_SUCCESS);
        pool
    };
    assert_eq!(counters(pool), (0, 0, 0, 0));
    assert_eq!(get(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD), 0);
    let total = 16usize << 30;
    assert_eq!(free_info(), total);

    let a = alloc(1000);
    let b = alloc(500);
    assert_eq!(counters(pool), (1500, 1500, 1500, 1500));
    assert_eq!(free_info(), total - 1500);
    // A queued free counts when the stream reaches it.
    assert_eq!(cuMemFreeAsync(a, null_mut()), CUDA_SUCCESS);
    assert_eq!(counters(pool).0, 1500);
    assert_eq!(cuStreamSynchronize(null_mut()), CUDA_SUCCESS);
    // Threshold 0: the freed bytes are released at the synchronisation.
    assert_eq!(counters(pool), (500, 1500, 500, 1500));

    // With a threshold, freed bytes stay cached and are reused.
    assert_eq!(
        set(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, 10_000),
        CUDA_SUCCESS
    );
    assert_eq!(get(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD), 10_000);
    let c = alloc(300);
    assert_eq!(cuMemFreeAsync(c, null_mut()), CUDA_SUCCESS);
    assert_eq!(cuCtxSynchronize(), CUDA_SUCCESS);
    assert_eq!(counters(pool), (500, 1500, 800, 1500));
    assert_eq!(free_info(), total - 800, "cached bytes are not free");
    let d = alloc(200);
    assert_eq!(counters(pool), (700, 1500, 800, 1500));

    // Resetting the marks: only 0 is accepted.
    assert_eq!(set(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, 0), CUDA_SUCCESS);
    assert_eq!(
        set(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, 0),
        CUDA_SUCCESS
    );
    assert_eq!(counters(pool), (700, 700, 800, 800));
    assert_eq!(
        set(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, 5),
        CUDA_ERROR_INVALID_VALUE
    );
    assert_eq!(
        set(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, 0),
        CUDA_ERROR_INVALID_VALUE
    );
    let mut v = 0u64;
    let r = unsafe { cuMemPoolGetAttribute(pool, 13, (&mut v as *mut u64).cast()) };
    assert_eq!(r, CUDA_ERROR_INVALID_VALUE);

    // Plain allocations are outside the pool.
    let mut p = 0;
    assert_eq!(unsafe { cuMemAlloc_v2(&mut p, 4096) }, CUDA_SUCCESS);
    assert_eq!(counters(pool).0, 700);
    assert_eq!(free_info(), total - 800 - 4096);
    assert_eq!(cuMemFree_v2(p), CUDA_SUCCESS);

    // Back to threshold 0: everything cached goes at the next sync.
    assert_eq!(
        set(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, 0),
        CUDA_SUCCESS
    );
    assert_eq!(cuMemFreeAsync(b, null_mut()), CUDA_SUCCESS);
    assert_eq!(cuMemFreeAsync(d, null_mut()), CUDA_SUCCESS);
    assert_eq!(cuCtxSynchronize(), CUDA_SUCCESS);
    assert_eq!(counters(pool), (0, 700, 0, 800));
    assert_eq!(free_info(), total);
}
