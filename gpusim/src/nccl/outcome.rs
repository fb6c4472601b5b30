//! What one matched operation comes to, from every rank's call and input:
//! a pure function of them, so that the process that decides it — the
//! only one of a communicator within one process, or the hub of one whose
//! ranks live in several processes (`net`) — gets the same bytes and the
//! same errors. In order: a rank that skipped its part (its thread has an
//! undelivered fault) fails the others with `ncclRemoteError`; calls that
//! disagree fail every rank with `ncclInvalidUsage`; an unreadable send
//! buffer is its rank's memory fault and the others' `ncclRemoteError`;
//! otherwise the outputs are computed, reductions in rank order
//! (`reduce`).

use super::reduce::reduce;
use super::state::{Call, Clique, Failure, Key, Kind};
use super::{NCCL_INVALID_USAGE, NCCL_REMOTE_ERROR, NCCL_UNHANDLED_CUDA_ERROR};
use crate::driver::consts::{CUresult, CUDA_ERROR_ILLEGAL_ADDRESS, CUDA_ERROR_LAUNCH_FAILED};

/// What one rank brings: its send buffer's bytes, or why it has none.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Input {
    /// The bytes its call reads (empty where it reads none).
    Data(Vec<u8>),
    /// Reading them faulted (never written, freed): why.
    Unreadable(String),
    /// Its thread has an undelivered fault: it skips its part.
    Skipped,
}

/// One rank's part of an operation: who, what call, what input.
#[derive(Clone, Debug)]
pub struct Contrib {
    /// The rank.
    pub rank: usize,
    /// Its call.
    pub call: Call,
    /// Its input.
    pub input: Input,
}

/// What happens to one rank's part.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Its receive buffer gets these bytes (none where it writes none).
    Write(Vec<u8>),
    /// A fault of its enqueuing thread: the NCCL failure and the driver
    /// code the thread's synchronising call returns.
    Fault(Failure, CUresult),
    /// It skipped its part: one more skipped operation of its thread.
    Skip,
    /// Nothing (a skipped receive).
    Nothing,
}

/// The outcome of every part (in the order given) and the operation's
/// failure, if it failed.
#[derive(Clone, Debug)]
pub struct Decided {
    /// By part.
    pub outcomes: Vec<Outcome>,
    /// The operation's failure (every rank's asynchronous error).
    pub failure: Option<Failure>,
}

/// Bytes a rank's part reads from its send buffer (0: none).
pub fn send_len(c: &Call, rank: usize, nranks: usize) -> usize {
    let b = c.count * c.dtype.size();
    match c.kind {
        Kind::AllReduce | Kind::Reduce | Kind::AllGather | Kind::Send => b,
        Kind::Broadcast if rank == c.root => b,
        Kind::ReduceScatter => b * nranks,
        Kind::Broadcast | Kind::Recv => 0,
    }
}

/// Bytes a rank's part writes to its receive buffer (0: none).
pub fn recv_len(c: &Call, rank: usize, nranks: usize) -> usize {
    let b = c.count * c.dtype.size();
    match c.kind {
        Kind::AllReduce | Kind::Broadcast | Kind::ReduceScatter | Kind::Recv => b,
        Kind::Reduce if rank == c.root => b,
        Kind::AllGather => b * nranks,
        Kind::Reduce | Kind::Send => 0,
    }
}

/// Decides operation `key` from its parts, sorted by rank (a self-send
/// before its receive), one per participant.
pub fn decide(key: Key, parts: &[Contrib]) -> Decided {
    let op = Clique::op_name(parts[0].call.kind, key);
    let every =
        |f: &Failure| vec![Outcome::Fault(f.clone(), CUDA_ERROR_LAUNCH_FAILED); parts.len()];
    let skipped: Vec<usize> = parts
        .iter()
        .filter(|p| p.input == Input::Skipped)
        .map(|p| p.rank)
        .collect();
    if !skipped.is_empty() {
        let f = Failure::new(
            NCCL_REMOTE_ERROR,
            format!("{op}: rank(s) {skipped:?} skipped their part: their thread has an undelivered fault (a faulted context runs no more work)"),
        );
        let outcomes = parts
            .iter()
            .map(|p| match (skipped.contains(&p.rank), p.call.kind) {
                (true, Kind::Recv) => Outcome::Nothing,
                (true, _) => Outcome::Skip,
                (false, _) => Outcome::Fault(f.clone(), CUDA_ERROR_LAUNCH_FAILED),
            })
            .collect();
        return Decided {
            outcomes,
            failure: Some(f),
        };
    }
    if let Err(msg) = check_match(key, parts) {
        let f = Failure::new(NCCL_INVALID_USAGE, format!("{op}: {msg}"));
        return Decided {
            outcomes: every(&f),
            failure: Some(f),
        };
    }
    let mut inputs = Vec::with_capacity(parts.len());
    for (i, p) in parts.iter().enumerate() {
        match &p.input {
            Input::Data(d) => inputs.push(d.as_slice()),
            Input::Unreadable(err) => return unreadable(&op, parts, i, err),
            Input::Skipped => unreachable!("skipped parts were handled above"),
        }
    }
    let mut outcomes = vec![Outcome::Nothing; parts.len()];
    for (i, bytes) in compute(parts, &inputs) {
        outcomes[i] = Outcome::Write(bytes);
    }
    Decided {
        outcomes,
        failure: None,
    }
}

/// Part `i`'s send buffer could not be read: its rank's fault is a memory
/// fault, everyone else's a remote error; nothing is written.
fn unreadable(op: &str, parts: &[Contrib], i: usize, err: &str) -> Decided {
    let own = Failure::new(NCCL_UNHANDLED_CUDA_ERROR, err);
    let remote = Failure::new(
        NCCL_REMOTE_ERROR,
        format!("{op}: rank {}'s part faulted: {err}", parts[i].rank),
    );
    let outcomes = (0..parts.len())
        .map(|j| match j == i {
            true => Outcome::Fault(own.clone(), CUDA_ERROR_ILLEGAL_ADDRESS),
            false => Outcome::Fault(remote.clone(), CUDA_ERROR_LAUNCH_FAILED),
        })
        .collect();
    Decided {
        outcomes,
        failure: Some(remote),
    }
}

/// Whether the ranks' calls agree; what differs if not.
fn check_match(key: Key, parts: &[Contrib]) -> Result<(), String> {
    let first = &parts[0];
    if let Key::P2p { .. } = key {
        let (Some(s), Some(r)) = (
            parts.iter().find(|p| p.call.kind == Kind::Send),
            parts.iter().find(|p| p.call.kind == Kind::Recv),
        ) else {
            return Err("a send matched no receive".into());
        };
        let (a, b) = (&s.call, &r.call);
        if (a.count, a.dtype) != (b.count, b.dtype) {
            return Err(format!(
                "rank {} sends {} × {:?} but rank {} receives {} × {:?}",
                s.rank, a.count, a.dtype, r.rank, b.count, b.dtype
            ));
        }
        return Ok(());
    }
    let a = &first.call;
    for p in &parts[1..] {
        let b = &p.call;
        let (ra, rb) = (first.rank, p.rank);
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

/// The bytes each part receives (part index, bytes), from the inputs.
fn compute(parts: &[Contrib], all: &[&[u8]]) -> Vec<(usize, Vec<u8>)> {
    let c = parts[0].call;
    let reduced = || reduce(c.dtype, c.op, all).expect("checked reducible at the call");
    let everyone = |bytes: Vec<u8>| (0..parts.len()).map(|i| (i, bytes.clone())).collect();
    match c.kind {
        Kind::AllReduce => everyone(reduced()),
        Kind::Reduce => {
            let root = parts.iter().position(|p| p.rank == c.root);
            root.map(|i| (i, reduced())).into_iter().collect()
        }
        Kind::Broadcast => everyone(all[c.root].to_vec()),
        Kind::AllGather => everyone(all.concat()),
        Kind::ReduceScatter => {
            let block = c.count * c.dtype.size();
            (0..parts.len())
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
            let s = parts.iter().position(|p| p.call.kind == Kind::Send);
            let r = parts.iter().position(|p| p.call.kind == Kind::Recv);
            match (s, r) {
                (Some(s), Some(r)) => vec![(r, all[s].to_vec())],
                _ => Vec::new(),
            }
        }
    }
}
