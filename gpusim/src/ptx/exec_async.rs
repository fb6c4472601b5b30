//! Execution of the asynchronous copies (`cp.async`, `commit_group`,
//! `wait_group`, `wait_all`) and their sanitizer rules.
//!
//! A copy reads global memory when it is issued (memcheck and initcheck as
//! for `ld.global`, only the src-size bytes it reads) and holds the bytes
//! until a `wait_group`/`wait_all` of the issuing thread covers its group;
//! only then are they written to shared memory. Until then its destination
//! bytes are *pending*: any access of them, by any thread of the block
//! (the issuing thread included), is a [`FaultKind::SharedRace`] naming the
//! `cp.async`; so is a copy still pending (never committed, or committed
//! but never waited for) when the block ends. At issue the destination is
//! race-checked as a write against the other threads' accesses since the
//! last barrier; at completion it is recorded as written by the issuing
//! thread, so other threads must pass a barrier before reading it.

use super::exec::{thread_of, Exec, Warp};
use super::ir::*;
use super::mem::{Cell, NONE};
use super::{Fault, FaultKind};
use crate::memory::MemError;
use std::collections::VecDeque;

/// A copy's group before `commit_group`.
const UNCOMMITTED: u32 = u32::MAX;

/// One copy in flight.
#[derive(Clone, Copy, Debug)]
struct Copy {
    /// Shared destination offset.
    dst: u32,
    /// cp-size.
    len: u8,
    /// The bytes read at issue (zero-filled past src-size).
    bytes: [u8; 16],
    /// Issuing thread (warp · 32 + lane).
    tid: u32,
    /// The `cp.async` instruction.
    pc: u32,
    /// The thread's group number, or [`UNCOMMITTED`].
    group: u32,
}

/// The block's copies in flight.
#[derive(Default)]
pub(crate) struct AsyncCopies {
    /// Copies, by slot (free slots are reused).
    slab: Vec<Copy>,
    free: Vec<u32>,
    /// Copies in flight.
    live: u32,
    /// Per shared byte: 1 + the slot of the copy that will write it, or 0.
    owner: Vec<u32>,
    /// Per thread: its copies in issue order (slots).
    queues: Vec<VecDeque<u32>>,
    /// Per thread: groups committed so far.
    groups: Vec<u32>,
}

impl AsyncCopies {
    /// Whether any copy is in flight (else nothing needs checking).
    #[inline(always)]
    pub(crate) fn active(&self) -> bool {
        self.live != 0
    }

    /// A new block: no thread has committed a group yet (a block that ended
    /// normally has no copy in flight).
    pub(crate) fn reset(&mut self) {
        self.groups.fill(0);
        if self.live != 0 {
            *self = AsyncCopies::default();
        }
    }

    /// The copy whose pending write covers shared byte `off`, if any:
    /// (issuing thread, instruction).
    #[inline]
    fn pending(&self, off: usize) -> Option<(u32, u32)> {
        match self.owner.get(off) {
            Some(&o) if o != 0 => {
                let c = &self.slab[o as usize - 1];
                Some((c.tid, c.pc))
            }
            _ => None,
        }
    }

    fn thread(&mut self, tid: u32) -> usize {
        let t = tid as usize;
        if self.queues.len() <= t {
            self.queues.resize_with(t + 1, VecDeque::new);
            self.groups.resize(t + 1, 0);
        }
        t
    }

    fn add(&mut self, c: Copy) {
        let slot = match self.free.pop() {
            Some(s) => {
                self.slab[s as usize] = c;
                s
            }
            None => {
                self.slab.push(c);
                self.slab.len() as u32 - 1
            }
        };
        for o in &mut self.owner[c.dst as usize..c.dst as usize + c.len as usize] {
            *o = slot + 1;
        }
        let t = self.thread(c.tid);
        self.queues[t].push_back(slot);
        self.live += 1;
    }

    /// `commit_group` by thread `tid`: its uncommitted copies (the tail of
    /// its queue) form its next group, possibly empty.
    fn commit(&mut self, tid: u32) {
        let t = self.thread(tid);
        let g = self.groups[t];
        for &s in self.queues[t].iter().rev() {
            let c = &mut self.slab[s as usize];
            if c.group != UNCOMMITTED {
                break;
            }
            c.group = g;
        }
        self.groups[t] = g.wrapping_add(1);
    }

    /// Takes thread `tid`'s next copy that `wait_group n` completes.
    fn next_done(&mut self, tid: u32, n: u32) -> Option<Copy> {
        let t = self.thread(tid);
        let limit = self.groups[t].saturating_sub(n);
        let &s = self.queues[t].front()?;
        let c = self.slab[s as usize];
        if c.group == UNCOMMITTED || c.group >= limit {
            return None;
        }
        self.queues[t].pop_front();
        self.free.push(s);
        self.live -= 1;
        self.owner[c.dst as usize..c.dst as usize + c.len as usize].fill(0);
        Some(c)
    }

    /// Any copy in flight: the first by slab order.
    fn any_pending(&self) -> Option<Copy> {
        let q = self.queues.iter().find(|q| !q.is_empty())?;
        Some(self.slab[q[0] as usize])
    }
}

impl Exec<'_> {
    /// `cp.async`, `commit_group`, `wait_group`/`wait_all` for the lanes of `m`.
    pub(crate) fn async_op(&mut self, w: &mut Warp, op: &Op, m: u32, pc: u32) -> Result<(), Fault> {
        let mut rest = m;
        while rest != 0 {
            let l = rest.trailing_zeros() as usize;
            rest &= rest - 1;
            let tid = w.id * 32 + l as u32;
            match op {
                Op::CpAsync(c) => self.cp_async_lane(w, l, pc, c)?,
                Op::CpAsyncCommit => self.shared.asyncq.commit(tid),
                &Op::CpAsyncWait { n, all } => {
                    if all {
                        self.shared.asyncq.commit(tid);
                    }
                    self.shared.stamp = self.shared.stamp.wrapping_add(1);
                    while let Some(c) = self.shared.asyncq.next_done(tid, n) {
                        self.complete(c);
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// The address of `a` in lane `l`.
    fn lane_addr(w: &Warp, a: &Addr, l: usize) -> u64 {
        match a.base {
            Base::Reg(s) => w.regs[(w.reg_base + s as usize) * 32 + l].wrapping_add(a.off),
            Base::Abs => a.off,
            Base::Frame => (w.frame_base as u64).wrapping_add(a.off),
        }
    }

    /// Issues lane `l`'s copy: checks, reads the source, marks the
    /// destination pending.
    fn cp_async_lane(&mut self, w: &Warp, l: usize, pc: u32, c: &CpAsync) -> Result<(), Fault> {
        let (dst, src) = (Self::lane_addr(w, &c.dst, l), Self::lane_addr(w, &c.src, l));
        let size = c.size as u64;
        let mut n = match c.src_size {
            Some(s) => w.regs[(w.reg_base + s as usize) * 32 + l] as u32 as u64,
            None => size,
        };
        if let Some((p, neg)) = c.ignore {
            if (w.preds[w.pred_base + p as usize] >> l & 1 != 0) != neg {
                n = 0;
            }
        }
        let fault = |kind, addr, detail: String| self.fault(kind, w.id, l as u32, pc, addr, detail);
        if n > size {
            let d = format!("cp.async: src-size {n} exceeds cp-size {size}");
            return Err(fault(FaultKind::Trap, None, d));
        }
        for (a, what) in [(dst, "shared destination"), (src, "global source")] {
            if a % size != 0 {
                let d = format!("cp.async {what} {a:#x} is not aligned to its cp-size {size}");
                return Err(fault(FaultKind::Misaligned, Some(a), d));
            }
        }
        if dst.saturating_add(size) > self.shared.data.len() as u64 {
            let d = format!("out-of-bounds cp.async destination of {size} bytes: {}", {
                self.shared.describe(dst)
            });
            return Err(fault(FaultKind::OutOfBounds, Some(dst), d));
        }
        let mut bytes = [0u8; 16];
        if n > 0 {
            let a = self
                .mem
                .find(src, n)
                .map_err(|e| self.mem_fault(w.id, l as u32, pc, e))?;
            let off = (src - a.base) as usize;
            if let Some(first) = a.first_unwritten(off, n as usize) {
                let at = a.base + first as u64;
                let e = MemError::Uninitialized {
                    addr: at,
                    len: n,
                    place: self.mem.describe(at),
                };
                return Err(self.mem_fault(w.id, l as u32, pc, e));
            }
            bytes[..n as usize].copy_from_slice(&a.data[off..off + n as usize]);
        }
        let tid = w.id * 32 + l as u32;
        self.async_issue_check(w.id, l, pc, dst, size as usize, tid)?;
        let q = &mut self.shared.asyncq;
        if q.owner.len() != self.shared.data.len() {
            q.owner = vec![0; self.shared.data.len()];
        }
        q.add(Copy {
            dst: dst as u32,
            len: c.size,
            bytes,
            tid,
            pc,
            group: UNCOMMITTED,
        });
        Ok(())
    }

    /// Racecheck of a copy's destination at issue: a write against the
    /// other threads' accesses since the last barrier and against copies
    /// still pending.
    fn async_issue_check(
        &self,
        w: u32,
        l: usize,
        pc: u32,
        dst: u64,
        len: usize,
        tid: u32,
    ) -> Result<(), Fault> {
        self.async_touch(w, l as u32, pc, dst, len, true)?;
        let epoch = self.shared.epoch;
        for i in 0..len {
            let cell = &self.shared.cells[dst as usize + i];
            if cell.epoch != epoch {
                continue;
            }
            let other = if cell.writer != NONE && cell.writer != tid {
                Some((cell.writer, "write after write"))
            } else if cell.reader != NONE && cell.reader != tid {
                Some((cell.reader, "write after read"))
            } else {
                None
            };
            if let Some((t, what)) = other {
                let detail = format!(
                    "shared-memory race ({what}): cp.async destination touched by {} since \
                     the last barrier: {}",
                    self.who(t),
                    self.shared.describe(dst + i as u64)
                );
                let kind = FaultKind::SharedRace;
                return Err(self.fault(kind, w, l as u32, pc, Some(dst + i as u64), detail));
            }
        }
        Ok(())
    }

    /// "thread (x,y,z)" of a racecheck record.
    fn who(&self, t: u32) -> String {
        if t >= super::mem::MULTI {
            return "two or more other threads".into();
        }
        let [x, y, z] = thread_of(&self.dims, t / 32, t % 32);
        format!("thread ({x},{y},{z})")
    }

    /// A copy's completion: its bytes land in shared memory, written by the
    /// issuing thread as far as racecheck and initcheck are concerned.
    fn complete(&mut self, c: Copy) {
        let (off, len) = (c.dst as usize, c.len as usize);
        let sh = &mut self.shared;
        sh.data[off..off + len].copy_from_slice(&c.bytes[..len]);
        sh.written[off..off + len].fill(true);
        let (epoch, stamp) = (sh.epoch, sh.stamp);
        for cell in &mut sh.cells[off..off + len] {
            if cell.epoch != epoch {
                *cell = Cell::empty(epoch);
            }
            cell.writer = c.tid;
            cell.wstamp = stamp;
        }
    }

    /// An access of `len` shared bytes at `off` by lane `l` of warp `w`
    /// while copies are in flight: a fault if a pending copy will write
    /// one of them. Cold: kept out of the shared-access loop's code.
    #[cold]
    #[inline(never)]
    pub(crate) fn async_touch(
        &self,
        w: u32,
        l: u32,
        pc: u32,
        off: u64,
        len: usize,
        write: bool,
    ) -> Result<(), Fault> {
        for i in 0..len {
            let Some((t, cpc)) = self.shared.asyncq.pending(off as usize + i) else {
                continue;
            };
            let line = self.m.src.get(cpc as usize).map_or(0, |s| s.line);
            let by = if t == w * 32 + l {
                "this thread".to_string()
            } else {
                self.who(t)
            };
            let detail = format!(
                "shared-memory race ({} a pending asynchronous copy): the cp.async at line \
                 {line} issued by {by} has not yet written these bytes (no \
                 cp.async.wait_group/wait_all of that thread covers it): {}",
                if write { "write over" } else { "read of" },
                self.shared.describe(off + i as u64)
            );
            let a = Some(off + i as u64);
            return Err(self.fault(FaultKind::SharedRace, w, l, pc, a, detail));
        }
        Ok(())
    }

    /// At the end of a block: a copy still in flight is a fault naming it.
    pub(crate) fn async_block_end(&self) -> Result<(), Fault> {
        if !self.shared.asyncq.active() {
            return Ok(());
        }
        let Some(c) = self.shared.asyncq.any_pending() else {
            return Ok(());
        };
        let state = if c.group == UNCOMMITTED {
            "was never committed (cp.async.commit_group)"
        } else {
            "was never waited for (cp.async.wait_group/wait_all)"
        };
        let detail = format!(
            "asynchronous copy to shared memory {state} before the thread exited: its \
             destination is never written ({})",
            self.shared.describe(c.dst as u64)
        );
        let a = Some(c.dst as u64);
        Err(self.fault(
            FaultKind::SharedRace,
            c.tid / 32,
            c.tid % 32,
            c.pc,
            a,
            detail,
        ))
    }
}
