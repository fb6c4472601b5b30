//! When a device's queue reaches a NCCL item: finding the other ranks'
//! parts, running the other devices' queues up to them, and running them
//! together.
//!
//! The item's parts name, by key, the parts of the other ranks they run
//! with; those name theirs, and so on: the closure is one *matched set* of
//! items, at most one per device, that must run at once (a group's
//! operations on several communicators link several cliques into one set,
//! as NCCL launches a group as one kernel per device). Each device's queue
//! is run up to its item of the set; a NCCL item met on the way belongs to
//! another set, which is run first, recursively. A set whose items cannot
//! all come first — one of them is queued behind a set that needs it —
//! could never run (the ranks enqueued operations in orders no device
//! queue can satisfy): its operations fail with `ncclInvalidUsage` rather
//! than hang. A part some rank has not enqueued yet makes the walk return
//! [`Ran::Blocked`]; the drain waits (lock released, `driver::lock`) and
//! walks again, so everything here runs without waiting.
//!
//! Ranks of other processes are no part of a matched set: once this
//! process's items of a set are at the fronts of their queues, `net`
//! sends their parts of each operation spanning processes to its hub and
//! the set runs when every outcome has come back (until then the walk is
//! blocked on the first rank of another process, as on a missing part).

use super::state::{Clique, Failure, Key, Wait};
use super::{apply, net, NCCL_INVALID_USAGE, NCCL_REMOTE_ERROR};
use crate::driver::lock::Ran;
use crate::driver::state::{Op, Sim};
use std::collections::HashSet;

/// A queue item: (device, item id).
pub type ItemRef = (usize, u64);

/// How far a walk got.
enum Step {
    /// The set ran.
    Ran,
    /// A rank's part is missing.
    Wait(Wait),
    /// Operations were failed, so the sets changed: walk again.
    Restart,
}

/// Runs the NCCL item at the front of `dev`'s queue with its matched set,
/// running whatever must come first on the other devices; or says which
/// rank it waits for.
pub fn run_front(sim: &mut Sim, dev: usize) -> Ran {
    loop {
        let Some(front) = sim.devices[dev].queue.front() else {
            return Ran::Done;
        };
        let start = (dev, front.id);
        match run_set(sim, start, &mut HashSet::new()) {
            Step::Ran => return Ran::Done,
            Step::Wait(w) => return Ran::Blocked(w),
            // Each restart failed at least one operation, so this ends.
            Step::Restart => continue,
        }
    }
}

/// The NCCL item `it` names, if still queued.
fn item(sim: &Sim, (d, w): ItemRef) -> Option<&super::Item> {
    match &sim.devices[d].queue.iter().find(|x| x.id == w)?.op {
        Op::Nccl(item) => Some(item),
        _ => None,
    }
}

/// The operations of items `items`, for messages.
fn describe(sim: &Sim, items: &[ItemRef]) -> String {
    let mut names = Vec::new();
    for &it in items {
        for p in item(sim, it).map_or(&[][..], |i| &i.parts[..]) {
            let op = Clique::op_name(p.call.kind, p.key);
            let (c, r, d) = (p.clique, p.rank, it.0);
            names.push(format!("{op} of communicator {c} (rank {r}, device {d})"));
        }
    }
    names.join(", ")
}

/// Why rank `r` will never post `key` (its handle is gone, or the
/// communicator broke), if so.
fn never_posts(c: &Clique, r: usize, op: &str) -> Option<Failure> {
    use super::state::Status;
    let why = match c.ranks[r].status {
        Status::Gone(how) => {
            format!("rank {r}'s communicator was {how} before it enqueued its part of {op}")
        }
        Status::Finalized => {
            format!("rank {r} finalized its communicator before it enqueued its part of {op}")
        }
        Status::Live => match &c.broken {
            Some(f) => return Some(f.clone()),
            None => return None,
        },
    };
    Some(Failure::new(NCCL_REMOTE_ERROR, why))
}

/// What gathering a matched set came to.
enum Gathered {
    Set(Vec<ItemRef>),
    Missing(Wait),
    Failed(u64, Key, Failure),
}

/// The matched set of `start`: every item linked to it through the keys
/// of its (not failed) parts.
fn gather(sim: &Sim, start: ItemRef) -> Gathered {
    let mut set = vec![start];
    let mut i = 0;
    while i < set.len() {
        // A posted part stays queued until its set runs (apply unposts it).
        let it = item(sim, set[i]).expect("a posted NCCL item is queued");
        i += 1;
        for p in &it.parts {
            let c = &sim.nccl.cliques[&p.clique];
            if c.failed.contains_key(&p.key) {
                continue;
            }
            for r in c.participants(p.key) {
                if c.ranks[r].remote.is_some() {
                    continue; // its process sends its part to the hub
                }
                match c.posted.get(&p.key).and_then(|m| m.get(&r)) {
                    Some(q) if !set.contains(&(q.device, q.work)) => set.push((q.device, q.work)),
                    Some(_) => {}
                    None => {
                        let op = Clique::op_name(p.call.kind, p.key);
                        if let Some(f) = never_posts(c, r, &op) {
                            return Gathered::Failed(p.clique, p.key, f);
                        }
                        let (clique, key, rank) = (p.clique, p.key, r);
                        return Gathered::Missing(Wait { clique, key, rank });
                    }
                }
            }
        }
    }
    Gathered::Set(set)
}

/// Fails every operation of the items of `set` with `ncclInvalidUsage`
/// saying `why`.
fn fail_set(sim: &mut Sim, set: &[ItemRef], why: &str) {
    let msg = format!(
        "deadlock: {} cannot run: {why} (the ranks enqueued NCCL operations in orders that cannot complete; gpusim runs all streams of a device in one queue)",
        describe(sim, set)
    );
    let keys: Vec<(u64, Key)> = set
        .iter()
        .filter_map(|&it| item(sim, it))
        .flat_map(|i| i.parts.iter().map(|p| (p.clique, p.key)))
        .collect();
    for (c, k) in keys {
        let f = Failure::new(NCCL_INVALID_USAGE, msg.clone());
        sim.nccl.clique(c).fail_key(k, f);
    }
}

/// Runs the matched set of `start` (see the module doc); `busy` holds the
/// items of the sets being assembled further up.
fn run_set(sim: &mut Sim, start: ItemRef, busy: &mut HashSet<ItemRef>) -> Step {
    let set = match gather(sim, start) {
        Gathered::Set(s) => s,
        Gathered::Missing(w) => return Step::Wait(w),
        Gathered::Failed(c, k, f) => {
            sim.nccl.clique(c).fail_key(k, f);
            return Step::Restart;
        }
    };
    for (i, a) in set.iter().enumerate() {
        if let Some(b) = set[i + 1..].iter().find(|b| b.0 == a.0) {
            let why = format!(
                "two of its parts are queued on device {} (items {} and {}), and the later one cannot run before the earlier, which needs it",
                a.0, a.1, b.1
            );
            fail_set(sim, &set, &why);
            return Step::Restart;
        }
    }
    busy.extend(set.iter().copied());
    let mut step = Step::Ran;
    for &(d, w) in &set {
        step = advance(sim, d, w, busy, &set);
        if !matches!(step, Step::Ran) {
            break;
        }
    }
    for it in &set {
        busy.remove(it);
    }
    if !matches!(step, Step::Ran) {
        return step;
    }
    match net::ready(sim, &set) {
        net::Ready::Go => {}
        net::Ready::Wait(w) => return Step::Wait(w),
        net::Ready::Restart => return Step::Restart,
    }
    let mut works = Vec::new();
    for &(d, w) in &set {
        match sim.devices[d].queue.pop_front() {
            Some(x) if x.id == w => works.push((d, x)),
            other => panic!(
                "NCCL item {w} of device {d} is not at the front: {:?}",
                other.map(|x| x.id)
            ),
        }
    }
    apply::run(sim, works);
    Step::Ran
}

/// Runs `d`'s queue until item `target` is at its front: plain work runs,
/// NCCL items of other sets run with their sets; an item of a set being
/// assembled (`busy`) in the way is a deadlock of `set`.
fn advance(
    sim: &mut Sim,
    d: usize,
    target: u64,
    busy: &mut HashSet<ItemRef>,
    set: &[ItemRef],
) -> Step {
    let mut ran = false;
    let step = loop {
        let Some(front) = sim.devices[d].queue.front() else {
            break Step::Restart;
        };
        let f = (d, front.id);
        if f.1 == target {
            break Step::Ran;
        }
        if f.1 > target {
            break Step::Restart;
        }
        if !matches!(front.op, Op::Nccl(_)) {
            if let Some(w) = sim.devices[d].queue.pop_front() {
                sim.execute(d, w);
                ran = true;
            }
            continue;
        }
        if busy.contains(&f) {
            let why = format!(
                "on device {d} its part is queued behind {}, which needs work queued behind it",
                describe(sim, &[f])
            );
            fail_set(sim, set, &why);
            break Step::Restart;
        }
        match run_set(sim, f, busy) {
            Step::Ran => ran = true,
            other => break other,
        }
    };
    if ran {
        // The queue ran: a synchronisation for the pool, as in `run_to`.
        sim.devices[d].pool.trim();
    }
    step
}

/// Gives up waiting for `w`: the operation fails on every rank that
/// posted it (`ncclRemoteError`), and the communicator breaks — every
/// rank's asynchronous error is set and no new operations are accepted.
pub fn time_out(sim: &mut Sim, w: &Wait) {
    let timeout_ms = sim.nccl.timeout.as_millis();
    let Some(c) = sim.nccl.cliques.get(&w.clique) else {
        return;
    };
    let posted = c.posted.get(&w.key);
    if c.failed.contains_key(&w.key) || posted.is_some_and(|m| m.contains_key(&w.rank)) {
        return; // resolved meanwhile
    }
    let kind = posted
        .and_then(|m| m.values().next())
        .and_then(|p| item(sim, (p.device, p.work)))
        .and_then(|i| {
            i.parts
                .iter()
                .find(|x| x.clique == w.clique && x.key == w.key)
        })
        .map(|p| p.call.kind);
    let op = match kind {
        Some(k) => Clique::op_name(k, w.key),
        None => format!("{:?}", w.key),
    };
    if c.ranks[w.rank].remote.is_some() {
        return super::netfail::time_out(sim, w, &op);
    }
    let msg = format!(
        "timed out after {timeout_ms} ms (GPUSIM_NCCL_TIMEOUT_MS) waiting for rank {} (device {}) to enqueue its part of {op}",
        w.rank, c.ranks[w.rank].device
    );
    let f = Failure::new(NCCL_REMOTE_ERROR, msg);
    let c = sim.nccl.clique(w.clique);
    c.fail_key(w.key, f.clone());
    for r in 0..c.nranks() {
        c.set_async_error(r, &f);
    }
    c.broken.get_or_insert(f.clone());
    super::netfail::spread_broken(sim, w.clique, &f, None);
}
