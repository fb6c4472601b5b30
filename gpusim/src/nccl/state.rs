//! The NCCL stand-in's state, kept in the simulator (under its one mutex):
//! communicators (a clique of ranks, one device each), the rendezvous of
//! ranks joining by unique id, and which rank has posted which operation.
//!
//! Operations are matched by a key, never by position in a queue: the
//! `s`-th collective a rank enqueues on a communicator is collective `s`
//! of every rank ([`Key::Coll`]); the `n`-th send from rank `a` to rank
//! `b` is received by `b`'s `n`-th receive from `a` ([`Key::P2p`]), as
//! NCCL matches point-to-point operations.

use super::reduce::{DataType, RedOp};
use super::NcclResult;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

/// A failure of a communicator or of one matched operation: the NCCL code
/// and what happened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// The `ncclResult_t`.
    pub code: NcclResult,
    /// What happened, in words.
    pub msg: String,
}

impl Failure {
    /// A failure.
    pub fn new(code: NcclResult, msg: impl Into<String>) -> Failure {
        Failure {
            code,
            msg: msg.into(),
        }
    }
}

/// What matches one operation with its counterparts on the other ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Key {
    /// The communicator's collective number `s` (0, 1, …), on every rank.
    Coll(u64),
    /// The `n`-th send from `src` to `dst` and `dst`'s `n`-th receive from
    /// `src`.
    P2p {
        /// Sending rank.
        src: usize,
        /// Receiving rank.
        dst: usize,
        /// Number of the pair's transfer.
        n: u64,
    },
}

/// What a blocked drain waits for: rank `rank` of clique `clique` to post
/// its part of operation `key`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wait {
    /// The clique.
    pub clique: u64,
    /// The operation.
    pub key: Key,
    /// The rank that has not posted it.
    pub rank: usize,
}

/// Which NCCL call an operation is: the profile's own record of it.
pub use crate::profile::CollectiveKind as Kind;

impl Kind {
    /// The entry point's name.
    pub fn name(self) -> &'static str {
        match self {
            Kind::AllReduce => "ncclAllReduce",
            Kind::Broadcast => "ncclBroadcast",
            Kind::Reduce => "ncclReduce",
            Kind::AllGather => "ncclAllGather",
            Kind::ReduceScatter => "ncclReduceScatter",
            Kind::Send => "ncclSend",
            Kind::Recv => "ncclRecv",
        }
    }

    /// Whether the call reduces (has an operator).
    pub fn reduces(self) -> bool {
        matches!(self, Kind::AllReduce | Kind::Reduce | Kind::ReduceScatter)
    }

    /// Whether the call has a root.
    pub fn rooted(self) -> bool {
        matches!(self, Kind::Broadcast | Kind::Reduce)
    }
}

/// One rank's call, its arguments checked at the call.
#[derive(Clone, Copy, Debug)]
pub struct Call {
    /// Which call.
    pub kind: Kind,
    /// Send buffer (0 where the call does not read one on this rank).
    pub send: u64,
    /// Receive buffer (0 where the call does not write one on this rank).
    pub recv: u64,
    /// The count argument (elements; per rank for AllGather's send and
    /// ReduceScatter's receive buffer).
    pub count: usize,
    /// Element type.
    pub dtype: DataType,
    /// Operator (`Sum` for calls that do not reduce).
    pub op: RedOp,
    /// Root (Broadcast, Reduce) or peer (Send, Recv); 0 otherwise.
    pub root: usize,
}

impl Call {
    /// Bytes of the call's largest buffer (what nccl-tests calls its size):
    /// the count × element size, times the ranks for AllGather's receive
    /// and ReduceScatter's send buffer.
    pub fn bytes(&self, nranks: usize) -> u64 {
        let b = (self.count * self.dtype.size()) as u64;
        match self.kind {
            Kind::AllGather | Kind::ReduceScatter => b * nranks as u64,
            _ => b,
        }
    }
}

/// One operation of a queued [`Item`].
#[derive(Clone, Debug)]
pub struct Part {
    /// The clique.
    pub clique: u64,
    /// The calling rank.
    pub rank: usize,
    /// Its match key.
    pub key: Key,
    /// The call.
    pub call: Call,
}

/// A device queue's NCCL item: the operations one `ncclGroupEnd` (or one
/// ungrouped call) put on one stream of the device. They run together, with
/// their counterparts on the other devices, as NCCL launches a group's
/// operations as one kernel.
#[derive(Debug)]
pub struct Item {
    /// The operations, in call order.
    pub parts: Vec<Part>,
}

/// Where a rank's part of an operation waits: the device queue item.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Posted {
    /// The device.
    pub device: usize,
    /// The queue item's id.
    pub work: u64,
}

/// The life of one rank's communicator handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// Usable.
    Live,
    /// `ncclCommFinalize` ran: no new operations.
    Finalized,
    /// Destroyed or aborted (the word says which): the handle is gone.
    Gone(&'static str),
}

/// One rank of a clique.
#[derive(Debug)]
pub struct RankInfo {
    /// Its device.
    pub device: usize,
    /// Its communicator handle.
    pub handle: u64,
    /// Its life.
    pub status: Status,
    /// The first asynchronous error (`ncclCommGetAsyncError`).
    pub async_error: Option<Failure>,
    /// Collectives enqueued so far (the next one's number).
    pub coll_seq: u64,
    /// Sends enqueued so far, by peer.
    pub sent: HashMap<usize, u64>,
    /// Receives enqueued so far, by peer.
    pub received: HashMap<usize, u64>,
    /// The process that holds the rank, when it is not this one (its
    /// device and handle are then that process's business).
    pub remote: Option<u32>,
}

/// The ranks of one communicator and their operations in flight.
#[derive(Debug)]
pub struct Clique {
    /// The ranks, by rank.
    pub ranks: Vec<RankInfo>,
    /// Posted parts not yet run: key → rank → where.
    pub posted: HashMap<Key, BTreeMap<usize, Posted>>,
    /// Operations that failed (a timeout, a mismatch, an abort): parts of
    /// them still queued fail with this when they run.
    pub failed: HashMap<Key, Failure>,
    /// Set when a rank timed out waiting for another: no new operations.
    pub broken: Option<Failure>,
    /// Parts of its operations still in device queues (the clique is kept
    /// while any is: `posted` alone can miss a self-send's part).
    pub queued: usize,
    /// The transport, when some ranks live in other processes (`net`).
    pub net: Option<Box<super::net::Net>>,
}

impl Clique {
    /// Number of ranks.
    pub fn nranks(&self) -> usize {
        self.ranks.len()
    }

    /// The ranks that take part in operation `key`.
    pub fn participants(&self, key: Key) -> Vec<usize> {
        match key {
            Key::Coll(_) => (0..self.nranks()).collect(),
            Key::P2p { src, dst, .. } if src == dst => vec![src],
            Key::P2p { src, dst, .. } => vec![src, dst],
        }
    }

    /// Whether operation `key` has participants in other processes.
    pub fn spans(&self, key: Key) -> bool {
        self.net.is_some()
            && self
                .participants(key)
                .iter()
                .any(|&r| self.ranks.get(r).is_some_and(|x| x.remote.is_some()))
    }

    /// Records rank `rank`'s first asynchronous error.
    pub fn set_async_error(&mut self, rank: usize, f: &Failure) {
        if let Some(r) = self.ranks.get_mut(rank) {
            r.async_error.get_or_insert_with(|| f.clone());
        }
    }

    /// Fails operation `key` for all its participants (the first failure
    /// of a key stands).
    pub fn fail_key(&mut self, key: Key, f: Failure) {
        if self.failed.contains_key(&key) {
            return;
        }
        for r in self.participants(key) {
            self.set_async_error(r, &f);
        }
        self.failed.insert(key, f);
    }

    /// "ncclAllReduce #3" or "ncclSend #0 of rank 0 → rank 1": an
    /// operation, for messages.
    pub fn op_name(kind: Kind, key: Key) -> String {
        match key {
            Key::Coll(s) => format!("{} #{s}", kind.name()),
            Key::P2p { src, dst, n } => {
                format!("{} #{n} of rank {src} → rank {dst}", kind.name())
            }
        }
    }
}

/// Ranks gathering under one unique id.
#[derive(Debug)]
pub struct Rendezvous {
    /// The number of ranks the first joiner gave.
    pub nranks: usize,
    /// Rank → (device, handle made for it; 0 for a rank of another
    /// process).
    pub joined: BTreeMap<usize, (usize, u64)>,
    /// Ranks of other processes → the connection they joined through.
    pub remote: BTreeMap<usize, u64>,
    /// The clique, once every rank joined.
    pub clique: Option<u64>,
    /// Set when the rendezvous failed (a timeout, a bad joiner).
    pub failed: Option<Failure>,
    /// Ranks that returned with their communicator.
    pub collected: usize,
}

/// A live communicator handle's clique and rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommRef {
    /// The clique.
    pub clique: u64,
    /// The rank.
    pub rank: usize,
}

/// All of the NCCL stand-in's state.
#[derive(Debug)]
pub struct NcclState {
    /// `GPUSIM_NCCL_TIMEOUT_MS`.
    pub timeout: Duration,
    /// Cliques by id.
    pub cliques: HashMap<u64, Clique>,
    /// Live communicator handles.
    pub comms: HashMap<u64, CommRef>,
    /// Rendezvous by unique-id serial.
    pub rendezvous: HashMap<u64, Rendezvous>,
    /// Connections to other processes, and joins through them (`join`).
    pub procs: super::join::Procs,
    next_clique: u64,
}

impl NcclState {
    /// No communicators; waits time out after `timeout_ms`.
    pub fn new(timeout_ms: u64) -> NcclState {
        NcclState {
            timeout: Duration::from_millis(timeout_ms),
            cliques: HashMap::new(),
            comms: HashMap::new(),
            rendezvous: HashMap::new(),
            procs: Default::default(),
            next_clique: 0,
        }
    }

    /// Makes a clique of `members` (device, handle), rank by rank, and
    /// registers the handles (0: a rank of another process, which has
    /// none here); returns its id.
    pub fn new_clique(&mut self, members: &[(usize, u64)]) -> u64 {
        self.next_clique += 1;
        let id = self.next_clique;
        let ranks = members
            .iter()
            .enumerate()
            .map(|(rank, &(device, handle))| {
                if handle != 0 {
                    self.comms.insert(handle, CommRef { clique: id, rank });
                }
                RankInfo {
                    device,
                    handle,
                    status: Status::Live,
                    async_error: None,
                    coll_seq: 0,
                    sent: HashMap::new(),
                    received: HashMap::new(),
                    remote: None,
                }
            })
            .collect();
        let clique = Clique {
            ranks,
            posted: HashMap::new(),
            failed: HashMap::new(),
            broken: None,
            queued: 0,
            net: None,
        };
        self.cliques.insert(id, clique);
        id
    }

    /// Forgets clique `id` once every rank's handle is gone and nothing of
    /// it is queued (a member of a communicator spanning processes counts
    /// its own ranks only; the hub counts all) and closes its connections.
    pub fn drop_if_done(&mut self, id: u64) {
        let done = self.cliques.get(&id).is_some_and(|c| {
            let hub = c.net.as_ref().is_none_or(|n| n.hub);
            c.queued == 0
                && c.ranks
                    .iter()
                    .all(|r| matches!(r.status, Status::Gone(_)) || (!hub && r.remote.is_some()))
        });
        if done {
            if let Some(c) = self.cliques.remove(&id) {
                self.procs.close_all(&c);
            }
        }
    }

    /// The clique `id` (it exists while anything refers to it).
    pub fn clique(&mut self, id: u64) -> &mut Clique {
        self.cliques
            .get_mut(&id)
            .expect("a referenced clique exists")
    }
}
