//! `ncclGroupStart` / `ncclGroupEnd`: per calling thread, operations
//! issued inside a group are checked at their call but enqueued only at
//! the outermost `ncclGroupEnd` — so one thread can issue one operation per
//! rank and then end the group without waiting for itself — and all of a
//! device's operations of the group go into one queue item, run together
//! (as NCCL launches a group as one kernel per device). Ranks joined with
//! `ncclCommInitRank` inside a group are waited for at `ncclGroupEnd`.

use super::coll::{enqueue, Queued};
use super::comm::wait_joined;
use super::*;
use std::time::Instant;

/// A rendezvous a rank joined, to be waited for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Init {
    /// Of a unique id of this process (its serial).
    Local(u64),
    /// Of a unique id of another process (its id, the id's serial).
    Remote(u32, u64),
}

/// Waits (lock released) until every rank of `init` has joined, or fails
/// once `deadline` passes.
pub fn wait_init(sim: &mut SimLock, init: Init, deadline: Instant) -> NResult<()> {
    match init {
        Init::Local(serial) => wait_joined(sim, serial, deadline),
        Init::Remote(pid, serial) => super::join::wait_remote(sim, (pid, serial), deadline),
    }
}

/// The calling thread's open group.
#[derive(Default)]
struct Group {
    /// Nesting depth (0: no group).
    depth: u32,
    /// Operations to enqueue at the end, in call order.
    ops: Vec<Queued>,
    /// Rendezvous joined inside the group.
    inits: Vec<Init>,
}

thread_local! {
    static GROUP: RefCell<Group> = RefCell::new(Group::default());
}

/// Whether the calling thread is inside a group.
pub fn in_group() -> bool {
    GROUP.with(|g| g.borrow().depth > 0)
}

/// Adds an operation to the calling thread's group.
pub fn add_op(q: Queued) {
    GROUP.with(|g| g.borrow_mut().ops.push(q));
}

/// Adds a rendezvous joined inside the calling thread's group.
pub fn add_init(init: Init) {
    GROUP.with(|g| g.borrow_mut().inits.push(init));
}

/// `ncclGroupStart`: opens (or nests) a group on the calling thread.
#[no_mangle]
pub extern "C" fn ncclGroupStart() -> NcclResult {
    GROUP.with(|g| g.borrow_mut().depth += 1);
    NCCL_SUCCESS
}

/// `ncclGroupEnd`: closes a group; the outermost waits for the ranks
/// joined inside it (up to `GPUSIM_NCCL_TIMEOUT_MS`), then enqueues its
/// operations. Returns the first error.
#[no_mangle]
pub extern "C" fn ncclGroupEnd() -> NcclResult {
    let taken = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        match g.depth {
            0 => None,
            1 => {
                g.depth = 0;
                Some(Some((
                    std::mem::take(&mut g.ops),
                    std::mem::take(&mut g.inits),
                )))
            }
            _ => {
                g.depth -= 1;
                Some(None)
            }
        }
    });
    let (ops, inits) = match taken {
        None => {
            let e = NErr {
                code: NCCL_INVALID_USAGE,
                msg: "no group is open on this thread (ncclGroupStart first)".into(),
            };
            return report("ncclGroupEnd", e);
        }
        Some(None) => return NCCL_SUCCESS,
        Some(Some(x)) => x,
    };
    if ops.is_empty() && inits.is_empty() {
        return NCCL_SUCCESS;
    }
    nccl_api("ncclGroupEnd", |sim| {
        let deadline = Instant::now() + sim.nccl.timeout;
        let mut first = Ok(());
        for init in inits {
            let r = wait_init(sim, init, deadline);
            first = first.and(r);
        }
        first?;
        enqueue(sim, ops)
    })
}
