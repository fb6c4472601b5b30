//! Running one matched set of NCCL items: each operation is checked across
//! its ranks (same call, count, type, operator, root), its inputs are read
//! from every rank's device — all of them before anything is written, so
//! in-place calls work as in NCCL — and its outputs written. Every failure
//! is a fault of each rank's enqueuing thread and the rank's asynchronous
//! error.

use super::reduce::reduce;
use super::state::{Call, Clique, Failure, Key, Kind, Part};
use super::{name, NCCL_INVALID_USAGE, NCCL_REMOTE_ERROR, NCCL_UNHANDLED_CUDA_ERROR};
use crate::driver::consts::{CUresult, CUDA_ERROR_ILLEGAL_ADDRESS, CUDA_ERROR_LAUNCH_FAILED};
use crate::driver::errors::DrvErr;
use crate::driver::state::{Op, Sim, Work};
use std::collections::BTreeMap;
use std::thread::ThreadId;

/// One rank's part of an operation, with where it runs and who enqueued it.
struct Entry {
    device: usize,
    thread: ThreadId,
    part: Part,
}

/// Runs the items `works` (popped from the fronts of their queues).
pub fn run(sim: &mut Sim, works: Vec<(usize, Work)>) {
    let mut by_key: BTreeMap<(u64, Key), Vec<Entry>> = BTreeMap::new();
    for (device, w) in works {
        let Op::Nccl(item) = w.op else {
            continue;
        };
        for part in item.parts {
            unpost(sim, &part, w.id);
            let entry = Entry {
                device,
                thread: w.thread,
                part,
            };
            by_key
                .entry((entry.part.clique, entry.part.key))
                .or_default()
                .push(entry);
        }
    }
    let cliques: Vec<u64> = by_key.keys().map(|k| k.0).collect();
    for ((clique, key), mut entries) in by_key {
        // Rank order; a self-send before its receive.
        entries.sort_by_key(|e| (e.part.rank, e.part.call.kind == Kind::Recv));
        run_op(sim, clique, key, &entries);
    }
    for c in cliques {
        sim.nccl.drop_if_done(c);
    }
}

/// Forgets that `part` of item `work` is queued.
fn unpost(sim: &mut Sim, part: &Part, work: u64) {
    let c = sim.nccl.clique(part.clique);
    c.queued -= 1;
    if let Some(m) = c.posted.get_mut(&part.key) {
        if m.get(&part.rank).is_some_and(|p| p.work == work) {
            m.remove(&part.rank);
        }
        if m.is_empty() {
            c.posted.remove(&part.key);
        }
    }
}

/// Records `f` as rank `e`'s asynchronous error and a fault (`cuda`) of
/// its enqueuing thread.
fn fault(sim: &mut Sim, e: &Entry, f: &Failure, cuda: CUresult) {
    let c = sim.nccl.clique(e.part.clique);
    c.set_async_error(e.part.rank, f);
    let what = format!(
        "{} (rank {} of {}, device {}, queued)",
        Clique::op_name(e.part.call.kind, e.part.key),
        e.part.rank,
        c.nranks(),
        e.device
    );
    let msg = format!("{}: {}", name(f.code), f.msg);
    sim.fault(e.thread, &what, DrvErr::new(cuda, msg));
}

/// Fails the operation for every rank of `entries`.
fn fail_all(sim: &mut Sim, clique: u64, key: Key, entries: &[Entry], f: Failure) {
    sim.nccl.clique(clique).fail_key(key, f.clone());
    for e in entries {
        fault(sim, e, &f, CUDA_ERROR_LAUNCH_FAILED);
    }
}

/// Checks, runs and counts one operation.
fn run_op(sim: &mut Sim, clique: u64, key: Key, entries: &[Entry]) {
    if let Some(f) = sim.nccl.clique(clique).failed.get(&key).cloned() {
        for e in entries {
            fault(sim, e, &f, CUDA_ERROR_LAUNCH_FAILED);
        }
        return;
    }
    if skip_faulted(sim, clique, key, entries) {
        return;
    }
    let nranks = sim.nccl.clique(clique).nranks();
    if let Err(msg) = check_match(key, entries) {
        let op = Clique::op_name(entries[0].part.call.kind, key);
        let f = Failure::new(NCCL_INVALID_USAGE, format!("{op}: {msg}"));
        return fail_all(sim, clique, key, entries, f);
    }
    let inputs = match read_inputs(sim, entries, nranks) {
        Ok(v) => v,
        Err((i, err)) => return read_failed(sim, clique, key, entries, i, err),
    };
    let outputs = compute(entries, &inputs);
    for (i, out) in outputs {
        let e = &entries[i];
        if out.is_empty() {
            continue;
        }
        let r = sim.devices[e.device].mem.write(e.part.call.recv, &out);
        if let Err(err) = r {
            let msg = format!(
                "writing recvbuff ({} bytes at {:#x}): {err}",
                out.len(),
                e.part.call.recv
            );
            fault(
                sim,
                e,
                &Failure::new(NCCL_UNHANDLED_CUDA_ERROR, msg),
                CUDA_ERROR_ILLEGAL_ADDRESS,
            );
        }
    }
    for e in entries {
        crate::driver::stats::count_collective(e.part.call.bytes(nranks));
    }
}

/// If a rank's thread has an undelivered fault, its part is skipped (as a
/// faulted CUDA context runs no more work) and the others fail with
/// `ncclRemoteError`; returns whether that happened.
fn skip_faulted(sim: &mut Sim, clique: u64, key: Key, entries: &[Entry]) -> bool {
    let faulted = |e: &&Entry| {
        sim.pending
            .get(&e.thread)
            .is_some_and(|p| !p.errors.is_empty())
    };
    let skipped: Vec<usize> = entries
        .iter()
        .filter(faulted)
        .map(|e| e.part.rank)
        .collect();
    if skipped.is_empty() {
        return false;
    }
    let op = Clique::op_name(entries[0].part.call.kind, key);
    let f = Failure::new(
        NCCL_REMOTE_ERROR,
        format!("{op}: rank(s) {skipped:?} skipped their part: their thread has an undelivered fault (a faulted context runs no more work)"),
    );
    sim.nccl.clique(clique).fail_key(key, f.clone());
    for e in entries {
        if skipped.contains(&e.part.rank) && e.part.call.kind != Kind::Recv {
            if let Some(p) = sim.pending.get_mut(&e.thread) {
                p.skipped += 1;
            }
        } else if !skipped.contains(&e.part.rank) {
            fault(sim, e, &f, CUDA_ERROR_LAUNCH_FAILED);
        }
    }
    true
}

/// Whether the ranks' calls agree; what differs if not.
fn check_match(key: Key, entries: &[Entry]) -> Result<(), String> {
    let first = &entries[0].part;
    if let Key::P2p { .. } = key {
        let (Some(s), Some(r)) = (
            entries.iter().find(|e| e.part.call.kind == Kind::Send),
            entries.iter().find(|e| e.part.call.kind == Kind::Recv),
        ) else {
            return Err("a send matched no receive".into());
        };
        let (a, b) = (&s.part.call, &r.part.call);
        if (a.count, a.dtype) != (b.count, b.dtype) {
            return Err(format!(
                "rank {} sends {} × {:?} but rank {} receives {} × {:?}",
                s.part.rank, a.count, a.dtype, r.part.rank, b.count, b.dtype
            ));
        }
        return Ok(());
    }
    let a = &first.call;
    for e in &entries[1..] {
        let b = &e.part.call;
        let (ra, rb) = (first.rank, e.part.rank);
        let differs = |what: &str, x: String, y: String| {
            Err(format!(
                "{what} differs: rank {ra} passed {x}, rank {rb} passed {y}"
            ))
        };
        if a.kind != b.kind {
            return Err(format!(
                "rank {ra} called {} but rank {rb} called {}",
                a.kind.name(),
                b.kind.name()
            ));
        }
        if a.count != b.count {
            return differs("count", a.count.to_string(), b.count.to_string());
        }
        if a.dtype != b.dtype {
            return differs(
                "datatype",
                format!("{:?}", a.dtype),
                format!("{:?}", b.dtype),
            );
        }
        if a.kind.reduces() && a.op != b.op {
            return differs("op", format!("{:?}", a.op), format!("{:?}", b.op));
        }
        if a.kind.rooted() && a.root != b.root {
            return differs("root", a.root.to_string(), b.root.to_string());
        }
    }
    Ok(())
}

/// Bytes a rank's part reads from its send buffer (0: none).
fn send_len(c: &Call, rank: usize, nranks: usize) -> usize {
    let b = c.count * c.dtype.size();
    match c.kind {
        Kind::AllReduce | Kind::Reduce | Kind::AllGather | Kind::Send => b,
        Kind::Broadcast if rank == c.root => b,
        Kind::ReduceScatter => b * nranks,
        Kind::Broadcast | Kind::Recv => 0,
    }
}

/// Every part's send buffer (empty when it reads none), checked by the
/// sanitizer (initcheck included); on failure, the entry and why.
fn read_inputs(
    sim: &Sim,
    entries: &[Entry],
    nranks: usize,
) -> Result<Vec<Vec<u8>>, (usize, String)> {
    let mut out = Vec::with_capacity(entries.len());
    for (i, e) in entries.iter().enumerate() {
        let c = &e.part.call;
        let mut buf = vec![0u8; send_len(c, e.part.rank, nranks)];
        if !buf.is_empty() {
            sim.devices[e.device]
                .mem
                .read(c.send, &mut buf, true)
                .map_err(|err| {
                    (
                        i,
                        format!(
                            "reading sendbuff ({} bytes at {:#x}): {err}",
                            buf.len(),
                            c.send
                        ),
                    )
                })?;
        }
        out.push(buf);
    }
    Ok(out)
}

/// A send buffer could not be read: the reader's fault is a memory fault,
/// everyone else's a remote error; nothing is written.
fn read_failed(sim: &mut Sim, clique: u64, key: Key, entries: &[Entry], i: usize, err: String) {
    let op = Clique::op_name(entries[i].part.call.kind, key);
    let own = Failure::new(NCCL_UNHANDLED_CUDA_ERROR, err.clone());
    let remote = Failure::new(
        NCCL_REMOTE_ERROR,
        format!("{op}: rank {}'s part faulted: {err}", entries[i].part.rank),
    );
    for (j, e) in entries.iter().enumerate() {
        if j == i {
            fault(sim, e, &own, CUDA_ERROR_ILLEGAL_ADDRESS);
        } else {
            fault(sim, e, &remote, CUDA_ERROR_LAUNCH_FAILED);
        }
    }
    // After the faults, so that the reader's own error stands as its
    // asynchronous error.
    sim.nccl.clique(clique).fail_key(key, remote);
}

/// The bytes each entry receives (entry index, bytes), from the inputs.
fn compute(entries: &[Entry], inputs: &[Vec<u8>]) -> Vec<(usize, Vec<u8>)> {
    let c = entries[0].part.call;
    let all: Vec<&[u8]> = inputs.iter().map(|v| v.as_slice()).collect();
    let reduced = || reduce(c.dtype, c.op, &all).expect("checked reducible at the call");
    let everyone = |bytes: Vec<u8>| (0..entries.len()).map(|i| (i, bytes.clone())).collect();
    match c.kind {
        Kind::AllReduce => everyone(reduced()),
        Kind::Reduce => {
            let root = entries.iter().position(|e| e.part.rank == c.root);
            root.map(|i| (i, reduced())).into_iter().collect()
        }
        Kind::Broadcast => everyone(all[c.root].to_vec()),
        Kind::AllGather => everyone(all.concat()),
        Kind::ReduceScatter => {
            let block = c.count * c.dtype.size();
            (0..entries.len())
                .map(|r| {
                    let blocks: Vec<&[u8]> =
                        all.iter().map(|x| &x[r * block..(r + 1) * block]).collect();
                    (
                        r,
                        reduce(c.dtype, c.op, &blocks).expect("checked reducible at the call"),
                    )
                })
                .collect()
        }
        Kind::Send | Kind::Recv => {
            let s = entries.iter().position(|e| e.part.call.kind == Kind::Send);
            let r = entries.iter().position(|e| e.part.call.kind == Kind::Recv);
            match (s, r) {
                (Some(s), Some(r)) => vec![(r, inputs[s].clone())],
                _ => Vec::new(),
            }
        }
    }
}
