//! Joining and leaving NCCL communicators: unique ids of another process
//! or of no NCCL at all, ranks out of range, ranks that disagree (every
//! joiner fails), ranks initialised by one thread inside a group,
//! `ncclCommInitRankConfig`, `ncclCommFinalize`.

mod nccl_common;
use nccl_common::*;
use std::ffi::c_void;
use std::ptr::null_mut;

fn setup() -> std::sync::MutexGuard<'static, ()> {
    let g = serial();
    init(3, None);
    g
}

#[test]
fn bad_unique_ids_and_ranks_are_refused() {
    let _g = setup();
    bind(0);
    let mut comm = null_mut();
    let mut id = unique_id();
    unsafe {
        let r = ncclCommInitRank(&mut comm, 2, id, 2);
        assert_eq!(r, NCCL_INVALID_ARGUMENT);
        // Another process's id.
        id.internal[8] = id.internal[8].wrapping_add(1);
        let r = ncclCommInitRank(&mut comm, 2, id, 0);
        assert_eq!(r, NCCL_INVALID_USAGE);
        assert!(
            nccl_error(r).contains("no transport between processes"),
            "{}",
            nccl_error(r)
        );
        let r = ncclCommInitRank(&mut comm, 2, NcclUniqueId { internal: [0; 128] }, 0);
        assert_eq!(r, NCCL_INVALID_ARGUMENT);
        let mut v = 0;
        assert_eq!(ncclGetVersion(&mut v), NCCL_SUCCESS);
        assert_eq!(v, 23000);
        assert_eq!(ncclGroupEnd(), NCCL_INVALID_USAGE);
    }
}

/// Rank 0 of 2 joins `id` on its own thread and returns what its init
/// returned, while `other` joins on this thread.
fn join_against(other: impl FnOnce(NcclUniqueId) -> NcclResult) -> (NcclResult, NcclResult) {
    let id = unique_id();
    let t = std::thread::spawn(move || {
        bind(0);
        let mut comm = null_mut();
        unsafe { ncclCommInitRank(&mut comm, 2, id, 0) }
    });
    // Let rank 0 join first (either order fails both).
    std::thread::sleep(std::time::Duration::from_millis(50));
    let mine = other(id);
    (t.join().unwrap(), mine)
}

#[test]
fn disagreeing_ranks_fail_every_joiner() {
    let _g = setup();
    let mut comm = null_mut();
    let (a, b) = join_against(|id| {
        bind(1);
        unsafe { ncclCommInitRank(&mut comm, 3, id, 1) }
    });
    assert_eq!((a, b), (NCCL_INVALID_USAGE, NCCL_INVALID_USAGE));
    assert!(nccl_error(b).contains("nranks = 3"), "{}", nccl_error(b));
    let (a, b) = join_against(|id| {
        bind(1);
        unsafe { ncclCommInitRank(&mut comm, 2, id, 0) }
    });
    assert_eq!((a, b), (NCCL_INVALID_USAGE, NCCL_INVALID_USAGE));
    // Two ranks on one device.
    let (a, b) = join_against(|id| {
        bind(0);
        unsafe { ncclCommInitRank(&mut comm, 2, id, 1) }
    });
    assert_eq!((a, b), (NCCL_INVALID_USAGE, NCCL_INVALID_USAGE));
    assert!(
        nccl_error(b).contains("both on device 0"),
        "{}",
        nccl_error(b)
    );
}

#[test]
fn ranks_initialised_inside_a_group_by_one_thread() {
    let _g = setup();
    let n = 3;
    let id = unique_id();
    let mut comms = vec![null_mut(); n];
    assert_eq!(ncclGroupStart(), NCCL_SUCCESS);
    for (r, c) in comms.iter_mut().enumerate() {
        bind(r);
        assert_eq!(
            unsafe { ncclCommInitRank(c, n as i32, id, r as i32) },
            NCCL_SUCCESS
        );
    }
    assert_eq!(ncclGroupEnd(), NCCL_SUCCESS);
    let bufs: Vec<u64> = (0..n)
        .map(|r| {
            bind(r);
            upload(&bytes(&[r as i64 + 1]))
        })
        .collect();
    group(n, |r| unsafe {
        let b = bufs[r] as *mut c_void;
        assert_eq!(
            ncclAllReduce(b, b, 1, I64, SUM, comms[r], null_mut()),
            NCCL_SUCCESS
        );
    });
    for (r, &b) in bufs.iter().enumerate() {
        bind(r);
        assert_eq!(i64s(&read(b, 8)), vec![6]);
        assert_eq!(ncclCommDestroy(comms[r]), NCCL_SUCCESS);
    }
}

#[test]
fn finalize_runs_the_queued_work_then_refuses_new_operations() {
    let _g = setup();
    let id = unique_id();
    let out: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|rank| {
                s.spawn(move || unsafe {
                    bind(rank + 1);
                    let mut comm = null_mut();
                    let r = ncclCommInitRankConfig(&mut comm, 2, id, rank as i32, null_mut());
                    assert_eq!(r, NCCL_SUCCESS);
                    let mut dev = -1;
                    assert_eq!(ncclCommCuDevice(comm, &mut dev), NCCL_SUCCESS);
                    assert_eq!(dev, rank as i32 + 1);
                    let b = upload(&bytes(&[rank as i64 + 5]));
                    let p = b as *mut c_void;
                    assert_eq!(
                        ncclAllReduce(p, p, 1, I64, MAX, comm, null_mut()),
                        NCCL_SUCCESS
                    );
                    // Finalize waits for the other rank's part and runs it.
                    assert_eq!(ncclCommFinalize(comm), NCCL_SUCCESS);
                    let again = ncclAllReduce(p, p, 1, I64, MAX, comm, null_mut());
                    assert_eq!(ncclCommDestroy(comm), NCCL_SUCCESS);
                    let gone = ncclCommDestroy(comm);
                    (i64s(&read(b, 8)), again, gone)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (v, again, gone) in out {
        assert_eq!(v, vec![6]);
        assert_eq!(again, NCCL_INVALID_USAGE);
        assert_eq!(gone, NCCL_INVALID_ARGUMENT);
    }
}
