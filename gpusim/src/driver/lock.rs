//! Running the device queues, and the lock that lets a synchronising call
//! wait for another thread.
//!
//! Every API call runs with the simulator's one mutex held ([`SimLock`]).
//! Most queued work runs to completion under it, but a NCCL collective
//! (see `crate::nccl`) also needs the other ranks' parts, which other
//! threads may not have enqueued yet: a synchronising call that reaches
//! such a collective must wait for them *without* the mutex, or those
//! threads could never enqueue. So the queue is run by [`Sim::run_to`],
//! which never blocks and reports what it is waiting for, and
//! [`SimLock::drain_to`] repeats it, releasing the mutex on a condition
//! variable in between. Items are named by a per-simulator sequence number
//! (not by their position), so that a drain that resumes after a wait runs
//! exactly what it was asked to even if other threads ran or enqueued work
//! in the meantime.

use super::errors::DResult;
use super::state::{Op, Sim};
use crate::nccl::Wait;
use std::ops::{Deref, DerefMut};
use std::sync::{Condvar, MutexGuard};
use std::time::{Duration, Instant};

/// Signalled whenever something a waiting drain or NCCL rendezvous may be
/// waiting for changes (a rank posts an operation or joins, aborts, fails).
static WAKE: Condvar = Condvar::new();

/// Wakes every thread waiting in [`SimLock::wait_until`].
pub fn notify() {
    WAKE.notify_all();
}

/// What running a queue without waiting came to.
#[derive(Debug)]
pub enum Ran {
    /// Everything asked for ran.
    Done,
    /// A collective at the front needs a rank that has not enqueued its part.
    Blocked(Wait),
}

impl Sim {
    /// The id of the last queued item of `dev` (of stream key `upto` when
    /// given), or `None` when there is nothing to run.
    pub fn target(&self, dev: usize, upto: Option<u64>) -> Option<u64> {
        let q = &self.devices[dev].queue;
        match upto {
            None => q.back().map(|w| w.id),
            Some(s) => q.iter().rev().find(|w| w.stream == s).map(|w| w.id),
        }
    }

    /// Runs the queue of `dev`, in order, up to and including item
    /// `target` (or until the queue is empty), never blocking: a collective
    /// that cannot run yet stops it with [`Ran::Blocked`]. The pool is
    /// trimmed afterwards (a synchronisation).
    pub fn run_to(&mut self, dev: usize, target: u64) -> Ran {
        let r = loop {
            let Some(front) = self.devices[dev].queue.front() else {
                break Ran::Done;
            };
            if front.id > target {
                break Ran::Done;
            }
            if matches!(front.op, Op::Nccl(_)) {
                match crate::nccl::exec::run_front(self, dev) {
                    Ran::Done => continue,
                    blocked => break blocked,
                }
            }
            if let Some(w) = self.devices[dev].queue.pop_front() {
                self.execute(dev, w);
            }
        };
        self.devices[dev].pool.trim();
        r
    }
}

/// The locked simulator, as every API call's body gets it. It dereferences
/// to [`Sim`]; its draining methods may release the lock while they wait
/// for another thread (so state read before a drain may have changed after
/// it, as on a real device where other threads run meanwhile).
pub struct SimLock {
    /// `None` only while released in [`SimLock::wait_until`].
    guard: Option<MutexGuard<'static, Option<Sim>>>,
    /// What the current drain waits for, and until when.
    waiting: Option<(Wait, Instant)>,
}

impl SimLock {
    /// Wraps the held lock of an initialised simulator.
    pub fn new(guard: MutexGuard<'static, Option<Sim>>) -> SimLock {
        debug_assert!(guard.is_some());
        SimLock {
            guard: Some(guard),
            waiting: None,
        }
    }

    /// Releases the lock until [`notify`] is called (or spuriously) or
    /// `deadline` passes, then takes it again.
    pub fn wait_until(&mut self, deadline: Instant) {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        let g = self.guard.take().expect("the lock is held");
        let (g, _) = WAKE
            .wait_timeout(g, left.min(Duration::from_secs(1)))
            .unwrap_or_else(|e| e.into_inner());
        self.guard = Some(g);
    }

    /// Runs queued work of `dev`: all of it (`upto = None`), or up to and
    /// including the last item of stream key `upto`, waiting (lock
    /// released) for collectives whose other ranks are not there yet.
    pub fn drain(&mut self, dev: usize, upto: Option<u64>) {
        if let Some(t) = self.target(dev, upto) {
            self.drain_to(dev, t);
        }
    }

    /// Runs queued work of `dev` up to and including item `target`,
    /// waiting as [`SimLock::drain`] does.
    pub fn drain_to(&mut self, dev: usize, target: u64) {
        loop {
            match self.run_to(dev, target) {
                Ran::Done => break,
                Ran::Blocked(w) => self.wait_for(w),
            }
        }
        self.waiting = None;
    }

    /// Drains (as [`SimLock::drain`]) and returns the calling thread's
    /// first undelivered fault, if any: the semantics of a synchronising
    /// call.
    pub fn sync(&mut self, dev: usize, upto: Option<u64>) -> DResult<()> {
        self.drain(dev, upto);
        self.deliver()
    }

    /// Waits (lock released) for the rank `w` names; once the NCCL timeout
    /// has passed since this drain began waiting for it, fails the
    /// collective instead (every rank then gets the error).
    fn wait_for(&mut self, w: Wait) {
        let now = Instant::now();
        let deadline = match &self.waiting {
            Some((old, d)) if *old == w => *d,
            _ => now + self.nccl.timeout,
        };
        self.waiting = Some((w.clone(), deadline));
        if now >= deadline {
            crate::nccl::exec::time_out(self, &w);
            self.waiting = None;
            notify();
        } else {
            self.wait_until(deadline);
        }
    }
}

impl Deref for SimLock {
    type Target = Sim;
    fn deref(&self) -> &Sim {
        self.guard
            .as_ref()
            .and_then(|g| g.as_ref())
            .expect("the simulator is locked and initialised")
    }
}

impl DerefMut for SimLock {
    fn deref_mut(&mut self) -> &mut Sim {
        self.guard
            .as_mut()
            .and_then(|g| g.as_mut())
            .expect("the simulator is locked and initialised")
    }
}
