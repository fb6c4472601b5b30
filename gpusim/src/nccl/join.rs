//! Communicators across processes: the connections (`transport`), a
//! member process joining a unique id made by another process, the hub's
//! side of that rendezvous, and the dispatch of every message received.
//!
//! A member's ranks join through one connection per unique id: each
//! `ncclCommInitRank` sends `Join`; the hub admits them to its rendezvous
//! with the same checks as its own ranks (`comm::admit`) and, once every
//! rank has joined, makes the clique and sends each member `Welcome` (every
//! rank's process and device), from which the member makes its view of the
//! clique. A failed rendezvous is `JoinFailed` to every member; a member
//! that gives up (its `GPUSIM_NCCL_TIMEOUT_MS` passed) hangs up, which
//! fails the rendezvous at the hub with `ncclSystemError`.

use super::comm::{admit, fail_rendezvous, joining_rank};
use super::net::{self, Net, Peer};
use super::netfail;
use super::state::{Clique, Failure, NcclState};
use super::transport::{self, Flushed, Id, Out};
use super::wire::Msg;
use super::*;
use crate::driver::lock::notify;
use crate::driver::state::{handle as make_handle, Sim};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The most ranks a joiner of another process may ask for.
const MAX_REMOTE_RANKS: usize = 1 << 16;

/// One connection to another process.
#[derive(Debug)]
pub struct ChanInfo {
    /// Its sending end.
    pub out: Out,
    /// The process at the other end.
    pub pid: u32,
    /// The unique id's creator (the hub's process).
    pub creator: u32,
    /// The unique id's serial.
    pub serial: u64,
    /// The clique, once made.
    pub clique: Option<u64>,
    /// This process is the hub (the connection was accepted here).
    pub hub: bool,
}

/// A member's ranks gathering under a unique id of another process.
#[derive(Debug)]
pub struct MemberRv {
    /// The connection to the hub.
    pub chan: u64,
    /// The `nranks` of the first joiner here.
    pub nranks: usize,
    /// This process's ranks → (device, handle).
    pub joined: BTreeMap<usize, (usize, u64)>,
    /// The clique, once welcomed.
    pub clique: Option<u64>,
    /// Set when the rendezvous failed.
    pub failed: Option<Failure>,
    /// Ranks that returned with their communicator.
    pub collected: usize,
}

/// Connections and joins across processes.
#[derive(Debug, Default)]
pub struct Procs {
    /// Open connections, by number.
    pub chans: HashMap<u64, ChanInfo>,
    /// This process's joins to unique ids of other processes, by (creator,
    /// serial).
    pub joins: HashMap<(u32, u64), MemberRv>,
    /// Connections closed, whose writers should finish before a handle's
    /// end returns (a process may exit right after).
    pub closing: Vec<Arc<Flushed>>,
}

impl Procs {
    /// Sends `JoinFailed(f)` through each of `chans` (once each).
    pub fn tell_failed<'a>(&self, chans: impl IntoIterator<Item = &'a u64>, f: &Failure) {
        let mut done = Vec::new();
        for c in chans {
            if !done.contains(c) {
                done.push(*c);
                if let Some(ci) = self.chans.get(c) {
                    ci.out.send(&Msg::JoinFailed(f.clone()));
                }
            }
        }
    }

    /// Closes the connections of clique `c` (it is being forgotten).
    pub fn close_all(&mut self, c: &Clique) {
        for p in c.net.as_ref().map_or(&[][..], |n| &n.peers[..]) {
            if let Some(ci) = self.chans.remove(&p.chan) {
                self.closing.push(ci.out.flushed.clone());
            }
        }
    }
}

/// Waits (briefly, bounded) for the writers of closed connections to
/// finish, so that a process exiting next does not lose their last words.
pub fn await_closing(sim: &mut Sim) {
    for f in std::mem::take(&mut sim.nccl.procs.closing) {
        f.wait(Duration::from_secs(2));
    }
}

/// Registers connection `chan` (accepted by this process's listener).
pub fn open(sim: &mut Sim, chan: u64, info: ChanInfo) {
    sim.nccl.procs.chans.insert(chan, info);
}

/// Joins rank `rank` of `nranks`, on the current context's device, to
/// the rendezvous of unique id `id` of another process; returns the
/// handle made for it (registered once the hub welcomes the ranks).
pub fn join_remote(sim: &mut SimLock, id: &Id, nranks: c_int, rank: c_int) -> NResult<u64> {
    let me = std::process::id();
    let Some(addr) = id.addr else {
        return nfail(
            NCCL_INVALID_USAGE,
            format!("the unique id was made by process {}, which could not open a listening socket; this is process {me}: there is no transport between processes to it", id.pid),
        );
    };
    if transport::own_listener() == Some(addr) {
        return nfail(
            NCCL_INVALID_USAGE,
            format!("the unique id names process {}, but its address {addr} is this process's own listener (pid {me}): the id was altered, so no transport between processes can be set up from it", id.pid),
        );
    }
    let (dev, n, r) = joining_rank(sim, nranks, rank)?;
    let key = (id.pid, id.serial);
    if let Some(rv) = sim.nccl.procs.joins.get(&key) {
        if let Some(f) = &rv.failed {
            let msg = format!("the other ranks of this unique id failed: {}", f.msg);
            return nfail(NCCL_REMOTE_ERROR, msg);
        }
        if rv.clique.is_some() {
            let msg = format!(
                "all {} ranks of this unique id have joined already (rank {r} twice?)",
                rv.nranks
            );
            return nfail(NCCL_INVALID_USAGE, msg);
        }
    } else {
        let (chan, out) = transport::connect(id, addr).map_err(|e| NErr {
            code: NCCL_SYSTEM_ERROR,
            msg: format!(
                "cannot connect to process {} (the unique id's creator) at {addr}: {e}",
                id.pid
            ),
        })?;
        let info = ChanInfo {
            out,
            pid: id.pid,
            creator: id.pid,
            serial: id.serial,
            clique: None,
            hub: false,
        };
        sim.nccl.procs.chans.insert(chan, info);
        let rv = MemberRv {
            chan,
            nranks: n,
            joined: BTreeMap::new(),
            clique: None,
            failed: None,
            collected: 0,
        };
        sim.nccl.procs.joins.insert(key, rv);
    }
    let h = make_handle(TAG_COMM, sim.new_id()) as u64;
    let procs = &mut sim.nccl.procs;
    let Some(rv) = procs.joins.get_mut(&key) else {
        return nfail(NCCL_INTERNAL_ERROR, "the rendezvous vanished");
    };
    rv.joined.insert(r, (dev, h));
    if let Some(ci) = procs.chans.get(&rv.chan) {
        let device = dev;
        ci.out.send(&Msg::Join {
            rank: r,
            nranks: n,
            device,
        });
    }
    Ok(h)
}

/// Waits (lock released) until the hub welcomes the ranks of the join
/// `key` (creator, serial), or fails once `deadline` passes (hanging up,
/// which fails the rendezvous for the other processes).
pub fn wait_remote(sim: &mut SimLock, key: (u32, u64), deadline: Instant) -> NResult<()> {
    let timeout_ms = sim.nccl.timeout.as_millis();
    loop {
        let procs = &mut sim.nccl.procs;
        let Some(rv) = procs.joins.get_mut(&key) else {
            return nfail(NCCL_INTERNAL_ERROR, "the rendezvous vanished");
        };
        if rv.clique.is_some() {
            rv.collected += 1;
            if rv.collected >= rv.joined.len() {
                procs.joins.remove(&key);
            }
            return Ok(());
        }
        if let Some(f) = &rv.failed {
            return Err(f.clone().into());
        }
        if Instant::now() >= deadline {
            let msg = format!(
                "timed out after {timeout_ms} ms (GPUSIM_NCCL_TIMEOUT_MS) waiting for the other ranks of {} to join (ncclCommInitRank; the unique id's creator is process {})",
                rv.nranks, key.0
            );
            let f = Failure::new(NCCL_SYSTEM_ERROR, msg);
            rv.failed = Some(f.clone());
            let chan = rv.chan;
            procs.chans.remove(&chan);
            notify();
            return Err(f.into());
        }
        sim.wait_until(deadline);
    }
}

/// The hub's side of a complete rendezvous: clique `id`'s ranks of other
/// processes (`remote`: rank → connection) get their process, the clique
/// its transport, and every member its `Welcome`.
pub fn make_hub(nc: &mut NcclState, id: u64, remote: &BTreeMap<usize, u64>) {
    if remote.is_empty() {
        return;
    }
    let me = std::process::id();
    let mut peers: Vec<Peer> = Vec::new();
    for (&r, &chan) in remote {
        let pid = nc.procs.chans.get(&chan).map_or(0, |c| c.pid);
        match peers.iter_mut().find(|p| p.chan == chan) {
            Some(p) => p.ranks.push(r),
            None => peers.push(Peer {
                chan,
                pid,
                ranks: vec![r],
                lost: false,
            }),
        }
    }
    let clique = nc.clique(id);
    for p in &peers {
        for &r in &p.ranks {
            clique.ranks[r].remote = Some(p.pid);
        }
    }
    let ranks: Vec<(u32, usize)> = clique
        .ranks
        .iter()
        .map(|x| (x.remote.unwrap_or(me), x.device))
        .collect();
    let chans: Vec<u64> = peers.iter().map(|p| p.chan).collect();
    clique.net = Some(Box::new(Net {
        hub: true,
        peers,
        ..Net::default()
    }));
    for chan in chans {
        if let Some(ci) = nc.procs.chans.get_mut(&chan) {
            ci.clique = Some(id);
            ci.out.send(&Msg::Welcome {
                ranks: ranks.clone(),
            });
        }
    }
}

/// A member's join is welcomed: makes its view of the clique.
fn welcome(sim: &mut Sim, chan: u64, ranks: Vec<(u32, usize)>) -> Result<(), String> {
    let me = std::process::id();
    let nc = &mut sim.nccl;
    let Some(info) = nc.procs.chans.get(&chan) else {
        return Ok(());
    };
    let (key, hub_pid) = ((info.creator, info.serial), info.pid);
    let Some(rv) = nc.procs.joins.get(&key) else {
        return Ok(()); // gave up meanwhile
    };
    if rv.failed.is_some() {
        return Ok(());
    }
    if rv.clique.is_some() || ranks.len() != rv.nranks {
        return Err(format!("a welcome of {} ranks", ranks.len()));
    }
    let mut members = Vec::new();
    let mut remote = Vec::new();
    for (r, &(pid, dev)) in ranks.iter().enumerate() {
        match rv.joined.get(&r) {
            Some(&j) if pid == me => members.push(j),
            None if pid != me => {
                members.push((dev, 0));
                remote.push((r, pid));
            }
            _ => return Err(format!("the welcome's rank {r} is of process {pid}")),
        }
    }
    let id = nc.new_clique(&members);
    let clique = nc.clique(id);
    for &(r, pid) in &remote {
        clique.ranks[r].remote = Some(pid);
    }
    let peer = Peer {
        chan,
        pid: hub_pid,
        ranks: remote.iter().map(|x| x.0).collect(),
        lost: false,
    };
    clique.net = Some(Box::new(Net {
        peers: vec![peer],
        ..Net::default()
    }));
    if let Some(rv) = nc.procs.joins.get_mut(&key) {
        rv.clique = Some(id);
    }
    if let Some(ci) = nc.procs.chans.get_mut(&chan) {
        ci.clique = Some(id);
    }
    Ok(())
}

/// The hub admits rank `rank` of a member (connection `chan`).
fn hub_join(sim: &mut Sim, chan: u64, rank: usize, nranks: usize, device: usize) {
    let Some(info) = sim.nccl.procs.chans.get(&chan) else {
        return;
    };
    let serial = info.serial;
    let r = if !(1..=MAX_REMOTE_RANKS).contains(&nranks) || rank >= nranks {
        nfail(
            NCCL_INVALID_ARGUMENT,
            format!("rank {rank} of nranks {nranks}: need 0 ≤ rank < nranks ≤ {MAX_REMOTE_RANKS}"),
        )
    } else if info.clique.is_some() {
        nfail(
            NCCL_INVALID_USAGE,
            "a rank joined after the communicator was made",
        )
    } else {
        admit(&mut sim.nccl, serial, nranks, rank, (device, 0, Some(chan)))
    };
    if let Err(e) = r {
        net::send(sim, chan, &Msg::JoinFailed(Failure::new(e.code, e.msg)));
    }
}

/// Handles message `m` received through connection `chan`; an error is a
/// malformed message (the connection is then dropped as lost).
pub fn handle(sim: &mut Sim, chan: u64, m: Msg) -> Result<(), String> {
    let Some(info) = sim.nccl.procs.chans.get(&chan) else {
        return Ok(()); // closed here meanwhile
    };
    let (hub, clique) = (info.hub, info.clique);
    let m = match (hub, m) {
        (
            true,
            Msg::Join {
                rank,
                nranks,
                device,
            },
        ) => {
            hub_join(sim, chan, rank, nranks, device);
            return Ok(());
        }
        (false, Msg::Welcome { ranks }) => return welcome(sim, chan, ranks),
        (false, Msg::JoinFailed(f)) => {
            let key = (info.creator, info.serial);
            if let Some(rv) = sim.nccl.procs.joins.get_mut(&key) {
                if rv.clique.is_none() {
                    rv.failed.get_or_insert(f);
                    sim.nccl.procs.chans.remove(&chan);
                }
            }
            return Ok(());
        }
        (_, m) => m,
    };
    let Some(c) = clique else {
        return Err(format!("{} before the communicator was made", m.name()));
    };
    if !sim.nccl.cliques.contains_key(&c) {
        return Ok(()); // forgotten here: its ranks are all gone
    }
    match (hub, m) {
        (true, Msg::Contribute { key, parts }) => super::hub::add(sim, c, Some(chan), key, parts)?,
        (true, Msg::Gone { rank, how, counts }) => {
            netfail::on_gone(sim, c, chan, rank, how, counts)?
        }
        (_, Msg::Broken(f)) => netfail::break_clique(sim, c, f, Some(chan)),
        (
            false,
            Msg::Result {
                key,
                outcomes,
                failure,
            },
        ) => net::on_result(sim, c, key, outcomes, failure)?,
        (false, Msg::Progress { key, ranks }) => net::on_progress(sim, c, key, ranks)?,
        (_, m) => return Err(format!("an unexpected {}", m.name())),
    }
    net::kick(sim, c);
    Ok(())
}

/// Connection `chan` ended (`why`): its communicator or its rendezvous
/// hears of it.
pub fn lost(sim: &mut Sim, chan: u64, why: &str) {
    let Some(info) = sim.nccl.procs.chans.remove(&chan) else {
        return; // closed here
    };
    if let Some(c) = info.clique {
        return netfail::peer_lost(sim, c, chan, why);
    }
    let nc = &mut sim.nccl;
    if !info.hub {
        let key = (info.creator, info.serial);
        if let Some(rv) = nc.procs.joins.get_mut(&key) {
            if rv.clique.is_none() {
                let msg = format!("lost the connection to process {} (the unique id's creator) before every rank joined: {why}", info.creator);
                rv.failed
                    .get_or_insert(Failure::new(NCCL_SYSTEM_ERROR, msg));
            }
        }
        return;
    }
    let Some(rv) = nc.rendezvous.get_mut(&info.serial) else {
        return;
    };
    let ranks: Vec<usize> = rv
        .remote
        .iter()
        .filter(|x| *x.1 == chan)
        .map(|x| *x.0)
        .collect();
    if rv.clique.is_some() || rv.failed.is_some() || ranks.is_empty() {
        return;
    }
    let missing: Vec<usize> = (0..rv.nranks)
        .filter(|r| !rv.joined.contains_key(r))
        .collect();
    let msg = format!(
        "rank(s) {ranks:?} (process {}) gave up or left before every rank joined ({why}); rank(s) {missing:?} of {} never joined (ncclCommInitRank)",
        info.pid, rv.nranks
    );
    fail_rendezvous(&nc.procs, rv, Failure::new(NCCL_SYSTEM_ERROR, msg));
}
