//! The collective and point-to-point entry points: arguments checked at
//! the call (as NCCL does: types, operators, roots and peers, buffers
//! inside live allocations of the communicator's device), then the
//! operation is enqueued on its stream — at once, or at `ncclGroupEnd`
//! inside a group — and numbered for matching with the other ranks.

use super::comm::comm_ref;
use super::reduce::{DataType, RedOp};
use super::state::{Call, CommRef, Item, Key, Kind, Part, Posted, Status};
use super::*;
use crate::driver::consts::CU_STREAM_PER_THREAD;
use crate::driver::lock::notify;
use crate::driver::state::Op;
use crate::profile::{record, Event};

/// An operation checked at its call, waiting to be enqueued.
#[derive(Clone, Debug)]
pub struct Queued {
    /// The communicator handle.
    pub comm: u64,
    /// Its clique and rank.
    pub cref: CommRef,
    /// Its device.
    pub device: usize,
    /// The stream's queue key on that device.
    pub stream: u64,
    /// The call.
    pub call: Call,
}

/// The communicator `comm` if it accepts new operations: live, not
/// finalized, without an asynchronous error, not broken by a timeout.
fn usable(sim: &SimLock, comm: NcclComm) -> NResult<CommRef> {
    let c = comm_ref(sim, comm)?;
    let clique = &sim.nccl.cliques[&c.clique];
    let r = &clique.ranks[c.rank];
    if r.status == Status::Finalized {
        return nfail(
            NCCL_INVALID_USAGE,
            "the communicator was finalized (ncclCommFinalize)",
        );
    }
    if let Some(f) = r.async_error.as_ref().or(clique.broken.as_ref()) {
        return nfail(
            f.code,
            format!(
                "the communicator has an asynchronous error (abort it): {}",
                f.msg
            ),
        );
    }
    Ok(c)
}

/// The queue key of `stream` on device `dev`: the null, legacy and
/// per-thread handles are its default stream; a created stream must belong
/// to `dev` (NCCL runs on the communicator's device whatever context is
/// current, so the current context does not matter here).
fn stream_key(sim: &SimLock, dev: usize, stream: *mut c_void) -> NResult<u64> {
    if sim.devices[dev].primary_refs == 0 {
        return nfail(
            NCCL_UNHANDLED_CUDA_ERROR,
            format!("device {dev} has no context (retain its primary context first)"),
        );
    }
    let s = stream as u64;
    if s <= CU_STREAM_PER_THREAD {
        return Ok(0);
    }
    match sim.streams.get(&s) {
        Some(&d) if d == dev => Ok(s),
        Some(&d) => nfail(
            NCCL_INVALID_ARGUMENT,
            format!("stream {s:#x} belongs to device {d}, the communicator to device {dev}"),
        ),
        None => nfail(
            NCCL_INVALID_ARGUMENT,
            format!("{s:#x} is not a live stream"),
        ),
    }
}

/// Checks that `len` bytes at `addr` lie in one live allocation of `dev`.
/// Memory already freed in stream order is left to the run, which faults
/// on it at every timing (as cuBLAS's footprint check does).
fn check_buf(sim: &SimLock, dev: usize, addr: u64, len: usize, what: &str) -> NResult<()> {
    if len == 0 {
        return Ok(());
    }
    if addr == 0 {
        return nfail(NCCL_INVALID_ARGUMENT, format!("{what} is null"));
    }
    let mem = &sim.devices[dev].mem;
    if mem.inside_freed(addr, len as u64) {
        return Ok(());
    }
    mem.find(addr, len as u64).map(|_| ()).map_err(|e| NErr {
        code: NCCL_INVALID_ARGUMENT,
        msg: format!("{what} ({len} bytes at {addr:#x}) is not inside one live allocation of device {dev}: {e}"),
    })
}

/// The raw arguments of any entry point.
struct Args {
    kind: Kind,
    send: u64,
    recv: u64,
    count: usize,
    dtype: u32,
    op: u32,
    root: c_int,
}

/// Checks `a` for rank `rank` of `nranks` on device `dev`.
fn check_call(sim: &SimLock, rank: usize, nranks: usize, dev: usize, a: &Args) -> NResult<Call> {
    let bad = |msg: String| nfail(NCCL_INVALID_ARGUMENT, msg);
    let Some(dtype) = DataType::from_raw(a.dtype) else {
        return bad(format!("datatype {} is not an ncclDataType_t", a.dtype));
    };
    let mut op = RedOp::Sum;
    if a.kind.reduces() {
        op = match RedOp::from_raw(a.op) {
            Some(op) => op,
            None => return bad(format!("op {} is not ncclSum, ncclProd, ncclMax, ncclMin or ncclAvg (custom operators are not simulated)", a.op)),
        };
        if !dtype.reducible() {
            return bad(format!("reductions of {dtype:?} are not simulated"));
        }
    }
    let peer = matches!(a.kind, Kind::Send | Kind::Recv);
    let mut root = 0;
    if a.kind.rooted() || peer {
        let what = if peer { "peer" } else { "root" };
        if a.root < 0 || a.root as usize >= nranks {
            return bad(format!("{what} {} is not a rank of {nranks}", a.root));
        }
        root = a.root as usize;
    }
    let overflow = || NErr {
        code: NCCL_INVALID_ARGUMENT,
        msg: format!("count {} × {} ranks overflows", a.count, nranks),
    };
    let bytes = a.count.checked_mul(dtype.size()).ok_or_else(overflow)?;
    let all = bytes.checked_mul(nranks).ok_or_else(overflow)?;
    let (send_len, recv_len) = match a.kind {
        Kind::AllReduce => (bytes, bytes),
        Kind::Broadcast => (if rank == root { bytes } else { 0 }, bytes),
        Kind::Reduce => (bytes, if rank == root { bytes } else { 0 }),
        Kind::AllGather => (bytes, all),
        Kind::ReduceScatter => (all, bytes),
        Kind::Send => (bytes, 0),
        Kind::Recv => (0, bytes),
    };
    check_buf(sim, dev, a.send, send_len, "sendbuff")?;
    check_buf(sim, dev, a.recv, recv_len, "recvbuff")?;
    Ok(Call {
        kind: a.kind,
        send: if send_len > 0 { a.send } else { 0 },
        recv: if recv_len > 0 { a.recv } else { 0 },
        count: a.count,
        dtype,
        op,
        root,
    })
}

/// Checks one call and enqueues it (or keeps it for `ncclGroupEnd`).
fn submit(func: &str, comm: NcclComm, stream: *mut c_void, a: Args) -> NcclResult {
    nccl_api(func, |sim| {
        let c = usable(sim, comm)?;
        let clique = &sim.nccl.cliques[&c.clique];
        let (dev, nranks) = (clique.ranks[c.rank].device, clique.nranks());
        let key = stream_key(sim, dev, stream)?;
        let call = check_call(sim, c.rank, nranks, dev, &a)?;
        let q = Queued {
            comm: comm as u64,
            cref: c,
            device: dev,
            stream: key,
            call,
        };
        if group::in_group() {
            group::add_op(q);
            Ok(())
        } else {
            enqueue(sim, vec![q])
        }
    })
}

/// Numbers `call` of rank `c`: its collective number, or its transfer
/// number with the peer.
fn next_key(sim: &mut SimLock, c: CommRef, call: &Call) -> Key {
    let r = &mut sim.nccl.clique(c.clique).ranks[c.rank];
    let bump = |n: &mut u64| {
        *n += 1;
        *n - 1
    };
    match call.kind {
        Kind::Send => Key::P2p {
            src: c.rank,
            dst: call.root,
            n: bump(r.sent.entry(call.root).or_default()),
        },
        Kind::Recv => Key::P2p {
            src: call.root,
            dst: c.rank,
            n: bump(r.received.entry(call.root).or_default()),
        },
        _ => Key::Coll(bump(&mut r.coll_seq)),
    }
}

/// Enqueues `ops` (all checked): one queue item per (device, stream), in
/// order of first use, each operation numbered and posted for matching.
/// Nothing is enqueued if a communicator stopped accepting operations
/// since its call.
pub fn enqueue(sim: &mut SimLock, ops: Vec<Queued>) -> NResult<()> {
    for q in &ops {
        usable(sim, q.comm as NcclComm)?;
    }
    let mut places: Vec<(usize, u64)> = Vec::new();
    for q in &ops {
        if !places.contains(&(q.device, q.stream)) {
            places.push((q.device, q.stream));
        }
    }
    for (dev, stream) in places {
        let mut parts = Vec::new();
        for q in ops.iter().filter(|q| (q.device, q.stream) == (dev, stream)) {
            let key = next_key(sim, q.cref, &q.call);
            let nranks = sim.nccl.clique(q.cref.clique).nranks();
            record(Event::Collective(q.call.kind, q.call.bytes(nranks)));
            parts.push(Part {
                clique: q.cref.clique,
                rank: q.cref.rank,
                key,
                call: q.call,
            });
        }
        let posts: Vec<(u64, usize, Key)> =
            parts.iter().map(|p| (p.clique, p.rank, p.key)).collect();
        let work = sim.enqueue(dev, stream, Op::Nccl(Box::new(Item { parts })));
        for (clique, rank, key) in posts {
            let c = sim.nccl.clique(clique);
            c.queued += 1;
            let posted = Posted { device: dev, work };
            c.posted.entry(key).or_default().insert(rank, posted);
        }
    }
    // Ranks of other processes may be waiting for these parts already.
    let mut cliques: Vec<u64> = ops.iter().map(|q| q.cref.clique).collect();
    cliques.sort_unstable();
    cliques.dedup();
    for c in cliques {
        super::net::kick(sim, c);
    }
    notify();
    Ok(())
}

/// `ncclAllReduce`: every rank's `recvbuff` gets the reduction of every
/// rank's `sendbuff` (`count` elements), in rank order.
///
/// # Safety
/// The buffers are device addresses, checked against the allocations.
#[no_mangle]
pub unsafe extern "C" fn ncclAllReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: u32,
    op: u32,
    comm: NcclComm,
    stream: *mut c_void,
) -> NcclResult {
    let (send, recv, root) = (sendbuff as u64, recvbuff as u64, 0);
    let kind = Kind::AllReduce;
    let a = Args {
        kind,
        send,
        recv,
        count,
        dtype: datatype,
        op,
        root,
    };
    submit("ncclAllReduce", comm, stream, a)
}

/// `ncclBroadcast`: every rank's `recvbuff` gets `root`'s `sendbuff`
/// (read on the root only).
///
/// # Safety
/// The buffers are device addresses, checked against the allocations.
#[no_mangle]
pub unsafe extern "C" fn ncclBroadcast(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: u32,
    root: c_int,
    comm: NcclComm,
    stream: *mut c_void,
) -> NcclResult {
    let (send, recv, kind) = (sendbuff as u64, recvbuff as u64, Kind::Broadcast);
    let a = Args {
        kind,
        send,
        recv,
        count,
        dtype: datatype,
        op: 0,
        root,
    };
    submit("ncclBroadcast", comm, stream, a)
}

/// `ncclBcast`: the in-place broadcast of `buff`.
///
/// # Safety
/// The buffer is a device address, checked against the allocations.
#[no_mangle]
pub unsafe extern "C" fn ncclBcast(
    buff: *mut c_void,
    count: usize,
    datatype: u32,
    root: c_int,
    comm: NcclComm,
    stream: *mut c_void,
) -> NcclResult {
    let (send, recv, kind) = (buff as u64, buff as u64, Kind::Broadcast);
    let a = Args {
        kind,
        send,
        recv,
        count,
        dtype: datatype,
        op: 0,
        root,
    };
    submit("ncclBcast", comm, stream, a)
}

/// `ncclReduce`: `root`'s `recvbuff` (written on the root only) gets the
/// reduction of every rank's `sendbuff`.
///
/// # Safety
/// The buffers are device addresses, checked against the allocations.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn ncclReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: u32,
    op: u32,
    root: c_int,
    comm: NcclComm,
    stream: *mut c_void,
) -> NcclResult {
    let (send, recv, kind) = (sendbuff as u64, recvbuff as u64, Kind::Reduce);
    let a = Args {
        kind,
        send,
        recv,
        count,
        dtype: datatype,
        op,
        root,
    };
    submit("ncclReduce", comm, stream, a)
}

/// `ncclAllGather`: every rank's `recvbuff` (nranks × `sendcount`
/// elements) gets rank r's `sendbuff` at element r × `sendcount`.
///
/// # Safety
/// The buffers are device addresses, checked against the allocations.
#[no_mangle]
pub unsafe extern "C" fn ncclAllGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: u32,
    comm: NcclComm,
    stream: *mut c_void,
) -> NcclResult {
    let (send, recv, kind) = (sendbuff as u64, recvbuff as u64, Kind::AllGather);
    let a = Args {
        kind,
        send,
        recv,
        count: sendcount,
        dtype: datatype,
        op: 0,
        root: 0,
    };
    submit("ncclAllGather", comm, stream, a)
}

/// `ncclReduceScatter`: rank r's `recvbuff` (`recvcount` elements) gets
/// the reduction of block r of every rank's `sendbuff` (nranks ×
/// `recvcount` elements).
///
/// # Safety
/// The buffers are device addresses, checked against the allocations.
#[no_mangle]
pub unsafe extern "C" fn ncclReduceScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: u32,
    op: u32,
    comm: NcclComm,
    stream: *mut c_void,
) -> NcclResult {
    let (send, recv, kind) = (sendbuff as u64, recvbuff as u64, Kind::ReduceScatter);
    let a = Args {
        kind,
        send,
        recv,
        count: recvcount,
        dtype: datatype,
        op,
        root: 0,
    };
    submit("ncclReduceScatter", comm, stream, a)
}

/// `ncclSend`: `count` elements to rank `peer`, matched with its `n`-th
/// `ncclRecv` from this rank.
///
/// # Safety
/// The buffer is a device address, checked against the allocations.
#[no_mangle]
pub unsafe extern "C" fn ncclSend(
    sendbuff: *const c_void,
    count: usize,
    datatype: u32,
    peer: c_int,
    comm: NcclComm,
    stream: *mut c_void,
) -> NcclResult {
    let (send, kind) = (sendbuff as u64, Kind::Send);
    let a = Args {
        kind,
        send,
        recv: 0,
        count,
        dtype: datatype,
        op: 0,
        root: peer,
    };
    submit("ncclSend", comm, stream, a)
}

/// `ncclRecv`: `count` elements from rank `peer`.
///
/// # Safety
/// The buffer is a device address, checked against the allocations.
#[no_mangle]
pub unsafe extern "C" fn ncclRecv(
    recvbuff: *mut c_void,
    count: usize,
    datatype: u32,
    peer: c_int,
    comm: NcclComm,
    stream: *mut c_void,
) -> NcclResult {
    let (recv, kind) = (recvbuff as u64, Kind::Recv);
    let a = Args {
        kind,
        send: 0,
        recv,
        count,
        dtype: datatype,
        op: 0,
        root: peer,
    };
    submit("ncclRecv", comm, stream, a)
}
