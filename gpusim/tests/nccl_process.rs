//! Communicators whose ranks live in several processes: this test binary
//! runs itself again as child processes (2 simulated devices each) that
//! join a unique id made here. Results are checked bit for bit against
//! reductions computed on the host in rank order (each step rounded in the
//! element type); failures — calls that disagree across processes, a
//! process that exits, is killed, aborts, never joins or never reaches a
//! collective — are errors on every rank, never hangs; strangers on the
//! listener are refused.

mod nccl_common;
#[path = "nccl_common/procs.rs"]
mod procs;
#[path = "nccl_common/scenarios.rs"]
mod scenarios;

use leangrad_gpusim::driver::consts::*;
use nccl_common::*;
use procs::{hear, hex, say, spawn, unhex, Proc};
use scenarios::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::ptr::null_mut;
use std::sync::Barrier;
use std::time::{Duration, Instant};

/// This process's NCCL timeout: long, so that what is tested below is
/// detected otherwise (a closed connection, an abort, a child's timeout).
const TIMEOUT_MS: u64 = 20_000;
/// The children's timeout where one is meant to pass.
const SHORT_MS: u64 = 1_500;

fn setup() -> std::sync::MutexGuard<'static, ()> {
    let g = serial();
    init(2, Some(TIMEOUT_MS));
    g
}

/// The entry point of the children (a no-op test in the parent).
#[test]
fn child() {
    procs::child_main(|role, id| {
        init(2, None);
        match role {
            "collectives" => {
                ranks_here(&[2, 3], N, id, collectives);
            }
            "group0" | "group2" => grouped(if role == "group0" { 0 } else { 2 }, id),
            "mismatch" => {
                ranks_here(&[2, 3], N, id, |_, comm| mismatched(comm, 5));
            }
            "exit" => exit_early(id),
            "abort" => abort_early(id),
            "idle" => idle_until_told(id),
            "never0" | "never2" => never_complete(if role == "never0" { 0 } else { 2 }, id),
            "late" => late(id),
            "stuck" => stuck(id),
            "creator" => creator(),
            "orphan" => orphan(id),
            "hub_first" => hub_done_first(),
            "receiver" => receiver(id),
            other => panic!("unknown role {other}"),
        }
    });
}

#[test]
fn collectives_across_two_processes_match_the_rank_order_reduction() {
    let _g = setup();
    let id = unique_id();
    let child = spawn("collectives", &id, TIMEOUT_MS);
    ranks_here(&[0, 1], N, id, collectives);
    child.finish();
}

#[test]
fn two_members_meet_through_a_hub_without_ranks() {
    let _g = setup();
    let id = unique_id();
    let a = spawn("group0", &id, TIMEOUT_MS);
    let b = spawn("group2", &id, TIMEOUT_MS);
    a.finish();
    b.finish();
}

/// An all-reduce of `count` elements and its read's error, checked.
fn mismatched(comm: NcclComm, count: usize) {
    let send = upload(&bytes(&vec![1.0f32; count]));
    let recv = alloc(4 * count);
    let r = unsafe { ncclAllReduce(send as _, recv as _, count, F32, SUM, comm, null_mut()) };
    assert_eq!(r, NCCL_SUCCESS);
    let code = try_read(recv, 4 * count).unwrap_err();
    let text = error_string(code);
    assert_eq!(code, CUDA_ERROR_LAUNCH_FAILED);
    assert!(text.contains("ncclInvalidUsage"), "{text}");
    assert!(
        text.contains("count differs: rank 0 passed 4, rank 2 passed 5"),
        "{text}"
    );
    assert_eq!(async_error(comm), NCCL_INVALID_USAGE);
}

fn async_error(comm: NcclComm) -> NcclResult {
    let mut e = NCCL_SUCCESS;
    assert_eq!(unsafe { ncclCommGetAsyncError(comm, &mut e) }, NCCL_SUCCESS);
    e
}

#[test]
fn counts_that_differ_across_processes_fail_every_rank() {
    let _g = setup();
    let id = unique_id();
    let child = spawn("mismatch", &id, TIMEOUT_MS);
    ranks_here(&[0, 1], N, id, |_, comm| mismatched(comm, 4));
    child.finish();
}

/// Joins ranks 2 and 3, says so, and exits when told, without a word to
/// the communicator.
fn exit_early(id: NcclUniqueId) {
    let comms = ranks_joined(&[2, 3], id);
    say("joined");
    assert_eq!(hear(), "exit");
    std::mem::forget(comms);
    std::process::exit(0);
}

/// Ranks 0 and 1 here enqueue an all-reduce, `between` runs with the
/// child, then they read it: the errors (code, text), the async errors
/// and how long the reads took.
fn after_child(
    child: &mut Proc,
    id: NcclUniqueId,
    between: impl FnOnce(&mut Proc),
) -> Vec<(CUresult, String, NcclResult, Duration)> {
    let ready = Barrier::new(3);
    let go = Barrier::new(3);
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|rank| {
                let (ready, go) = (&ready, &go);
                s.spawn(move || {
                    bind(rank);
                    let comm = init_rank(N, id, rank);
                    let send = upload(&bytes(&[1.0f32; 4]));
                    let recv = alloc(16);
                    let r = unsafe {
                        ncclAllReduce(send as _, recv as _, 4, F32, SUM, comm, null_mut())
                    };
                    assert_eq!(r, NCCL_SUCCESS);
                    ready.wait();
                    go.wait();
                    let t0 = Instant::now();
                    let code = try_read(recv, 16).unwrap_err();
                    let out = (code, error_string(code), async_error(comm), t0.elapsed());
                    assert_eq!(ncclCommAbort(comm), NCCL_SUCCESS);
                    out
                })
            })
            .collect();
        ready.wait();
        between(child);
        go.wait();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn a_process_that_exits_before_its_collective_fails_the_others() {
    let _g = setup();
    let id = unique_id();
    let mut child = spawn("exit", &id, TIMEOUT_MS);
    let pid = child.pid();
    let out = after_child(&mut child, id, |c| {
        c.expect("joined");
        c.tell("exit");
    });
    child.finish();
    for (code, text, asynch, waited) in out {
        assert_eq!(code, CUDA_ERROR_LAUNCH_FAILED, "{text}");
        assert!(text.contains("ncclRemoteError"), "{text}");
        assert!(
            text.contains(&format!("process {pid} (rank(s) [2, 3]) exited")),
            "{text}"
        );
        assert_eq!(asynch, NCCL_REMOTE_ERROR);
        // Seen when the connection closed, not after the timeout.
        assert!(waited < Duration::from_millis(TIMEOUT_MS / 2), "{waited:?}");
    }
}

/// Joins ranks 2 and 3 and aborts them at once; exits when told.
fn abort_early(id: NcclUniqueId) {
    for c in ranks_joined(&[2, 3], id) {
        assert_eq!(ncclCommAbort(c.0), NCCL_SUCCESS);
    }
    say("aborted");
    assert_eq!(hear(), "exit");
}

#[test]
fn an_abort_in_one_process_is_seen_by_the_others() {
    let _g = setup();
    let id = unique_id();
    let mut child = spawn("abort", &id, TIMEOUT_MS);
    let out = after_child(&mut child, id, |c| c.expect("aborted"));
    child.tell("exit");
    child.finish();
    for (code, text, asynch, waited) in out {
        assert_eq!(code, CUDA_ERROR_LAUNCH_FAILED, "{text}");
        assert!(
            text.contains("ncclRemoteError")
                && text.contains(
                    "communicator was aborted before it enqueued its part of ncclAllReduce #0"
                ),
            "{text}"
        );
        assert_eq!(asynch, NCCL_REMOTE_ERROR);
        assert!(waited < Duration::from_millis(TIMEOUT_MS / 2), "{waited:?}");
    }
}

/// Ranks 2 and 3 enqueue an all-reduce and do not synchronise until told
/// (a GPU runs it anyway: the others must not wait for this process to
/// synchronise), then check it.
fn idle_until_told(id: NcclUniqueId) {
    let comms = ranks_joined(&[2, 3], id);
    let recvs: Vec<u64> = comms
        .iter()
        .enumerate()
        .map(|(dev, c)| {
            bind(dev);
            let send = upload(&f32_input(2 + dev, 0, COUNT));
            let recv = alloc(4 * COUNT);
            let r =
                unsafe { ncclAllReduce(send as _, recv as _, COUNT, F32, SUM, c.0, null_mut()) };
            assert_eq!(r, NCCL_SUCCESS);
            recv
        })
        .collect();
    say("enqueued");
    assert_eq!(hear(), "check");
    let want: Vec<f32> = (0..COUNT).map(|i| host_f32(i, SUM)).collect();
    for (dev, (c, recv)) in comms.iter().zip(recvs).enumerate() {
        bind(dev);
        assert_eq!(read(recv, 4 * COUNT), bytes(&want));
        assert_eq!(ncclCommDestroy(c.0), NCCL_SUCCESS);
    }
}

#[test]
fn a_process_that_does_not_synchronise_still_takes_part() {
    let _g = setup();
    let id = unique_id();
    let mut child = spawn("idle", &id, TIMEOUT_MS);
    let t0 = Instant::now();
    let got = ranks_here(&[0, 1], N, id, |rank, comm| {
        all_reduce(comm, &f32_input(rank, 0, COUNT), COUNT, F32, SUM)
    });
    let want: Vec<f32> = (0..COUNT).map(|i| host_f32(i, SUM)).collect();
    for g in got {
        assert_eq!(g, bytes(&want));
    }
    assert!(t0.elapsed() < Duration::from_millis(TIMEOUT_MS / 2));
    child.expect("enqueued");
    child.tell("check");
    child.finish();
}

/// Ranks `base`, `base + 1` of 5 join (rank 4 never does): the init fails
/// with `ncclSystemError` within the timeout.
fn never_complete(base: usize, id: NcclUniqueId) {
    let t0 = Instant::now();
    let out: Vec<NcclResult> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|dev| {
                s.spawn(move || {
                    bind(dev);
                    let mut comm = null_mut();
                    unsafe { ncclCommInitRank(&mut comm, 5, id, (base + dev) as i32) }
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(out, [NCCL_SYSTEM_ERROR; 2]);
    assert!(t0.elapsed() < Duration::from_secs(15), "{:?}", t0.elapsed());
}

#[test]
fn a_rank_that_never_joins_fails_every_process_within_the_timeout() {
    let _g = setup();
    let id = unique_id();
    let a = spawn("never0", &id, SHORT_MS);
    let b = spawn("never2", &id, SHORT_MS);
    a.finish();
    b.finish();
}

/// Ranks 0 and 1 (short timeout) all-reduce while ranks 2 and 3 (another
/// child) never do: the all-reduce times out, the communicator breaks.
fn late(id: NcclUniqueId) {
    let out = ranks_here(&[0, 1], N, id, |_, comm| {
        let send = upload(&bytes(&[1.0f32; 4]));
        let recv = alloc(16);
        let r = unsafe { ncclAllReduce(send as _, recv as _, 4, F32, SUM, comm, null_mut()) };
        assert_eq!(r, NCCL_SUCCESS);
        let t0 = Instant::now();
        let code = try_read(recv, 16).unwrap_err();
        (error_string(code), async_error(comm), t0.elapsed())
    });
    for (text, asynch, waited) in &out {
        assert!(
            text.contains("ncclRemoteError")
                && text.contains("timed out after 1500 ms")
                && text.contains("waiting for rank(s) [2, 3]"),
            "{text}"
        );
        assert_eq!(*asynch, NCCL_REMOTE_ERROR);
        assert!(*waited < Duration::from_secs(15), "{waited:?}");
    }
    // The rank that timed out waited the timeout (the other may have
    // begun waiting later).
    let longest = out.iter().map(|x| x.2).max().unwrap();
    assert!(longest >= Duration::from_millis(SHORT_MS), "{longest:?}");
    say("timed out");
}

/// Ranks 2 and 3 join and wait until told; then their communicator is
/// broken: the asynchronous error is set and new calls are refused.
fn stuck(id: NcclUniqueId) {
    let comms = ranks_joined(&[2, 3], id);
    assert_eq!(hear(), "check");
    for (dev, c) in comms.iter().enumerate() {
        bind(dev);
        // The break travels through the hub: it may still be on its way.
        let t0 = Instant::now();
        while async_error(c.0) == NCCL_SUCCESS && t0.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(async_error(c.0), NCCL_REMOTE_ERROR);
        let b = alloc(4);
        let r = unsafe { ncclAllReduce(b as _, b as _, 1, F32, SUM, c.0, null_mut()) };
        assert_eq!(r, NCCL_REMOTE_ERROR);
        assert_eq!(ncclCommDestroy(c.0), NCCL_SUCCESS);
    }
}

#[test]
fn a_process_that_never_reaches_a_collective_times_the_others_out() {
    let _g = setup();
    let id = unique_id();
    let mut late = spawn("late", &id, SHORT_MS);
    let mut stuck = spawn("stuck", &id, SHORT_MS);
    late.expect("timed out");
    stuck.tell("check");
    late.finish();
    stuck.finish();
}

/// Makes a unique id, says it, joins ranks 0 and 1 with it and waits (to
/// be killed).
fn creator() {
    let id = unique_id();
    say(&format!("id {}", hex(&id)));
    let _comms = ranks_joined(&[0, 1], id);
    say("joined");
    let _ = hear();
}

/// Ranks 2 and 3 of the creator's id enqueue an all-reduce; once told
/// (the creator was killed) they read it: an error, not a hang.
fn orphan(id: NcclUniqueId) {
    let comms = ranks_joined(&[2, 3], id);
    let recvs: Vec<u64> = comms
        .iter()
        .enumerate()
        .map(|(dev, c)| {
            bind(dev);
            let b = upload(&bytes(&[1.0f32; 4]));
            let r = unsafe { ncclAllReduce(b as _, b as _, 4, F32, SUM, c.0, null_mut()) };
            assert_eq!(r, NCCL_SUCCESS);
            b
        })
        .collect();
    say("enqueued");
    assert_eq!(hear(), "read");
    for (dev, (c, b)) in comms.iter().zip(recvs).enumerate() {
        bind(dev);
        let t0 = Instant::now();
        let code = try_read(b, 16).unwrap_err();
        let text = error_string(code);
        assert!(
            text.contains("ncclRemoteError") && text.contains("lost the connection to process"),
            "{text}"
        );
        assert!(t0.elapsed() < Duration::from_millis(TIMEOUT_MS / 2));
        assert_eq!(async_error(c.0), NCCL_REMOTE_ERROR);
        assert_eq!(ncclCommAbort(c.0), NCCL_SUCCESS);
    }
}

/// Makes the unique id (the hub), joins ranks 0 and 1, destroys them as
/// soon as every rank has joined and ends (the process exits).
fn hub_done_first() {
    let id = unique_id();
    say(&format!("id {}", hex(&id)));
    let comms = ranks_joined(&[0, 1], id);
    for (dev, c) in comms.iter().enumerate() {
        bind(dev);
        assert_eq!(ncclCommDestroy(c.0), NCCL_SUCCESS);
    }
    say("destroyed");
}

/// Rank 3 alone: once told, receives 4 floats from rank 2 and checks them.
fn receiver(id: NcclUniqueId) {
    let comms = ranks_joined(&[3], id);
    bind(0);
    let recv = alloc(16);
    assert_eq!(hear(), "receive");
    let r = unsafe { ncclRecv(recv as _, 4, F32, 2, comms[0].0, null_mut()) };
    assert_eq!(r, NCCL_SUCCESS);
    assert_eq!(read(recv, 16), bytes(&[1.5f32, 2.5, 3.5, 4.5]));
    assert_eq!(ncclCommDestroy(comms[0].0), NCCL_SUCCESS);
    say("received");
}

/// The process that made the id relays the other processes' operations:
/// when its own ranks are destroyed first, it stays (at exit, until the
/// other ranks have ended, at most its NCCL timeout) so that ranks 2 and 3,
/// in two other processes, still exchange through it afterwards.
#[test]
fn a_hub_whose_ranks_end_first_still_relays_the_others() {
    let _g = setup();
    let mut hub = spawn("hub_first", &unique_id(), TIMEOUT_MS);
    let line = hub.line_where("id …", |l| l.starts_with("id "));
    let id = unhex(&line[3..]);
    let mut rx = spawn("receiver", &id, TIMEOUT_MS);
    let comms = ranks_joined(&[2], id);
    bind(0);
    hub.expect("destroyed");
    // Time for the hub's process to end, were it not waiting.
    std::thread::sleep(Duration::from_millis(500));
    let send = upload(&bytes(&[1.5f32, 2.5, 3.5, 4.5]));
    rx.tell("receive");
    let r = unsafe { ncclSend(send as _, 4, F32, 3, comms[0].0, null_mut()) };
    assert_eq!(r, NCCL_SUCCESS);
    read(send, 16);
    rx.expect("received");
    assert_eq!(ncclCommDestroy(comms[0].0), NCCL_SUCCESS);
    rx.finish();
    hub.finish();
}

#[test]
fn a_killed_creator_fails_the_other_process() {
    let _g = setup();
    let mut creator = spawn("creator", &unique_id(), TIMEOUT_MS);
    let line = creator.line_where("id …", |l| l.starts_with("id "));
    let id = unhex(&line[3..]);
    let mut orphan = spawn("orphan", &id, TIMEOUT_MS);
    creator.expect("joined");
    orphan.expect("enqueued");
    creator.kill();
    orphan.tell("read");
    orphan.finish();
}

/// A frame holding `payload`: its length, then it.
fn frame(payload: &[u8]) -> Vec<u8> {
    let mut f = (payload.len() as u64).to_le_bytes().to_vec();
    f.extend_from_slice(payload);
    f
}

#[test]
fn strangers_on_the_listener_are_refused_without_harm() {
    let _g = setup();
    let id = unique_id();
    let b: Vec<u8> = id.internal.iter().map(|&x| x as u8).collect();
    let port = u16::from_le_bytes([b[24], b[25]]);
    let addr = format!("{}.{}.{}.{}:{port}", b[20], b[21], b[22], b[23]);
    // Garbage, a frame longer than anything allowed, a cut-short frame.
    for junk in [
        b"GET / HTTP/1.0\r\n\r\n".to_vec(),
        u64::MAX.to_le_bytes().to_vec(),
        frame(&[1, 2, 3])[..6].to_vec(),
    ] {
        let mut s = TcpStream::connect(&addr).unwrap();
        s.write_all(&junk).unwrap();
        let _ = s.shutdown(std::net::Shutdown::Write);
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
    }
    // A hello for an id this process never made: refused in words.
    let mut hello = vec![1u8];
    hello.extend_from_slice(b"gpusimN1");
    hello.extend_from_slice(&999u64.to_le_bytes());
    hello.extend_from_slice(&std::process::id().to_le_bytes());
    hello.extend_from_slice(&1u32.to_le_bytes());
    let mut s = TcpStream::connect(&addr).unwrap();
    s.write_all(&frame(&hello)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut len = [0u8; 8];
    s.read_exact(&mut len).unwrap();
    let mut msg = vec![0u8; u64::from_le_bytes(len) as usize];
    s.read_exact(&mut msg).unwrap();
    assert_eq!(
        (msg[0], msg[1]),
        (4, NCCL_INVALID_USAGE as u8),
        "JoinFailed"
    );
    assert!(String::from_utf8_lossy(&msg).contains("made no such id"));
    drop(s);
    // The listener still serves: a communicator across processes works.
    let child = spawn("mismatch", &id, TIMEOUT_MS);
    ranks_here(&[0, 1], N, id, |_, comm| mismatched(comm, 4));
    child.finish();
}
