//! Queue semantics: work runs in order when a synchronising call needs it;
//! host bytes are staged at enqueue; a fault goes to the enqueuing thread.
//! The tests of this file run one at a time (they look at the queue).

mod driver_common;
use driver_common::{alloc, error_string, make_current, read};
use leangrad_gpusim::driver::api_device::*;
use leangrad_gpusim::driver::api_memory::*;
use leangrad_gpusim::driver::consts::*;
use leangrad_gpusim::driver::state;
use std::ptr::null_mut;
use std::sync::{Mutex, MutexGuard};

static SERIAL: Mutex<()> = Mutex::new(());

fn setup() -> MutexGuard<'static, ()> {
    let g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    make_current();
    assert_eq!(cuCtxSynchronize(), CUDA_SUCCESS);
    g
}

fn queued() -> usize {
    state::lock()
        .as_ref()
        .map_or(0, |s| s.devices[0].queue.len())
}

#[test]
fn host_to_device_copies_stage_the_host_bytes_at_enqueue() {
    let _g = setup();
    let a = alloc(8);
    let mut host = vec![1u8; 8];
    unsafe {
        assert_eq!(
            cuMemcpyHtoDAsync_v2(a, host.as_ptr().cast(), 8, null_mut()),
            CUDA_SUCCESS
        );
    }
    assert_eq!(queued(), 1, "the write waits in the queue");
    host.fill(2);
    drop(host);
    assert_eq!(read(a, 8), vec![1u8; 8]);
    assert_eq!(queued(), 0);
    assert_eq!(cuMemFreeAsync(a, null_mut()), CUDA_SUCCESS);
}

#[test]
fn device_to_host_copies_drain_the_stream_in_order() {
    let _g = setup();
    let a = alloc(16);
    {
        assert_eq!(cuMemsetD8Async(a, 3, 16, null_mut()), CUDA_SUCCESS);
        assert_eq!(cuMemsetD8Async(a + 4, 9, 4, null_mut()), CUDA_SUCCESS);
        assert_eq!(
            cuMemcpyDtoDAsync_v2(a + 12, a + 4, 4, null_mut()),
            CUDA_SUCCESS
        );
    }
    assert_eq!(queued(), 3);
    assert_eq!(
        read(a, 16),
        [3, 3, 3, 3, 9, 9, 9, 9, 3, 3, 3, 3, 9, 9, 9, 9]
    );
    assert_eq!(queued(), 0);
    // A created stream's sync runs work up to its own last item only.
    let mut s = null_mut();
    unsafe {
        assert_eq!(cuStreamCreate(&mut s, 0), CUDA_SUCCESS);
        assert_eq!(cuMemsetD8Async(a, 1, 1, s), CUDA_SUCCESS);
        assert_eq!(cuMemsetD8Async(a, 2, 1, null_mut()), CUDA_SUCCESS);
        assert_eq!(cuStreamSynchronize(s), CUDA_SUCCESS);
        assert_eq!(queued(), 1);
        assert_eq!(cuCtxSynchronize(), CUDA_SUCCESS);
        assert_eq!(queued(), 0);
        assert_eq!(cuStreamDestroy_v2(s), CUDA_SUCCESS);
    }
    assert_eq!(read(a, 1), [2]);
    assert_eq!(cuMemFreeAsync(a, null_mut()), CUDA_SUCCESS);
}

#[test]
fn a_fault_is_delivered_to_the_enqueuing_thread_only() {
    let _g = setup();
    let ctx = {
        let mut c = null_mut();
        unsafe { cuCtxGetCurrent(&mut c) };
        c as u64
    };
    let a = alloc(64);
    let b = alloc(64);
    {
        // In stream order: a is freed, then written (use after free), then
        // b written by the same thread.
        assert_eq!(cuMemFreeAsync(a, null_mut()), CUDA_SUCCESS);
        assert_eq!(cuMemsetD8Async(a, 1, 64, null_mut()), CUDA_SUCCESS);
        assert_eq!(cuMemsetD8Async(b, 5, 64, null_mut()), CUDA_SUCCESS);
    }
    // Another thread synchronises: the work runs, the fault is not its own.
    let other = std::thread::spawn(move || {
        assert_eq!(cuCtxSetCurrent(ctx as CUcontext), CUDA_SUCCESS);
        let c = alloc(8);
        assert_eq!(cuMemsetD8Async(c, 4, 8, null_mut()), CUDA_SUCCESS);
        let r = cuCtxSynchronize();
        (r, read(c, 8))
    })
    .join()
    .unwrap();
    assert_eq!(
        other,
        (CUDA_SUCCESS, vec![4u8; 8]),
        "the other thread's work still ran"
    );
    assert_eq!(queued(), 0);
    // This thread's next synchronising call gets the fault.
    let r = cuStreamSynchronize(null_mut());
    assert_eq!(r, CUDA_ERROR_ILLEGAL_ADDRESS);
    let e = error_string(r);
    assert!(
        e.starts_with(
            "an illegal memory access was encountered — gpusim: cuMemsetD8Async (queued): "
        ),
        "{e}"
    );
    assert!(e.contains("use after free"), "{e}");
    assert!(
        e.contains("1 later operation(s) of this thread skipped"),
        "{e}"
    );
    // Delivered once; b's memset was skipped, so b is still unwritten.
    assert_eq!(cuStreamSynchronize(null_mut()), CUDA_SUCCESS);
    assert_eq!(read(b, 4), [0, 0, 0, 0]);
    assert_eq!(cuMemFreeAsync(b, null_mut()), CUDA_SUCCESS);
}

#[test]
fn allocation_runs_pending_frees_before_refusing() {
    let _g = setup();
    // 10 GiB twice does not fit in 16 GiB unless the queued free runs.
    let a = alloc(10 << 30);
    assert_eq!(cuMemFreeAsync(a, null_mut()), CUDA_SUCCESS);
    assert_eq!(queued(), 1);
    let b = alloc(10 << 30);
    assert_eq!(queued(), 0);
    {
        assert_eq!(cuMemFreeAsync(b, null_mut()), CUDA_SUCCESS);
        assert_eq!(cuCtxSynchronize(), CUDA_SUCCESS);
    }
}

#[test]
fn events_complete_when_the_queue_reaches_their_record() {
    use leangrad_gpusim::driver::api_event::*;
    let _g = setup();
    let a = alloc(4);
    unsafe {
        let (mut e0, mut e1, mut untimed) = (null_mut(), null_mut(), null_mut());
        assert_eq!(cuEventCreate(&mut e0, 0), CUDA_SUCCESS);
        assert_eq!(cuEventCreate(&mut e1, 0), CUDA_SUCCESS);
        assert_eq!(cuEventCreate(&mut untimed, 2), CUDA_SUCCESS);
        assert_eq!(cuEventQuery(e0), CUDA_SUCCESS, "never recorded: complete");
        assert_eq!(cuEventRecord(e0, null_mut()), CUDA_SUCCESS);
        assert_eq!(cuMemsetD8Async(a, 6, 4, null_mut()), CUDA_SUCCESS);
        assert_eq!(cuEventRecord(e1, null_mut()), CUDA_SUCCESS);
        assert_eq!(cuMemsetD8Async(a, 7, 4, null_mut()), CUDA_SUCCESS);
        assert_eq!(cuEventRecord(untimed, null_mut()), CUDA_SUCCESS);
        assert_eq!(cuEventQuery(e1), CUDA_ERROR_NOT_READY);
        let mut ms = -1.0f32;
        assert_eq!(cuEventElapsedTime_v2(&mut ms, e0, e1), CUDA_ERROR_NOT_READY);
        assert_eq!(cuStreamWaitEvent(null_mut(), e1, 0), CUDA_SUCCESS);
        // Synchronising on e1 runs up to its record, not past it.
        assert_eq!(cuEventSynchronize(e1), CUDA_SUCCESS);
        assert_eq!(cuEventQuery(e1), CUDA_SUCCESS);
        assert_eq!(queued(), 2);
        assert_eq!(cuEventElapsedTime(&mut ms, e0, e1), CUDA_SUCCESS);
        assert!((0.0..10_000.0).contains(&ms), "{ms}");
        assert_eq!(cuCtxSynchronize(), CUDA_SUCCESS);
        assert_eq!(
            cuEventElapsedTime(&mut ms, e0, untimed),
            CUDA_ERROR_INVALID_HANDLE
        );
        for e in [e0, e1, untimed] {
            assert_eq!(cuEventDestroy_v2(e), CUDA_SUCCESS);
        }
        assert_eq!(cuEventQuery(e0), CUDA_ERROR_INVALID_HANDLE);
    }
    assert_eq!(read(a, 4), [7, 7, 7, 7]);
    assert_eq!(cuMemFreeAsync(a, null_mut()), CUDA_SUCCESS);
}
