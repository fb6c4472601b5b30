//! Running one matched set of NCCL items: each operation's inputs are
//! read from every rank's device — all of them before anything is
//! written, so in-place calls work as in NCCL — and decided (`outcome`:
//! the calls checked across ranks, the outputs computed), then the outputs
//! written. An operation whose ranks live in several processes was decided
//! by its hub (`net`): its outcomes are applied here the same way. Every
//! failure is a fault of each rank's enqueuing thread and the rank's
//! asynchronous error.

use super::outcome::{decide, send_len, Contrib, Input, Outcome};
use super::state::{Clique, Failure, Key, Kind, Part};
use super::{name, net, NCCL_UNHANDLED_CUDA_ERROR};
use crate::driver::consts::{CUresult, CUDA_ERROR_ILLEGAL_ADDRESS, CUDA_ERROR_LAUNCH_FAILED};
use crate::driver::errors::DrvErr;
use crate::driver::state::{Op, Sim, Work};
use std::collections::BTreeMap;
use std::thread::ThreadId;

/// One rank's part of an operation, with where it runs and who enqueued it.
pub struct Entry {
    /// Its device.
    pub device: usize,
    /// The thread that enqueued it.
    pub thread: ThreadId,
    /// The part.
    pub part: Part,
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
pub fn fault(sim: &mut Sim, e: &Entry, f: &Failure, cuda: CUresult) {
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

/// Checks, runs and counts one operation.
fn run_op(sim: &mut Sim, clique: u64, key: Key, entries: &[Entry]) {
    if sim.nccl.clique(clique).spans(key) {
        return net::apply_result(sim, clique, key, entries);
    }
    if let Some(f) = sim.nccl.clique(clique).failed.get(&key).cloned() {
        for e in entries {
            fault(sim, e, &f, CUDA_ERROR_LAUNCH_FAILED);
        }
        return;
    }
    let nranks = sim.nccl.clique(clique).nranks();
    let parts: Vec<Contrib> = entries
        .iter()
        .map(|e| Contrib {
            rank: e.part.rank,
            call: e.part.call,
            input: input(sim, e.device, e.thread, &e.part, nranks),
        })
        .collect();
    let d = decide(key, &parts);
    apply(sim, clique, key, entries, d.outcomes, d.failure);
}

/// What part `p`, enqueued on device `dev` by `thread`, brings: nothing if
/// the thread has an undelivered fault (a faulted context runs no more
/// work), else its send buffer, checked by the sanitizer (initcheck
/// included).
pub fn input(sim: &Sim, dev: usize, thread: ThreadId, p: &Part, nranks: usize) -> Input {
    if sim
        .pending
        .get(&thread)
        .is_some_and(|p| !p.errors.is_empty())
    {
        return Input::Skipped;
    }
    let c = &p.call;
    let mut buf = vec![0u8; send_len(c, p.rank, nranks)];
    if buf.is_empty() {
        return Input::Data(buf);
    }
    match sim.devices[dev].mem.read(c.send, &mut buf, true) {
        Ok(()) => Input::Data(buf),
        Err(err) => Input::Unreadable(format!(
            "reading sendbuff ({} bytes at {:#x}): {err}",
            buf.len(),
            c.send
        )),
    }
}

/// Applies the outcomes of operation `key` (one per entry): outputs
/// written, faults recorded, skips counted; then the operation's failure
/// (after the faults, so that a reader's own memory fault stands as its
/// asynchronous error), or the operation counted.
pub fn apply(
    sim: &mut Sim,
    clique: u64,
    key: Key,
    entries: &[Entry],
    outcomes: Vec<Outcome>,
    failure: Option<Failure>,
) {
    for (e, o) in entries.iter().zip(outcomes) {
        match o {
            Outcome::Write(out) if !out.is_empty() => {
                let r = sim.devices[e.device].mem.write(e.part.call.recv, &out);
                if let Err(err) = r {
                    let msg = format!(
                        "writing recvbuff ({} bytes at {:#x}): {err}",
                        out.len(),
                        e.part.call.recv
                    );
                    let f = Failure::new(NCCL_UNHANDLED_CUDA_ERROR, msg);
                    fault(sim, e, &f, CUDA_ERROR_ILLEGAL_ADDRESS);
                }
            }
            Outcome::Fault(f, cuda) => fault(sim, e, &f, cuda),
            Outcome::Skip => {
                if let Some(p) = sim.pending.get_mut(&e.thread) {
                    p.skipped += 1;
                }
            }
            Outcome::Write(_) | Outcome::Nothing => {}
        }
    }
    match failure {
        Some(f) => sim.nccl.clique(clique).fail_key(key, f),
        None => {
            let nranks = sim.nccl.clique(clique).nranks();
            for e in entries {
                crate::driver::stats::count_collective(e.part.call.bytes(nranks));
            }
        }
    }
}
