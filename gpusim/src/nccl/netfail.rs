//! How a communicator whose ranks live in several processes fails (see
//! `net`): a timeout waiting for another process, ranks whose handle
//! ended, a process whose connection ended, and breaking the communicator
//! in every process.

use super::hub::settle_all;
use super::net::{net_of, send, Ended};
use super::state::{Failure, Status, Wait};
use super::wire::{Counts, Msg};
use super::NCCL_REMOTE_ERROR;
use crate::driver::lock::notify;
use crate::driver::state::Sim;
use std::collections::BTreeSet;

/// Gives up waiting for the outcome of `w.key` (`op` names it): as
/// within one process, the operation fails with `ncclRemoteError` and the
/// communicator breaks — in every process.
pub fn time_out(sim: &mut Sim, w: &Wait, op: &str) {
    let timeout_ms = sim.nccl.timeout.as_millis();
    let Some(c) = sim.nccl.cliques.get(&w.clique) else {
        return;
    };
    let Some(n) = c.net.as_deref() else {
        return;
    };
    if c.failed.contains_key(&w.key) || n.results.contains_key(&w.key) {
        return; // resolved meanwhile
    }
    let have: BTreeSet<usize> = match n.hub {
        true => n
            .pending
            .get(&w.key)
            .map_or_else(BTreeSet::new, |v| v.iter().map(|p| p.rank).collect()),
        false => n.seen.get(&w.key).cloned().unwrap_or_default(),
    };
    let missing: Vec<usize> = c
        .participants(w.key)
        .into_iter()
        .filter(|&r| c.ranks[r].remote.is_some() && !have.contains(&r))
        .collect();
    let mut pids: Vec<u32> = missing.iter().filter_map(|&r| c.ranks[r].remote).collect();
    pids.sort_unstable();
    pids.dedup();
    let msg = format!(
        "timed out after {timeout_ms} ms (GPUSIM_NCCL_TIMEOUT_MS) waiting for rank(s) {missing:?} (process(es) {pids:?}) to reach their part of {op}"
    );
    let f = Failure::new(NCCL_REMOTE_ERROR, msg);
    sim.nccl.clique(w.clique).fail_key(w.key, f.clone());
    break_clique(sim, w.clique, f, None);
}

/// Breaks clique `c` with `f` (heard through connection `from`, or found
/// here): every rank's asynchronous error, no new operations, operations
/// without an outcome fail; the other processes are told.
pub fn break_clique(sim: &mut Sim, c: u64, f: Failure, from: Option<u64>) {
    let Some(clique) = sim.nccl.cliques.get_mut(&c) else {
        return;
    };
    let first = clique.broken.is_none();
    clique.broken.get_or_insert(f.clone());
    for r in 0..clique.nranks() {
        clique.set_async_error(r, &f);
    }
    if first {
        spread_broken(sim, c, &f, from);
    }
    notify();
}

/// Tells the other processes of clique `c` (if it spans processes) that
/// it broke with `f` — the hub all members but `from`, a member the hub
/// unless it heard it from there — and the hub fails its open operations.
pub fn spread_broken(sim: &mut Sim, c: u64, f: &Failure, from: Option<u64>) {
    let Some(n) = net_of(sim, c) else {
        return;
    };
    let hub = n.hub;
    let chans: Vec<u64> = n
        .peers
        .iter()
        .filter(|p| !p.lost && Some(p.chan) != from && (hub || from.is_none()))
        .map(|p| p.chan)
        .collect();
    for chan in chans {
        send(sim, chan, &Msg::Broken(f.clone()));
    }
    if hub {
        settle_all(sim, c);
    }
}

/// Rank `rank` of this process ended its handle (`how`: "destroyed",
/// "aborted", "finalized"): the hub learns what it had enqueued.
pub fn rank_ended(sim: &mut Sim, c: u64, rank: usize, how: &str) {
    let Some(clique) = sim.nccl.cliques.get_mut(&c) else {
        return;
    };
    let counts = Counts::of(&clique.ranks[rank]);
    let Some(n) = clique.net.as_deref_mut() else {
        return;
    };
    if n.hub {
        let e = Ended {
            how: how.to_string(),
            counts,
            exited: false,
        };
        n.ended.insert(rank, e);
        settle_all(sim, c);
    } else if let Some(chan) = n.peers.first().map(|p| p.chan) {
        let how = how.to_string();
        send(sim, chan, &Msg::Gone { rank, how, counts });
    }
}

/// The hub hears through `chan` that rank `rank` ended.
pub fn on_gone(
    sim: &mut Sim,
    c: u64,
    chan: u64,
    rank: usize,
    how: String,
    counts: Counts,
) -> Result<(), String> {
    let clique = sim.nccl.clique(c);
    let Some(n) = clique.net.as_deref_mut() else {
        return Err("not a communicator between processes".into());
    };
    let owned = n
        .peers
        .iter()
        .any(|p| p.chan == chan && p.ranks.contains(&rank));
    let status = match how.as_str() {
        "finalized" => Status::Finalized,
        "destroyed" => Status::Gone("destroyed"),
        "aborted" => Status::Gone("aborted"),
        _ => return Err(format!("rank {rank} ended {how:?}")),
    };
    if !owned {
        return Err(format!("rank {rank} is not of this connection"));
    }
    let e = Ended {
        how,
        counts,
        exited: false,
    };
    n.ended.insert(rank, e);
    clique.ranks[rank].status = status;
    settle_all(sim, c);
    sim.nccl.drop_if_done(c);
    Ok(())
}

/// Connection `chan` of clique `c` ended (`why`). The hub: that member's
/// parts still to come never will; if it had live ranks, the communicator
/// breaks. A member: the hub is gone; the communicator breaks unless this
/// process's ranks are all gone.
pub fn peer_lost(sim: &mut Sim, c: u64, chan: u64, why: &str) {
    let Some(clique) = sim.nccl.cliques.get_mut(&c) else {
        return;
    };
    let Some(n) = clique.net.as_deref_mut() else {
        return;
    };
    let Some(p) = n.peers.iter_mut().find(|p| p.chan == chan) else {
        return;
    };
    p.lost = true;
    let (pid, ranks, hub) = (p.pid, p.ranks.clone(), n.hub);
    let f = if hub {
        let live: Vec<usize> = ranks
            .iter()
            .copied()
            .filter(|r| !n.ended.contains_key(r))
            .collect();
        for &r in &ranks {
            let e = n.ended.entry(r).or_insert(Ended {
                how: "exited".into(),
                counts: Counts::default(),
                exited: true,
            });
            e.exited = true;
            clique.ranks[r].status = Status::Gone("exited");
        }
        (!live.is_empty()).then(|| {
            format!("process {pid} (rank(s) {live:?}) exited or lost its connection while its ranks were live: {why}")
        })
    } else {
        let live = clique
            .ranks
            .iter()
            .any(|r| r.remote.is_none() && !matches!(r.status, Status::Gone(_)));
        live.then(|| format!("lost the connection to process {pid}, which made the communicator's unique id and relays its operations (it exited?): {why}"))
    };
    if let Some(msg) = f {
        break_clique(sim, c, Failure::new(NCCL_REMOTE_ERROR, msg), Some(chan));
    }
    if hub {
        settle_all(sim, c);
        sim.nccl.drop_if_done(c);
    }
    notify();
}
