//! The NCCL stand-in's failures: mismatched calls, a rank that never calls
//! or never joins (an error within `GPUSIM_NCCL_TIMEOUT_MS`, not a hang),
//! an aborted rank, a never-written send buffer, operations enqueued in
//! orders no device queue can run. Every rank hears of each.

mod nccl_common;
use leangrad_gpusim::driver::consts::*;
use nccl_common::*;
use std::ptr::null_mut;
use std::sync::Barrier;
use std::time::{Duration, Instant};

const TIMEOUT_MS: u64 = 1500;

fn setup() -> std::sync::MutexGuard<'static, ()> {
    let g = serial();
    init(4, Some(TIMEOUT_MS));
    g
}

fn async_error(comm: NcclComm) -> NcclResult {
    let mut e = NCCL_SUCCESS;
    assert_eq!(unsafe { ncclCommGetAsyncError(comm, &mut e) }, NCCL_SUCCESS);
    e
}

/// An all-reduce of `count` f32 ones on this rank, and the read of its
/// result: the read's error (code, text) if it failed.
fn all_reduce_and_read(comm: NcclComm, count: usize) -> Result<Vec<u8>, (CUresult, String)> {
    let send = upload(&bytes(&vec![1.0f32; count]));
    let recv = alloc(4 * count);
    let r = unsafe { ncclAllReduce(send as _, recv as _, count, F32, SUM, comm, null_mut()) };
    assert_eq!(r, NCCL_SUCCESS, "{}", nccl_error(r));
    try_read(recv, 4 * count).map_err(|r| (r, error_string(r)))
}

#[test]
fn mismatched_counts_fail_every_rank_with_invalid_usage() {
    let _g = setup();
    let out = ranks_as_threads(2, |rank, comm| {
        let err = all_reduce_and_read(comm, 4 + rank).unwrap_err();
        (err, async_error(comm))
    });
    for ((code, text), asynch) in out {
        assert_eq!(code, CUDA_ERROR_LAUNCH_FAILED);
        assert!(text.contains("ncclInvalidUsage"), "{text}");
        assert!(
            text.contains("count differs: rank 0 passed 4, rank 1 passed 5"),
            "{text}"
        );
        assert_eq!(asynch, NCCL_INVALID_USAGE);
    }
}

#[test]
fn a_rank_that_never_calls_is_an_error_within_the_timeout() {
    let _g = setup();
    let done = Barrier::new(2);
    let out = ranks_as_threads(2, |rank, comm| {
        if rank == 1 {
            done.wait();
            // The communicator broke: this rank hears of it too, and new
            // operations are refused at the call.
            let e = async_error(comm);
            let b = alloc(4);
            let r = unsafe { ncclAllReduce(b as _, b as _, 1, F32, SUM, comm, null_mut()) };
            return (e, r, Duration::ZERO, String::new());
        }
        let t0 = Instant::now();
        let (code, text) = all_reduce_and_read(comm, 4).unwrap_err();
        let waited = t0.elapsed();
        done.wait();
        (async_error(comm), code, waited, text)
    });
    let (e0, code, waited, text) = &out[0];
    assert_eq!(*code, CUDA_ERROR_LAUNCH_FAILED);
    assert!(
        text.contains("timed out after 1500 ms") && text.contains("rank 1"),
        "{text}"
    );
    assert!(*waited >= Duration::from_millis(TIMEOUT_MS), "{waited:?}");
    assert!(*waited < Duration::from_secs(20), "{waited:?}");
    assert_eq!(*e0, NCCL_REMOTE_ERROR);
    assert_eq!((out[1].0, out[1].1), (NCCL_REMOTE_ERROR, NCCL_REMOTE_ERROR));
}

#[test]
fn a_rank_that_never_joins_fails_the_init_within_the_timeout() {
    let _g = setup();
    bind(0);
    let t0 = Instant::now();
    let mut comm = null_mut();
    let r = unsafe { ncclCommInitRank(&mut comm, 2, unique_id(), 0) };
    assert_eq!(r, NCCL_SYSTEM_ERROR);
    assert!(t0.elapsed() >= Duration::from_millis(TIMEOUT_MS));
    let text = nccl_error(r);
    assert!(
        text.contains("waiting for rank(s) [1] of 2 to join"),
        "{text}"
    );
}

/// Runs `f(rank, comm)` on 2 threads joined to one communicator, leaving
/// the communicators to `f` (which may abort them).
fn two_ranks<T: Send>(f: impl Fn(usize, NcclComm, &Barrier) -> T + Sync) -> Vec<T> {
    let id = unique_id();
    let b = Barrier::new(2);
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|rank| {
                let (f, b) = (&f, &b);
                s.spawn(move || {
                    bind(rank);
                    f(rank, init_rank(2, id, rank), b)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn an_aborted_rank_fails_the_others_instead_of_hanging() {
    let _g = setup();
    let out = two_ranks(|rank, comm, b| {
        if rank == 1 {
            assert_eq!(ncclCommAbort(comm), NCCL_SUCCESS);
            b.wait();
            return None;
        }
        b.wait();
        let t0 = Instant::now();
        let err = all_reduce_and_read(comm, 2).unwrap_err();
        let e = async_error(comm);
        assert_eq!(ncclCommDestroy(comm), NCCL_SUCCESS);
        Some((err, e, t0.elapsed()))
    });
    let ((code, text), e, waited) = out[0].clone().unwrap();
    assert_eq!(code, CUDA_ERROR_LAUNCH_FAILED);
    assert!(
        text.contains("ncclRemoteError") && text.contains("aborted"),
        "{text}"
    );
    assert_eq!(e, NCCL_REMOTE_ERROR);
    assert!(!text.contains("timed out"), "{text} after {waited:?}");
}

#[test]
fn work_enqueued_before_an_abort_still_runs() {
    let _g = setup();
    // cudarc's Comm aborts on drop: a rank that enqueued its part and
    // dropped its communicator does not fail the others.
    let out = two_ranks(|rank, comm, b| {
        let send = upload(&bytes(&[rank as f32 + 1.0; 2]));
        let recv = alloc(8);
        let r = unsafe { ncclAllReduce(send as _, recv as _, 2, F32, SUM, comm, null_mut()) };
        assert_eq!(r, NCCL_SUCCESS);
        if rank == 1 {
            assert_eq!(ncclCommAbort(comm), NCCL_SUCCESS);
        }
        b.wait();
        let got = read(recv, 8);
        if rank == 0 {
            assert_eq!(ncclCommAbort(comm), NCCL_SUCCESS);
        }
        got
    });
    for got in out {
        assert_eq!(got, bytes(&[3.0f32; 2]));
    }
}

#[test]
fn a_never_written_send_buffer_faults_its_rank_and_fails_the_others() {
    let _g = setup();
    let out = ranks_as_threads(2, |rank, comm| {
        let send = if rank == 1 {
            alloc(16)
        } else {
            upload(&bytes(&[1.0f32; 4]))
        };
        let recv = alloc(16);
        let r = unsafe { ncclAllReduce(send as _, recv as _, 4, F32, SUM, comm, null_mut()) };
        assert_eq!(r, NCCL_SUCCESS);
        let code = try_read(recv, 16).unwrap_err();
        (code, error_string(code), async_error(comm))
    });
    let (c0, t0, e0) = &out[0];
    let (c1, t1, e1) = &out[1];
    assert_eq!(
        (*c1, *e1),
        (CUDA_ERROR_ILLEGAL_ADDRESS, NCCL_UNHANDLED_CUDA_ERROR)
    );
    assert!(t1.contains("never written"), "{t1}");
    assert_eq!((*c0, *e0), (CUDA_ERROR_LAUNCH_FAILED, NCCL_REMOTE_ERROR));
    assert!(t0.contains("rank 1's part faulted"), "{t0}");
}

#[test]
fn bad_buffers_are_refused_at_the_call() {
    let _g = setup();
    let mut comms = [null_mut(); 2];
    assert_eq!(
        unsafe { ncclCommInitAll(comms.as_mut_ptr(), 2, std::ptr::null()) },
        NCCL_SUCCESS
    );
    bind(1); // device 1 has a context
    bind(0);
    let small = alloc(8);
    unsafe {
        let r = ncclAllReduce(small as _, small as _, 4, F32, SUM, comms[0], null_mut());
        assert_eq!(r, NCCL_INVALID_ARGUMENT);
        assert!(
            nccl_error(r).contains("not inside one live allocation"),
            "{}",
            nccl_error(r)
        );
        let r = ncclAllReduce(small as _, small as _, 2, F32, 9, comms[0], null_mut());
        assert_eq!(r, NCCL_INVALID_ARGUMENT);
        let r = ncclBroadcast(small as _, small as _, 2, F32, 5, comms[0], null_mut());
        assert_eq!(r, NCCL_INVALID_ARGUMENT);
        // Device 0's buffer passed for the rank on device 1.
        let r = ncclAllReduce(small as _, small as _, 2, F32, SUM, comms[1], null_mut());
        assert_eq!(r, NCCL_INVALID_ARGUMENT);
    }
    for c in comms {
        assert_eq!(ncclCommDestroy(c), NCCL_SUCCESS);
    }
}

#[test]
fn operations_enqueued_in_orders_no_queue_can_run_fail_instead_of_hanging() {
    let _g = setup();
    let (mut a, mut b) = ([null_mut(); 2], [null_mut(); 2]);
    unsafe {
        assert_eq!(
            ncclCommInitAll(a.as_mut_ptr(), 2, std::ptr::null()),
            NCCL_SUCCESS
        );
        assert_eq!(
            ncclCommInitAll(b.as_mut_ptr(), 2, std::ptr::null()),
            NCCL_SUCCESS
        );
    }
    let bufs: Vec<u64> = (0..2)
        .map(|r| {
            bind(r);
            upload(&bytes(&[1.0f32]))
        })
        .collect();
    let call = |comm: NcclComm, r: usize| unsafe {
        bind(r);
        let p = bufs[r] as *mut std::ffi::c_void;
        assert_eq!(
            ncclAllReduce(p, p, 1, F32, SUM, comm, null_mut()),
            NCCL_SUCCESS
        );
    };
    // Device 0 queues A then B, device 1 queues B then A.
    call(a[0], 0);
    call(b[0], 0);
    call(b[1], 1);
    call(a[1], 1);
    let t0 = Instant::now();
    bind(0);
    let code = try_read(bufs[0], 4).unwrap_err();
    let text = error_string(code);
    assert!(
        text.contains("ncclInvalidUsage") && text.contains("deadlock"),
        "{text}"
    );
    assert!(
        t0.elapsed() < Duration::from_millis(TIMEOUT_MS),
        "it waited"
    );
    bind(1);
    let _ = try_read(bufs[1], 4);
    let failed = [a[0], a[1], b[0], b[1]]
        .iter()
        .filter(|&&c| async_error(c) == NCCL_INVALID_USAGE)
        .count();
    assert_eq!(
        failed, 2,
        "one communicator's all-reduce failed on both ranks"
    );
    for c in a.into_iter().chain(b) {
        assert_eq!(ncclCommAbort(c), NCCL_SUCCESS);
    }
}
