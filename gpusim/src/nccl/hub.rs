//! The hub of a communicator whose ranks live in several processes (see
//! `net`): it checks the parts it receives, keeps them until every
//! participant's part of an operation is there, decides the operation
//! (`outcome::decide`, as within one process) and hands out the outcomes;
//! it fails an operation whose missing part will never come (its rank's
//! handle ended first, its process went, the communicator broke), and
//! tells the processes that still owe a part that others have reached it.

use super::net::{key_ok, net_of, send, Net, Verdict};
use super::outcome::{decide, send_len, Contrib, Input, Outcome};
use super::state::{Clique, Failure, Key, Kind};
use super::wire::Msg;
use super::NCCL_REMOTE_ERROR;
use crate::driver::consts::CUDA_ERROR_LAUNCH_FAILED;
use crate::driver::lock::notify;
use crate::driver::state::Sim;
use std::collections::BTreeSet;

/// Checks parts received through `from` (`None`: this process's own).
fn check_parts(c: &Clique, from: Option<u64>, key: Key, parts: &[Contrib]) -> Result<(), String> {
    let n = c.nranks();
    key_ok(c, key)?;
    let owner = |r: usize| match (from, c.net.as_ref()) {
        (None, _) => c.ranks[r].remote.is_none(),
        (Some(ch), Some(net)) => net
            .peers
            .iter()
            .any(|p| p.chan == ch && p.ranks.contains(&r)),
        _ => false,
    };
    let participants = c.participants(key);
    for p in parts {
        if !participants.contains(&p.rank) || !owner(p.rank) {
            return Err(format!("a part of rank {} for {key:?}", p.rank));
        }
        let call = &p.call;
        let kind_ok = match key {
            Key::Coll(_) => !matches!(call.kind, Kind::Send | Kind::Recv),
            Key::P2p { src, dst, .. } => {
                let (want, peer) = match p.rank == src {
                    true => (Kind::Send, dst),
                    false => (Kind::Recv, src),
                };
                call.kind == want && call.root == peer
            }
        };
        let sane = call.root < n && (!call.kind.reduces() || call.dtype.reducible());
        let len = call
            .count
            .checked_mul(call.dtype.size())
            .and_then(|b| b.checked_mul(n));
        if !kind_ok || !sane || len.is_none() {
            return Err(format!("rank {}'s call {call:?} for {key:?}", p.rank));
        }
        if let Input::Data(d) = &p.input {
            if d.len() != send_len(call, p.rank, n) {
                return Err(format!(
                    "rank {} sent {} bytes for {call:?}",
                    p.rank,
                    d.len()
                ));
            }
        }
    }
    Ok(())
}

/// The hub adds parts of operation `key` (received through `from`, or
/// its own), then settles it.
pub fn add(
    sim: &mut Sim,
    c: u64,
    from: Option<u64>,
    key: Key,
    parts: Vec<Contrib>,
) -> Result<(), String> {
    let clique = sim.nccl.clique(c);
    check_parts(clique, from, key, &parts)?;
    let Some(n) = clique.net.as_deref_mut() else {
        return Err("not a communicator between processes".into());
    };
    if n.closed.contains_key(&key) {
        return Ok(()); // its failure went out already
    }
    let have = n.pending.entry(key).or_default();
    for p in parts {
        if have.iter().any(|q| q.rank == p.rank) {
            return Err(format!("rank {} sent its part of {key:?} twice", p.rank));
        }
        have.push(p);
    }
    settle(sim, c, key);
    Ok(())
}

/// The hub settles every operation it holds parts of.
pub fn settle_all(sim: &mut Sim, c: u64) {
    let keys: Vec<Key> = net_of(sim, c).map_or(Vec::new(), |n| n.pending.keys().copied().collect());
    for k in keys {
        settle(sim, c, k);
    }
}

/// The hub decides `key` if every part is there, fails it if a part
/// never will be, or tells the other processes which ranks reached it
/// (those that still owe a part run their queues up to it).
fn settle(sim: &mut Sim, c: u64, key: Key) {
    let clique = sim.nccl.clique(c);
    let Some(n) = clique.net.as_deref() else {
        return;
    };
    let Some(have) = n.pending.get(&key) else {
        return;
    };
    let ranks: BTreeSet<usize> = have.iter().map(|p| p.rank).collect();
    let kind = have.first().map(|p| p.call.kind).unwrap_or(Kind::AllReduce);
    let participants = clique.participants(key);
    if participants.iter().all(|r| ranks.contains(r)) {
        return finish(sim, c, key);
    }
    if let Some(f) = never(clique, n, key, kind, &ranks) {
        return close(sim, c, key, f);
    }
    let mut tell = Vec::new();
    let owes = |rs: &[usize]| {
        rs.iter()
            .any(|r| participants.contains(r) && !ranks.contains(r))
    };
    let takes_part = |rs: &[usize]| rs.iter().any(|r| participants.contains(r));
    for p in n.peers.iter().filter(|p| !p.lost && takes_part(&p.ranks)) {
        tell.push(p.chan);
    }
    let local: Vec<usize> = participants
        .iter()
        .copied()
        .filter(|&r| clique.ranks[r].remote.is_none())
        .collect();
    let owed_here = owes(&local);
    let list: Vec<usize> = ranks.into_iter().collect();
    for chan in tell {
        let m = Msg::Progress {
            key,
            ranks: list.clone(),
        };
        send(sim, chan, &m);
    }
    if owed_here {
        if let Some(n) = net_of(sim, c) {
            n.demanded.insert(key);
        }
    }
}

/// Why a missing part of `key` will never come, if so.
fn never(c: &Clique, n: &Net, key: Key, kind: Kind, have: &BTreeSet<usize>) -> Option<Failure> {
    if let Some(f) = &c.broken {
        return Some(f.clone());
    }
    let op = Clique::op_name(kind, key);
    for r in c
        .participants(key)
        .into_iter()
        .filter(|r| !have.contains(r))
    {
        let Some(e) = n.ended.get(&r) else {
            continue;
        };
        let why = match (e.counts.has(r, key), e.how.as_str()) {
            (false, "finalized") => {
                format!("rank {r} finalized its communicator before it enqueued its part of {op}")
            }
            (false, "destroyed" | "aborted") => format!(
                "rank {r}'s communicator was {} before it enqueued its part of {op}",
                e.how
            ),
            _ if e.exited => {
                let pid = c.ranks[r].remote.unwrap_or(0);
                format!("process {pid} of rank {r} exited before its part of {op} reached the hub")
            }
            _ => continue,
        };
        return Some(Failure::new(NCCL_REMOTE_ERROR, why));
    }
    None
}

/// The hub decides `key` from its parts and sends the outcomes.
fn finish(sim: &mut Sim, c: u64, key: Key) {
    let Some(mut parts) = net_of(sim, c).and_then(|n| n.pending.remove(&key)) else {
        return;
    };
    parts.sort_by_key(|p| (p.rank, p.call.kind == Kind::Recv));
    let d = decide(key, &parts);
    let outcomes = parts.iter().map(|p| p.rank).zip(d.outcomes).collect();
    distribute(sim, c, key, outcomes, d.failure);
}

/// The hub fails `key` for every participant with `f`.
fn close(sim: &mut Sim, c: u64, key: Key, f: Failure) {
    let participants = sim.nccl.clique(c).participants(key);
    if let Some(n) = net_of(sim, c) {
        n.pending.remove(&key);
        n.closed.insert(key, f.clone());
    }
    let outcomes = participants
        .into_iter()
        .map(|r| (r, Outcome::Fault(f.clone(), CUDA_ERROR_LAUNCH_FAILED)))
        .collect();
    distribute(sim, c, key, outcomes, Some(f));
}

/// The hub hands out the outcomes of `key`: each member its ranks', its
/// own ranks' kept until their items run.
fn distribute(
    sim: &mut Sim,
    c: u64,
    key: Key,
    outcomes: Vec<(usize, Outcome)>,
    failure: Option<Failure>,
) {
    let clique = sim.nccl.clique(c);
    let mut msgs: Vec<(usize, Vec<(usize, Outcome)>)> = Vec::new();
    let mut local = Vec::new();
    for (r, o) in outcomes {
        if clique.ranks[r].remote.is_none() {
            local.push((r, o));
        } else if let Some(p) = clique
            .net
            .as_ref()
            .and_then(|n| n.peers.iter().position(|p| p.ranks.contains(&r)))
        {
            match msgs.iter_mut().find(|(q, _)| *q == p) {
                Some((_, v)) => v.push((r, o)),
                None => msgs.push((p, vec![(r, o)])),
            }
        }
    }
    let Some(n) = clique.net.as_deref_mut() else {
        return;
    };
    let chans: Vec<(u64, bool)> = n.peers.iter().map(|p| (p.chan, p.lost)).collect();
    if !local.is_empty() {
        let v = Verdict {
            outcomes: local,
            failure: failure.clone(),
        };
        n.results.insert(key, v);
    }
    for (p, outcomes) in msgs {
        if !chans[p].1 {
            let m = Msg::Result {
                key,
                outcomes,
                failure: failure.clone(),
            };
            send(sim, chans[p].0, &m);
        }
    }
    notify();
}
