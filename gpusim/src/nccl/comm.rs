//! Communicators: unique ids, the rendezvous of `ncclCommInitRank` (ranks
//! of other processes join it through `join`), `ncclCommInitAll`,
//! finalize/destroy/abort, and the queries.

use super::join::{self, Procs};
use super::state::{CommRef, Failure, NcclState, Rendezvous, Status};
use super::transport::{make_id, parse_id};
use super::*;
use crate::driver::lock::notify;
use crate::driver::state::{handle, id_of, Sim};
use std::time::Instant;

/// `ncclGetUniqueId`: a fresh id naming this process and its listener
/// (opened on first use, see `transport`). Needs no `cuInit`.
///
/// # Safety
/// `unique_id` must be null or writable.
#[no_mangle]
pub unsafe extern "C" fn ncclGetUniqueId(unique_id: *mut NcclUniqueId) -> NcclResult {
    match put(unique_id, make_id(), "uniqueId") {
        Ok(()) => NCCL_SUCCESS,
        Err(e) => report("ncclGetUniqueId", e),
    }
}

/// Fails rendezvous `rv` (every rank waiting in it returns `f`, ranks of
/// other processes too).
pub fn fail_rendezvous(procs: &Procs, rv: &mut Rendezvous, f: Failure) -> NErr {
    rv.failed.get_or_insert(f.clone());
    procs.tell_failed(rv.remote.values(), &f);
    notify();
    f.into()
}

/// Joins rank `rank` of `nranks`, on the current context's device, to the
/// rendezvous of unique-id serial `serial`; returns the handle made for
/// it (registered once every rank has joined).
fn join(sim: &mut SimLock, serial: u64, nranks: c_int, rank: c_int) -> NResult<u64> {
    let (dev, n, r) = joining_rank(sim, nranks, rank)?;
    let h = handle(TAG_COMM, sim.new_id()) as u64;
    admit(&mut sim.nccl, serial, n, r, (dev, h, None))?;
    Ok(h)
}

/// A joining rank's device (the current context's) and its `nranks` and
/// `rank`, checked: `(device, n, r)`.
pub fn joining_rank(sim: &Sim, nranks: c_int, rank: c_int) -> NResult<(usize, usize, usize)> {
    let dev = sim.current_device().map_err(|e| NErr {
        code: NCCL_UNHANDLED_CUDA_ERROR,
        msg: format!("{} (the communicator's device is the current one's)", e.msg),
    })?;
    if nranks < 1 || rank < 0 || rank >= nranks {
        return nfail(
            NCCL_INVALID_ARGUMENT,
            format!("rank {rank} of nranks {nranks}: need 0 ≤ rank < nranks"),
        );
    }
    Ok((dev, nranks as usize, rank as usize))
}

/// Admits rank `r` of `n` to the rendezvous of serial `serial`: on device
/// `dev` with handle `h` (0 for a rank of another process), joined through
/// connection `chan` if it is of another process. Ranks disagreeing on
/// `nranks`, a rank twice, two ranks of one process on one device fail
/// every joiner; the last rank makes the clique.
pub fn admit(
    nc: &mut NcclState,
    serial: u64,
    n: usize,
    r: usize,
    (dev, h, chan): (usize, u64, Option<u64>),
) -> NResult<()> {
    let procs = &nc.procs;
    let rv = nc.rendezvous.entry(serial).or_insert(Rendezvous {
        nranks: n,
        joined: Default::default(),
        remote: Default::default(),
        clique: None,
        failed: None,
        collected: 0,
    });
    if let Some(f) = &rv.failed {
        return nfail(
            NCCL_REMOTE_ERROR,
            format!("the other ranks of this unique id failed: {}", f.msg),
        );
    }
    if rv.clique.is_some() {
        // Complete already: a stray joiner must not break the others' init.
        return nfail(
            NCCL_INVALID_USAGE,
            format!(
                "all {} ranks of this unique id have joined already (rank {r} twice?)",
                rv.nranks
            ),
        );
    }
    if rv.nranks != n {
        let first = rv.joined.keys().next().copied().unwrap_or(0);
        let msg = format!(
            "rank {r} passed nranks = {n}, but rank {first} passed nranks = {}",
            rv.nranks
        );
        return Err(fail_rendezvous(
            procs,
            rv,
            Failure::new(NCCL_INVALID_USAGE, msg),
        ));
    }
    if rv.joined.contains_key(&r) {
        let msg = format!("rank {r} joined this unique id twice");
        return Err(fail_rendezvous(
            procs,
            rv,
            Failure::new(NCCL_INVALID_USAGE, msg),
        ));
    }
    let same_place = |other: &usize| rv.remote.get(other) == chan.as_ref();
    if let Some((other, _)) = rv.joined.iter().find(|(o, j)| j.0 == dev && same_place(o)) {
        let msg = format!(
            "ranks {other} and {r} are both on device {dev} (one device per rank, as NCCL requires)"
        );
        return Err(fail_rendezvous(
            procs,
            rv,
            Failure::new(NCCL_INVALID_USAGE, msg),
        ));
    }
    rv.joined.insert(r, (dev, h));
    if let Some(c) = chan {
        rv.remote.insert(r, c);
    }
    if rv.joined.len() == n {
        complete(nc, serial);
    }
    notify();
    Ok(())
}

/// Makes the clique of complete rendezvous `serial` (with its transport
/// and the other processes told, if it spans processes).
fn complete(nc: &mut NcclState, serial: u64) {
    let Some(rv) = nc.rendezvous.get(&serial) else {
        return;
    };
    let members: Vec<(usize, u64)> = rv.joined.values().copied().collect();
    let remote = rv.remote.clone();
    let id = nc.new_clique(&members);
    join::make_hub(nc, id, &remote);
    if let Some(rv) = nc.rendezvous.get_mut(&serial) {
        rv.clique = Some(id);
        // Ranks of other processes are collected by their processes.
        rv.collected += remote.len();
        if rv.collected == rv.nranks {
            nc.rendezvous.remove(&serial);
        }
    }
}

/// Waits (lock released) until every rank of rendezvous `serial` has
/// joined, or fails it once `deadline` passes.
pub fn wait_joined(sim: &mut SimLock, serial: u64, deadline: Instant) -> NResult<()> {
    let timeout_ms = sim.nccl.timeout.as_millis();
    loop {
        let Some(rv) = sim.nccl.rendezvous.get_mut(&serial) else {
            return nfail(NCCL_INTERNAL_ERROR, "the rendezvous vanished");
        };
        if rv.clique.is_some() {
            rv.collected += 1;
            if rv.collected == rv.nranks {
                sim.nccl.rendezvous.remove(&serial);
            }
            return Ok(());
        }
        if let Some(f) = &rv.failed {
            return Err(f.clone().into());
        }
        if Instant::now() >= deadline {
            let missing: Vec<usize> = (0..rv.nranks)
                .filter(|r| !rv.joined.contains_key(r))
                .collect();
            let msg = format!(
                "timed out after {timeout_ms} ms (GPUSIM_NCCL_TIMEOUT_MS) waiting for rank(s) {missing:?} of {} to join (ncclCommInitRank)",
                rv.nranks
            );
            let f = Failure::new(NCCL_SYSTEM_ERROR, msg);
            let nc = &mut sim.nccl;
            let Some(rv) = nc.rendezvous.get_mut(&serial) else {
                return Err(f.into());
            };
            return Err(fail_rendezvous(&nc.procs, rv, f));
        }
        sim.wait_until(deadline);
    }
}

/// `ncclCommInitRank` and `…Config`: joins and, outside a group, waits
/// for the other ranks (inside one, `ncclGroupEnd` waits).
unsafe fn init_rank(
    func: &str,
    comm: *mut NcclComm,
    nranks: c_int,
    id: NcclUniqueId,
    rank: c_int,
) -> NcclResult {
    nccl_api(func, |sim| {
        if comm.is_null() {
            return nfail(NCCL_INVALID_ARGUMENT, "comm is null");
        }
        let id = parse_id(&id)?;
        let start = Instant::now();
        let deadline = start + sim.nccl.timeout;
        let (h, init) = if id.pid == std::process::id() {
            let h = join(sim, id.serial, nranks, rank)?;
            (h, group::Init::Local(id.serial))
        } else {
            let h = join::join_remote(sim, &id, nranks, rank)?;
            (h, group::Init::Remote(id.pid, id.serial))
        };
        if group::in_group() {
            group::add_init(init);
        } else {
            group::wait_init(sim, init, deadline)?;
        }
        *comm = h as NcclComm;
        Ok(())
    })
}

/// `ncclCommInitRank`: rank `rank` of `nranks` on the current context's
/// device; returns once every rank has joined (or fails after
/// `GPUSIM_NCCL_TIMEOUT_MS` with `ncclSystemError`).
///
/// # Safety
/// `comm` must be null or writable.
#[no_mangle]
pub unsafe extern "C" fn ncclCommInitRank(
    comm: *mut NcclComm,
    nranks: c_int,
    comm_id: NcclUniqueId,
    rank: c_int,
) -> NcclResult {
    init_rank("ncclCommInitRank", comm, nranks, comm_id, rank)
}

/// `ncclCommInitRankConfig`: as [`ncclCommInitRank`]; the configuration is
/// not read (initialisation is always blocking, which a non-blocking
/// caller also accepts: the communicator is ready when it returns).
///
/// # Safety
/// `comm` must be null or writable.
#[no_mangle]
pub unsafe extern "C" fn ncclCommInitRankConfig(
    comm: *mut NcclComm,
    nranks: c_int,
    comm_id: NcclUniqueId,
    rank: c_int,
    _config: *mut c_void,
) -> NcclResult {
    init_rank("ncclCommInitRankConfig", comm, nranks, comm_id, rank)
}

/// `ncclCommInitAll`: one communicator of `ndev` ranks, rank `i` on
/// `devlist[i]` (device `i` when `devlist` is null), made at once by the
/// calling thread.
///
/// # Safety
/// `comms` must hold `ndev` writable handles; `devlist` must be null or
/// hold `ndev` device ordinals.
#[no_mangle]
pub unsafe extern "C" fn ncclCommInitAll(
    comms: *mut NcclComm,
    ndev: c_int,
    devlist: *const c_int,
) -> NcclResult {
    nccl_api("ncclCommInitAll", |sim| {
        if comms.is_null() || ndev < 1 {
            return nfail(
                NCCL_INVALID_ARGUMENT,
                format!("comms is null or ndev = {ndev} < 1"),
            );
        }
        let mut devices = Vec::new();
        for i in 0..ndev as usize {
            let ordinal = if devlist.is_null() {
                i as c_int
            } else {
                *devlist.add(i)
            };
            let d = sim.device(ordinal).map_err(|e| NErr {
                code: NCCL_INVALID_ARGUMENT,
                msg: format!("devlist[{i}]: {}", e.msg),
            })?;
            if let Some(j) = devices.iter().position(|&x| x == d) {
                return nfail(
                    NCCL_INVALID_USAGE,
                    format!(
                        "devlist[{j}] and devlist[{i}] are both device {d} (one device per rank)"
                    ),
                );
            }
            devices.push(d);
        }
        let members: Vec<(usize, u64)> = devices
            .iter()
            .map(|&d| (d, handle(TAG_COMM, sim.new_id()) as u64))
            .collect();
        sim.nccl.new_clique(&members);
        for (i, &(_, h)) in members.iter().enumerate() {
            *comms.add(i) = h as NcclComm;
        }
        Ok(())
    })
}

/// The live handle `comm`'s clique and rank.
pub fn comm_ref(sim: &SimLock, comm: NcclComm) -> NResult<CommRef> {
    match sim.nccl.comms.get(&(comm as u64)) {
        Some(&c) if id_of(comm, TAG_COMM).is_some() => Ok(c),
        _ => nfail(
            NCCL_INVALID_ARGUMENT,
            format!("{comm:p} is not a live communicator (destroyed, aborted, or its ncclGroupEnd has not run)"),
        ),
    }
}

/// Runs the queue of rank `c`'s device up to its last posted operation
/// (waiting for the other ranks, lock released, as a synchronisation does).
fn flush(sim: &mut SimLock, c: CommRef) {
    let clique = sim.nccl.clique(c.clique);
    let dev = clique.ranks[c.rank].device;
    let last = clique
        .posted
        .values()
        .filter_map(|m| m.get(&c.rank))
        .map(|p| p.work)
        .max();
    if let Some(w) = last {
        sim.drain_to(dev, w);
    }
}

/// `ncclCommFinalize`: runs the communicator's queued operations (waiting
/// for the other ranks); returns its asynchronous error, if any. No new
/// operations are accepted afterwards.
#[no_mangle]
pub extern "C" fn ncclCommFinalize(comm: NcclComm) -> NcclResult {
    nccl_api("ncclCommFinalize", |sim| {
        let c = comm_ref(sim, comm)?;
        flush(sim, c);
        let r = &mut sim.nccl.clique(c.clique).ranks[c.rank];
        if r.status == Status::Live {
            r.status = Status::Finalized;
            super::netfail::rank_ended(sim, c.clique, c.rank, "finalized");
        }
        let r = &sim.nccl.clique(c.clique).ranks[c.rank];
        match &r.async_error {
            Some(f) => Err(f.clone().into()),
            None => Ok(()),
        }
    })
}

/// Ends rank `c`'s handle (`how`: "destroyed" or "aborted"); the other
/// ranks' operations that still need this rank fail with
/// `ncclRemoteError` when they run.
fn end(sim: &mut SimLock, comm: NcclComm, c: CommRef, how: &'static str) {
    sim.nccl.comms.remove(&(comm as u64));
    sim.nccl.clique(c.clique).ranks[c.rank].status = Status::Gone(how);
    super::netfail::rank_ended(sim, c.clique, c.rank, how);
    sim.nccl.drop_if_done(c.clique);
    join::await_closing(sim);
    notify();
}

/// `ncclCommDestroy`: finalizes (unless done) and frees the handle.
/// Always succeeds on a live handle (errors were reported already).
#[no_mangle]
pub extern "C" fn ncclCommDestroy(comm: NcclComm) -> NcclResult {
    nccl_api("ncclCommDestroy", |sim| {
        let c = comm_ref(sim, comm)?;
        if sim.nccl.clique(c.clique).ranks[c.rank].status == Status::Live {
            flush(sim, c);
        }
        end(sim, comm, c, "destroyed");
        if relaying(sim) {
            linger_at_exit_once();
        }
        Ok(())
    })
}

/// Whether this process is the hub of a communicator between processes
/// (see `net`) whose own ranks have all ended while another process's
/// ranks are still live: it still relays their operations.
fn relaying(sim: &Sim) -> bool {
    sim.nccl.cliques.values().any(|c| {
        let hub = c.net.as_ref().is_some_and(|n| n.hub);
        let ended = |r: &super::state::RankInfo| matches!(r.status, Status::Gone(_));
        let (own, others): (Vec<_>, Vec<_>) = c.ranks.iter().partition(|r| r.remote.is_none());
        hub && own.iter().all(|r| ended(r)) && !others.iter().all(|r| ended(r))
    })
}

extern "C" {
    fn atexit(cb: extern "C" fn()) -> i32;
}

/// At the exit of a hub process: waits (lock released, at most the NCCL
/// timeout) until the other processes' ranks have ended, so that outcomes
/// it decided but had not delivered yet do not go with it — a real NCCL
/// rank's transfers are done when its operation is, a relay's are not. A
/// process that exits with live ranks of its own does not wait (the
/// others are told it went).
extern "C" fn linger_at_exit() {
    let g = crate::driver::state::lock();
    if g.is_none() {
        return;
    }
    let mut sim = SimLock::new(g);
    let deadline = Instant::now() + sim.nccl.timeout;
    while Instant::now() < deadline && relaying(&sim) {
        sim.wait_until(deadline);
    }
    join::await_closing(&mut sim);
}

/// Registers [`linger_at_exit`] once, when a hub's own rank ends.
fn linger_at_exit_once() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    // SAFETY: registers a plain function with the C library; it takes the
    // simulator's lock, which no exiting thread holds for long (waits
    // release it).
    ONCE.call_once(|| unsafe {
        atexit(linger_at_exit);
    });
}

/// `ncclCommAbort`: frees the handle at once, without waiting. Operations
/// this rank already enqueued stay in its device's queue and still run
/// with the other ranks' parts (gpusim runs work lazily, so cancelling it
/// would make results depend on when something synchronised); operations
/// of the other ranks that need a part this rank never enqueued fail with
/// `ncclRemoteError` instead of waiting.
#[no_mangle]
pub extern "C" fn ncclCommAbort(comm: NcclComm) -> NcclResult {
    nccl_api("ncclCommAbort", |sim| {
        let c = comm_ref(sim, comm)?;
        end(sim, comm, c, "aborted");
        Ok(())
    })
}

/// Writes a fact about rank `comm` through `out`.
unsafe fn query(
    func: &str,
    comm: NcclComm,
    out: *mut c_int,
    f: impl Fn(&SimLock, CommRef) -> c_int,
) -> NcclResult {
    nccl_api(func, |sim| {
        let c = comm_ref(sim, comm)?;
        put(out, f(sim, c), "the output")
    })
}

/// `ncclCommCount`: the number of ranks.
///
/// # Safety
/// `count` must be null or writable.
#[no_mangle]
pub unsafe extern "C" fn ncclCommCount(comm: NcclComm, count: *mut c_int) -> NcclResult {
    query("ncclCommCount", comm, count, |sim, c| {
        sim.nccl.cliques[&c.clique].nranks() as c_int
    })
}

/// `ncclCommCuDevice`: the rank's device ordinal.
///
/// # Safety
/// `device` must be null or writable.
#[no_mangle]
pub unsafe extern "C" fn ncclCommCuDevice(comm: NcclComm, device: *mut c_int) -> NcclResult {
    query("ncclCommCuDevice", comm, device, |sim, c| {
        sim.nccl.cliques[&c.clique].ranks[c.rank].device as c_int
    })
}

/// `ncclCommUserRank`: the rank.
///
/// # Safety
/// `rank` must be null or writable.
#[no_mangle]
pub unsafe extern "C" fn ncclCommUserRank(comm: NcclComm, rank: *mut c_int) -> NcclResult {
    query("ncclCommUserRank", comm, rank, |_, c| c.rank as c_int)
}

/// `ncclCommGetAsyncError`: the rank's first asynchronous error, found
/// when its operations ran (nothing is run here: gpusim's work runs when
/// something synchronises). A non-success also becomes the thread's
/// `ncclGetLastError` text.
///
/// # Safety
/// `async_error` must be null or writable.
#[no_mangle]
pub unsafe extern "C" fn ncclCommGetAsyncError(
    comm: NcclComm,
    async_error: *mut NcclResult,
) -> NcclResult {
    nccl_api("ncclCommGetAsyncError", |sim| {
        let c = comm_ref(sim, comm)?;
        let e = sim.nccl.cliques[&c.clique].ranks[c.rank]
            .async_error
            .clone();
        if let Some(f) = &e {
            remember(f.code, &f.msg);
        }
        put(
            async_error,
            e.map_or(NCCL_SUCCESS, |f| f.code),
            "asyncError",
        )
    })
}
