//! Operations of communicators whose ranks live in several processes.
//!
//! The process that made the unique id is the communicator's hub; every
//! other process with ranks in it (a member) has one connection to it
//! (`transport`). When a process's items of a matched set are at the
//! fronts of their queues (`exec`), it reads its ranks' inputs and sends
//! them to the hub (`Contribute`; the hub's own ranks add theirs
//! directly). The hub (`hub`) decides the operation once every
//! participant's part is there — the same `outcome::decide` as for one
//! process, so
//! results are bit-identical: reductions in rank order, each step rounded
//! in the element type — and sends each process its ranks' outcomes
//! (`Result`), which are applied when the items run, in queue order.
//!
//! gpusim runs queued work only when something synchronises, but a GPU
//! runs it anyway: so when one rank reaches an operation, the hub tells
//! the processes of the others (`Progress`) and they run their queues up
//! to their parts (`kick`), as another rank's drain does within one
//! process.
//!
//! Failures: a rank whose handle ended (`Gone`: destroyed, aborted,
//! finalized) before it enqueued its part fails the operation with
//! `ncclRemoteError`, as within one process; a process whose connection
//! ends while it still has live ranks breaks the communicator (every rank's
//! asynchronous error is set, operations without an outcome fail with
//! `ncclRemoteError`), as does a timeout anywhere (`Broken` is passed on
//! to every process) — see `netfail`. A malformed message counts as a
//! lost connection.

use super::apply::{self, Entry};
use super::exec::ItemRef;
use super::outcome::{recv_len, Contrib, Outcome};
use super::state::{Clique, Failure, Key, RankInfo, Wait};
use super::wire::{Counts, Msg};
use super::{NCCL_INTERNAL_ERROR, NCCL_REMOTE_ERROR};
use crate::driver::consts::CUDA_ERROR_LAUNCH_FAILED;
use crate::driver::state::{Op, Sim};
use std::collections::{BTreeSet, HashMap, HashSet};

/// A process at the other end of a connection, and its ranks.
#[derive(Debug)]
pub struct Peer {
    /// The connection (`join::Procs::chans`).
    pub chan: u64,
    /// Its process id.
    pub pid: u32,
    /// The ranks reached through it (a member: all of other processes).
    pub ranks: Vec<usize>,
    /// Its connection ended.
    pub lost: bool,
}

/// What an operation came to for this process's ranks.
#[derive(Clone, Debug)]
pub struct Verdict {
    /// By rank.
    pub outcomes: Vec<(usize, Outcome)>,
    /// The operation's failure.
    pub failure: Option<Failure>,
}

/// How a rank of the communicator ended, as the hub knows it.
#[derive(Clone, Debug)]
pub struct Ended {
    /// "destroyed", "aborted", "finalized".
    pub how: String,
    /// What it had enqueued.
    pub counts: Counts,
    /// Its process is gone: nothing more of it will come.
    pub exited: bool,
}

/// A communicator's transport state in one process.
#[derive(Debug, Default)]
pub struct Net {
    /// This process is the hub.
    pub hub: bool,
    /// The hub: one per member process; a member: the hub.
    pub peers: Vec<Peer>,
    /// Operations whose parts this process sent (or, on the hub, added).
    pub contributed: HashSet<Key>,
    /// Outcomes for this process's ranks, until their items run.
    pub results: HashMap<Key, Verdict>,
    /// Ranks the hub said have reached an operation (a member's view).
    pub seen: HashMap<Key, BTreeSet<usize>>,
    /// Operations other ranks wait for whose parts here were not sent.
    pub demanded: HashSet<Key>,
    /// The hub: parts received so far, by operation.
    pub pending: HashMap<Key, Vec<Contrib>>,
    /// The hub: operations failed before every part came.
    pub closed: HashMap<Key, Failure>,
    /// The hub: ranks whose handle ended or whose process went.
    pub ended: HashMap<usize, Ended>,
}

impl Counts {
    /// What rank `r` has enqueued.
    pub fn of(r: &RankInfo) -> Counts {
        let list = |m: &HashMap<usize, u64>| {
            let mut v: Vec<(usize, u64)> = m.iter().map(|(&p, &n)| (p, n)).collect();
            v.sort_unstable();
            v
        };
        Counts {
            coll: r.coll_seq,
            sent: list(&r.sent),
            received: list(&r.received),
        }
    }

    /// Whether rank `rank` had enqueued its part of `key`.
    pub fn has(&self, rank: usize, key: Key) -> bool {
        let upto = |list: &[(usize, u64)], peer: usize| {
            list.iter().find(|x| x.0 == peer).map_or(0, |x| x.1)
        };
        match key {
            Key::Coll(s) => s < self.coll,
            Key::P2p { src, n, .. } if src == rank => n < upto(&self.sent, key_peer(key, rank)),
            Key::P2p { n, .. } => n < upto(&self.received, key_peer(key, rank)),
        }
    }
}

/// The other rank of point-to-point `key` for `rank`.
fn key_peer(key: Key, rank: usize) -> usize {
    match key {
        Key::P2p { src, dst, .. } if src == rank => dst,
        Key::P2p { src, .. } => src,
        Key::Coll(_) => rank,
    }
}

/// Sends `m` through connection `chan`, if it is open.
pub fn send(sim: &Sim, chan: u64, m: &Msg) {
    if let Some(c) = sim.nccl.procs.chans.get(&chan) {
        c.out.send(m);
    }
}

/// The transport of clique `c`, if it has one.
pub fn net_of(sim: &mut Sim, c: u64) -> Option<&mut Net> {
    sim.nccl.cliques.get_mut(&c)?.net.as_deref_mut()
}

/// What a walk does about the operations of a set that span processes.
pub enum Ready {
    /// Every outcome is here: run the set.
    Go,
    /// Wait for outcomes (lock released), as for a missing part.
    Wait(Wait),
    /// Operations were failed: walk again.
    Restart,
}

/// The set `set` (its items at the fronts of their queues): sends this
/// process's parts of its operations that span processes (once), and says
/// whether their outcomes are all here.
pub fn ready(sim: &mut Sim, set: &[ItemRef]) -> Ready {
    let mut keys: Vec<(u64, Key)> = Vec::new();
    for &(d, w) in set {
        let Some(Op::Nccl(item)) = sim.devices[d]
            .queue
            .iter()
            .find(|x| x.id == w)
            .map(|x| &x.op)
        else {
            continue;
        };
        for p in &item.parts {
            let c = &sim.nccl.cliques[&p.clique];
            let open = c.spans(p.key) && !c.failed.contains_key(&p.key);
            let decided = c
                .net
                .as_ref()
                .is_some_and(|n| n.results.contains_key(&p.key));
            if open && !decided && !keys.contains(&(p.clique, p.key)) {
                keys.push((p.clique, p.key));
            }
        }
    }
    let mut restart = false;
    for &(c, k) in &keys {
        let clique = sim.nccl.clique(c);
        if let Some(f) = clique.broken.clone() {
            clique.fail_key(k, f);
            restart = true;
        }
    }
    if restart {
        return Ready::Restart;
    }
    for &(c, k) in &keys {
        if net_of(sim, c).is_some_and(|n| !n.contributed.contains(&k)) {
            let parts = local_parts(sim, set, c, k);
            if let Some(n) = net_of(sim, c) {
                n.contributed.insert(k);
                n.demanded.remove(&k);
            }
            contribute(sim, c, k, parts);
        }
    }
    for &(c, k) in &keys {
        let clique = &sim.nccl.cliques[&c];
        let decided = clique
            .net
            .as_ref()
            .is_some_and(|n| n.results.contains_key(&k));
        if !decided && !clique.failed.contains_key(&k) {
            let participants = clique.participants(k);
            let rank = participants
                .into_iter()
                .find(|&r| clique.ranks[r].remote.is_some())
                .unwrap_or(0);
            return Ready::Wait(Wait {
                clique: c,
                key: k,
                rank,
            });
        }
    }
    Ready::Go
}

/// This process's parts of operation `k` of clique `c` in `set`, with
/// their inputs read now.
fn local_parts(sim: &Sim, set: &[ItemRef], c: u64, k: Key) -> Vec<Contrib> {
    let nranks = sim.nccl.cliques[&c].nranks();
    let mut out = Vec::new();
    for &(d, w) in set {
        let Some(work) = sim.devices[d].queue.iter().find(|x| x.id == w) else {
            continue;
        };
        let Op::Nccl(item) = &work.op else {
            continue;
        };
        for p in item.parts.iter().filter(|p| (p.clique, p.key) == (c, k)) {
            let input = apply::input(sim, d, work.thread, p, nranks);
            out.push(Contrib {
                rank: p.rank,
                call: p.call,
                input,
            });
        }
    }
    out
}

/// Hands this process's parts to the hub: added directly on the hub, sent
/// by a member.
fn contribute(sim: &mut Sim, c: u64, key: Key, parts: Vec<Contrib>) {
    let Some(n) = net_of(sim, c) else {
        return;
    };
    if n.hub {
        // Checked by construction: this process's own parts.
        let _ = super::hub::add(sim, c, None, key, parts);
    } else if let Some(chan) = n.peers.first().map(|p| p.chan) {
        send(sim, chan, &Msg::Contribute { key, parts });
    }
}

/// Whether `key` names an operation of `c` (a message's key is checked
/// before its ranks are looked up).
pub fn key_ok(c: &Clique, key: Key) -> Result<(), String> {
    match key {
        Key::P2p { src, dst, .. } if src >= c.nranks() || dst >= c.nranks() || src == dst => {
            Err(format!(
                "{key:?} is not an operation between two ranks of {}",
                c.nranks()
            ))
        }
        _ => Ok(()),
    }
}

/// A member takes the outcomes of `key` for its ranks.
pub fn on_result(
    sim: &mut Sim,
    c: u64,
    key: Key,
    outcomes: Vec<(usize, Outcome)>,
    failure: Option<Failure>,
) -> Result<(), String> {
    let clique = sim.nccl.clique(c);
    key_ok(clique, key)?;
    let participants = clique.participants(key);
    let mut seen = BTreeSet::new();
    for (r, _) in &outcomes {
        let ok = participants.contains(r) && clique.ranks[*r].remote.is_none() && seen.insert(*r);
        if !ok {
            return Err(format!("an outcome of {key:?} for rank {r}"));
        }
    }
    let Some(n) = clique.net.as_deref_mut() else {
        return Err("not a communicator between processes".into());
    };
    if n.results.contains_key(&key) {
        return Err(format!("two outcomes of {key:?}"));
    }
    n.seen.remove(&key);
    n.results.insert(key, Verdict { outcomes, failure });
    Ok(())
}

/// A member hears that ranks `ranks` have reached `key`.
pub fn on_progress(sim: &mut Sim, c: u64, key: Key, ranks: Vec<usize>) -> Result<(), String> {
    let clique = sim.nccl.clique(c);
    key_ok(clique, key)?;
    let participants = clique.participants(key);
    if let Some(r) = ranks.iter().find(|r| !participants.contains(r)) {
        return Err(format!("rank {r} does not take part in {key:?}"));
    }
    let Some(n) = clique.net.as_deref_mut() else {
        return Err("not a communicator between processes".into());
    };
    if !n.results.contains_key(&key) {
        n.seen.insert(key, ranks.into_iter().collect());
        if !n.contributed.contains(&key) {
            n.demanded.insert(key);
        }
    }
    Ok(())
}

/// Runs this process's queues up to its parts of the operations that
/// other ranks wait for or whose outcomes are here (never from within a
/// walk: only at the top of a call or of a connection's handler).
pub fn kick(sim: &mut Sim, c: u64) {
    let Some(clique) = sim.nccl.cliques.get(&c) else {
        return;
    };
    let Some(n) = clique.net.as_deref() else {
        return;
    };
    let keys: Vec<Key> = n.demanded.iter().chain(n.results.keys()).copied().collect();
    let mut targets: Vec<(usize, u64)> = keys
        .iter()
        .filter_map(|k| clique.posted.get(k))
        .flat_map(|m| m.values().map(|p| (p.device, p.work)))
        .collect();
    targets.sort_unstable();
    targets.dedup();
    for (d, w) in targets {
        // Never blocks: what cannot run yet stays queued.
        let _ = sim.run_to(d, w);
    }
}

/// Runs this process's entries of operation `key`, which spans processes:
/// their outcomes from the hub are applied (each checked against its
/// call), or the operation's local failure if it has none.
pub fn apply_result(sim: &mut Sim, c: u64, key: Key, entries: &[Entry]) {
    let clique = sim.nccl.clique(c);
    let nranks = clique.nranks();
    let failed = clique.failed.get(&key).cloned();
    let verdict = clique.net.as_deref_mut().and_then(|n| {
        n.contributed.remove(&key);
        n.demanded.remove(&key);
        n.seen.remove(&key);
        n.results.remove(&key)
    });
    let Some(v) = verdict else {
        let f = failed.unwrap_or_else(|| {
            Failure::new(NCCL_INTERNAL_ERROR, format!("no outcome of {key:?} came"))
        });
        for e in entries {
            apply::fault(sim, e, &f, CUDA_ERROR_LAUNCH_FAILED);
        }
        return;
    };
    let outcomes = entries
        .iter()
        .map(|e| {
            let (rank, call) = (e.part.rank, &e.part.call);
            let bad = |msg: String| {
                Outcome::Fault(
                    Failure::new(NCCL_REMOTE_ERROR, msg),
                    CUDA_ERROR_LAUNCH_FAILED,
                )
            };
            match v.outcomes.iter().find(|(r, _)| *r == rank) {
                Some((_, Outcome::Write(b))) if b.len() != recv_len(call, rank, nranks) => {
                    bad(format!(
                        "the hub sent {} bytes for rank {rank}'s {}-byte receive buffer",
                        b.len(),
                        recv_len(call, rank, nranks)
                    ))
                }
                Some((_, o)) => o.clone(),
                None => bad(format!(
                    "the hub sent no outcome of {key:?} for rank {rank}"
                )),
            }
        })
        .collect();
    apply::apply(sim, c, key, entries, outcomes, v.failure);
}
