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

/// The calling thread's open group.
#[derive(Default)]
struct Group {
    /// Nesting depth (0: no group).
    depth: u32,
    /// Operations to enqueue at the end, in call order.
    ops: Vec<Queued>,
    /// Rendezvous (unique-id serials) joined inside the group.
    inits: Vec<u64>,
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
pub fn add_init(serial: u64) {
    GROUP.with(|g| g.borrow_mut().inits.push(serial));
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
        for serial in inits {
            let r = wait_joined(sim, serial, deadline);
            first = first.and(r);
        }
        first?;
        enqueue(sim, ops)
    })
}
