//! Loads, stores and atomics in every state space, with the sanitizer's
//! checks: memcheck (bounds, freed memory, host pointers, alignment),
//! initcheck (global and shared bytes never written) and racecheck
//! (shared-memory hazards between two barriers).
//!
//! Racecheck rule, kept simple: between two barrier releases, two
//! *different* threads touching the same shared byte with at least one
//! write is a race — a write-after-write of the same value included —
//! except two lanes of one warp writing the same byte in the same
//! instruction, which races only when the values differ. Atomics on
//! shared memory are not race-checked.

use super::exec::{thread_of, Exec, Warp};
use super::ir::*;
use super::{Fault, FaultKind, LOCAL_WIN, PARAM_WIN, SHARED_WIN};
use crate::memory::MemError;
use crate::numeric::{self, FloatTy, Rnd};

/// No thread (a racecheck record's empty value).
pub(crate) const NONE: u32 = u32::MAX;
/// Two or more threads read the byte.
pub(crate) const MULTI: u32 = u32::MAX - 1;

/// Racecheck state of one shared byte.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Cell {
    /// Barrier epoch of the record (older ones are empty).
    pub(crate) epoch: u32,
    /// The thread that wrote it this epoch, or [`NONE`].
    pub(crate) writer: u32,
    /// The instruction stamp of that write.
    pub(crate) wstamp: u32,
    /// The thread that read it, [`MULTI`] or [`NONE`].
    pub(crate) reader: u32,
}

impl Cell {
    /// A record with no access in `epoch`.
    pub(crate) fn empty(epoch: u32) -> Cell {
        Cell {
            epoch,
            writer: NONE,
            wstamp: 0,
            reader: NONE,
        }
    }
}

/// The block's shared memory and its shadows.
#[derive(Default)]
pub(crate) struct Shared {
    pub data: Vec<u8>,
    /// One flag per byte: written since the block started.
    pub written: Vec<bool>,
    pub cells: Vec<Cell>,
    /// Barrier epoch: cells of older epochs are empty.
    pub epoch: u32,
    /// Counter of shared-memory instructions (same-instruction test).
    pub stamp: u32,
    /// Symbols for messages: name, offset, size.
    pub symbols: Vec<(String, u32, u32)>,
    /// `cp.async` copies in flight.
    pub asyncq: super::exec_async::AsyncCopies,
}

impl Shared {
    /// Resets for a new block of `size` bytes.
    pub(crate) fn reset(&mut self, size: usize) {
        self.data.clear();
        self.data.resize(size, 0);
        self.written.clear();
        self.written.resize(size, false);
        if self.cells.len() != size {
            self.cells = vec![Cell::default(); size];
        }
        self.epoch = self.epoch.wrapping_add(1);
        self.asyncq.reset();
    }

    /// `bar.warp.sync`: orders the member lanes' earlier shared accesses
    /// before their later ones, so their racecheck records are dropped
    /// (warp `warp`, lanes `lanes`; other threads' records stay).
    pub(crate) fn forget_lanes(&mut self, warp: u32, lanes: u32) {
        let epoch = self.epoch;
        let ours = |t: u32| t < MULTI && t / 32 == warp && lanes >> (t % 32) & 1 != 0;
        for c in self.cells.iter_mut().filter(|c| c.epoch == epoch) {
            if ours(c.writer) {
                c.writer = NONE;
            }
            if ours(c.reader) {
                c.reader = NONE;
            }
        }
    }

    /// Where shared address `a` is, for messages.
    pub(crate) fn describe(&self, a: u64) -> String {
        let total = self.data.len();
        for (n, off, size) in &self.symbols {
            if a >= *off as u64 && a < (*off + *size) as u64 {
                return format!(
                    "shared address {a:#x} is inside `{n}` ({size} bytes) at offset {}",
                    a - *off as u64
                );
            }
        }
        let near = self
            .symbols
            .iter()
            .min_by_key(|(_, off, size)| (a as i64 - (*off + *size) as i64).unsigned_abs());
        match near {
            Some((n, off, size)) => format!(
                "shared address {a:#x} is outside the block's {total} bytes of shared memory \
                 (nearest: `{n}` at {off:#x}, {size} bytes)"
            ),
            None => {
                format!("shared address {a:#x}: the kernel declares {total} bytes of shared memory")
            }
        }
    }
}

fn tid_str(t: [u32; 3]) -> String {
    format!("({},{},{})", t[0], t[1], t[2])
}

/// Reads `len` little-endian bytes.
#[inline(always)]
fn rd(b: &[u8]) -> u64 {
    let mut v = [0u8; 8];
    v[..b.len()].copy_from_slice(b);
    u64::from_le_bytes(v)
}

/// Sign-extends a loaded `size`-byte value to `sext_bits` (0: zero-extended,
/// as loaded).
#[inline(always)]
fn extend(v: u64, size: usize, sext_bits: u8) -> u64 {
    if sext_bits == 0 {
        return v;
    }
    super::alu::sext(v, size as u32 * 8) as u64 & super::alu::mask(sext_bits as u32)
}

/// Loads the values of `size` bytes at `data[off..]` into lane `l` of
/// registers `d` (one register a value), sign-extended to `sext` bits
/// (0: zero-extended).
#[inline(always)]
fn load_lane(w: &mut Warp, l: usize, d: &[Slot], size: usize, sext: u8, data: &[u8], off: usize) {
    let rb = w.reg_base;
    for (i, &ds) in d.iter().enumerate() {
        let o = off + i * size;
        w.regs[(rb + ds as usize) * 32 + l] = extend(rd(&data[o..o + size]), size, sext);
    }
}

/// Calls `f(lane, offset)` for each lane of `*pending` whose access of
/// `total` bytes lies inside the allocation at `lo` of `len` bytes, and
/// takes those lanes off `*pending`: one allocation lookup serves them all.
#[inline(always)]
fn each_lane_inside<E>(
    pending: &mut u32,
    addrs: &[u64; 32],
    (lo, len, total): (u64, u64, u64),
    mut f: impl FnMut(usize, usize) -> Result<(), E>,
) -> Result<(), E> {
    let mut rest = *pending;
    while rest != 0 {
        let l = rest.trailing_zeros() as usize;
        rest &= rest - 1;
        let x = addrs[l];
        if x < lo || x - lo + total > len {
            continue;
        }
        *pending &= !(1 << l);
        f(l, (x - lo) as usize)?;
    }
    Ok(())
}

impl Exec<'_> {
    /// A fault of a device-memory access.
    pub(crate) fn mem_fault(&self, w: u32, lane: u32, pc: u32, e: MemError) -> Fault {
        let (kind, addr) = match &e {
            MemError::OutOfBounds { addr, .. } | MemError::InvalidFree { addr, .. } => {
                (FaultKind::OutOfBounds, *addr)
            }
            MemError::Uninitialized { addr, .. } => (FaultKind::Uninitialized, *addr),
            MemError::Misaligned { addr, .. } => (FaultKind::Misaligned, *addr),
            MemError::OutOfMemory { .. } => (FaultKind::Trap, 0),
        };
        let detail = match &e {
            MemError::Misaligned { .. } => format!("{e}; {}", self.mem.describe(addr)),
            _ => e.to_string(),
        };
        self.fault(kind, w, lane, pc, Some(addr), detail)
    }

    /// Executes a load, store or atomic for the lanes of `m`.
    pub(crate) fn mem_op(&mut self, w: &mut Warp, op: &Op, m: u32, pc: u32) -> Result<(), Fault> {
        let (space, addr, total) = match *op {
            Op::Ld {
                space,
                size,
                n,
                addr,
                ..
            }
            | Op::St {
                space,
                size,
                n,
                addr,
                ..
            } => (space, addr, size as u64 * n as u64),
            Op::Atom {
                space, size, addr, ..
            } => (space, addr, size as u64),
            _ => return Ok(()),
        };
        // Per-lane addresses.
        let mut addrs = [0u64; 32];
        match addr.base {
            Base::Reg(s) => {
                let i = (w.reg_base + s as usize) * 32;
                for (l, a) in addrs.iter_mut().enumerate() {
                    *a = w.regs[i + l].wrapping_add(addr.off);
                }
            }
            Base::Abs => addrs = [addr.off; 32],
            Base::Frame => addrs = [(w.frame_base as u64).wrapping_add(addr.off); 32],
        }
        for l in 0..32 {
            if m >> l & 1 != 0 && addrs[l] % total != 0 {
                let e = MemError::Misaligned {
                    addr: addrs[l],
                    align: total,
                };
                return Err(match space {
                    Space::Global => self.mem_fault(w.id, l as u32, pc, e),
                    _ => self.fault(
                        FaultKind::Misaligned,
                        w.id,
                        l as u32,
                        pc,
                        Some(addrs[l]),
                        e.to_string(),
                    ),
                });
            }
        }
        // Split by space (generic addresses by window).
        let (mut gm, mut sm, mut lm, mut pm) = (0u32, 0u32, 0u32, 0u32);
        match space {
            Space::Global => gm = m,
            Space::Shared => sm = m,
            Space::Local => lm = m,
            Space::Param | Space::Generic => {
                for l in 0..32 {
                    if m >> l & 1 == 0 {
                        continue;
                    }
                    let bit = 1u32 << l;
                    let a = addrs[l];
                    if space == Space::Param {
                        if a >> 56 == PARAM_WIN >> 56 {
                            pm |= bit
                        } else {
                            lm |= bit
                        }
                    } else if a >> 56 == SHARED_WIN >> 56 {
                        addrs[l] = a - SHARED_WIN;
                        sm |= bit;
                    } else if a >> 56 == LOCAL_WIN >> 56 {
                        addrs[l] = a - LOCAL_WIN;
                        lm |= bit;
                    } else {
                        gm |= bit;
                    }
                }
            }
        }
        if let Some(p) = self.prof.as_deref_mut() {
            if gm != 0 {
                let store = !matches!(op, Op::Ld { .. });
                p.global_request(gm, &addrs, total, store);
            }
            if sm != 0 {
                p.shared_request(sm, &addrs, total);
            }
        }
        if gm != 0 {
            match *op {
                Op::Ld {
                    size,
                    n,
                    sext_bits,
                    d,
                    ..
                } => self.ld_global(w, gm, pc, &addrs, size, n, sext_bits, d)?,
                Op::St { size, n, s, .. } => self.st_global(w, gm, pc, &addrs, size, n, s)?,
                _ => self.atom_global(w, gm, pc, &addrs, op)?,
            }
        }
        if sm != 0 {
            self.shared_op(w, sm, pc, &addrs, op)?;
        }
        if lm != 0 {
            self.local_op(w, lm, pc, &addrs, op)?;
        }
        if pm != 0 {
            self.param_op(w, pm, pc, &addrs, op)?;
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn ld_global(
        &mut self,
        w: &mut Warp,
        m: u32,
        pc: u32,
        addrs: &[u64; 32],
        size: u8,
        n: u8,
        sext_bits: u8,
        d: [Slot; 4],
    ) -> Result<(), Fault> {
        let total = size as u64 * n as u64;
        let mut pending = m;
        while pending != 0 {
            let l0 = pending.trailing_zeros() as usize;
            let a = match self.mem.find(addrs[l0], total) {
                Ok(a) => a,
                Err(e) => return Err(self.mem_fault(w.id, l0 as u32, pc, e)),
            };
            let lo = a.base;
            each_lane_inside(&mut pending, addrs, (lo, a.size(), total), |l, off| {
                if !a.is_written(off, total as usize) {
                    let first = a.first_unwritten(off, total as usize).unwrap_or(off);
                    let e = MemError::Uninitialized {
                        addr: lo + first as u64,
                        len: total,
                        place: self.mem.describe(lo + first as u64),
                    };
                    return Err(self.mem_fault(w.id, l as u32, pc, e));
                }
                let d = &d[..n as usize];
                load_lane(w, l, d, size as usize, sext_bits, &a.data, off);
                Ok(())
            })?;
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn st_global(
        &mut self,
        w: &mut Warp,
        m: u32,
        pc: u32,
        addrs: &[u64; 32],
        size: u8,
        n: u8,
        s: [Slot; 4],
    ) -> Result<(), Fault> {
        let total = size as u64 * n as u64;
        let rb = w.reg_base;
        let mut pending = m;
        while pending != 0 {
            let l0 = pending.trailing_zeros() as usize;
            let a = match self.mem.find_mut(addrs[l0], total) {
                Ok(a) => a,
                Err(e) => {
                    let e = e.clone();
                    return Err(self.mem_fault(w.id, l0 as u32, pc, e));
                }
            };
            let span = (a.base, a.size(), total);
            each_lane_inside(&mut pending, addrs, span, |l, off| {
                for (i, &ss) in s[..n as usize].iter().enumerate() {
                    let o = off + i * size as usize;
                    let v = w.regs[(rb + ss as usize) * 32 + l];
                    a.data[o..o + size as usize].copy_from_slice(&v.to_le_bytes()[..size as usize]);
                }
                a.mark_written(off, total as usize);
                Ok::<(), Fault>(())
            })?;
        }
        Ok(())
    }

    fn atom_global(
        &mut self,
        w: &mut Warp,
        m: u32,
        pc: u32,
        addrs: &[u64; 32],
        op: &Op,
    ) -> Result<(), Fault> {
        let Op::Atom {
            op: aop,
            size,
            signed,
            d,
            b,
            c,
            ..
        } = *op
        else {
            return Ok(());
        };
        let rb = w.reg_base;
        for l in 0..32usize {
            if m >> l & 1 == 0 {
                continue;
            }
            let x = addrs[l];
            let a = match self.mem.find_mut(x, size as u64) {
                Ok(a) => a,
                Err(e) => {
                    let e = e.clone();
                    return Err(self.mem_fault(w.id, l as u32, pc, e));
                }
            };
            let off = (x - a.base) as usize;
            if !a.is_written(off, size as usize) {
                let lo = a.base;
                let e = MemError::Uninitialized {
                    addr: x,
                    len: size as u64,
                    place: self.mem.describe(lo + off as u64),
                };
                return Err(self.mem_fault(w.id, l as u32, pc, e));
            }
            let old = rd(&a.data[off..off + size as usize]);
            let bv = w.regs[(rb + b as usize) * 32 + l];
            let cv = w.regs[(rb + c as usize) * 32 + l];
            let new = atom_value(aop, size, signed, old, bv, cv);
            a.data[off..off + size as usize].copy_from_slice(&new.to_le_bytes()[..size as usize]);
            a.mark_written(off, size as usize);
            w.regs[(rb + d as usize) * 32 + l] = old;
        }
        Ok(())
    }

    fn shared_op(
        &mut self,
        w: &mut Warp,
        m: u32,
        pc: u32,
        addrs: &[u64; 32],
        op: &Op,
    ) -> Result<(), Fault> {
        let (size, n, is_st) = match *op {
            Op::Ld { size, n, .. } => (size, n, false),
            Op::St { size, n, .. } => (size, n, true),
            Op::Atom { size, .. } => (size, 1, true),
            _ => return Ok(()),
        };
        let total = size as usize * n as usize;
        let rb = w.reg_base;
        self.shared.stamp = self.shared.stamp.wrapping_add(1);
        let stamp = self.shared.stamp;
        // Copies in flight make every access check their pending bytes.
        let pending = self.shared.asyncq.active();
        for l in 0..32usize {
            if m >> l & 1 == 0 {
                continue;
            }
            let x = addrs[l];
            if x.saturating_add(total as u64) > self.shared.data.len() as u64 {
                let detail = format!(
                    "out-of-bounds shared access of {total} bytes: {}",
                    self.shared.describe(x)
                );
                return Err(self.fault(
                    FaultKind::OutOfBounds,
                    w.id,
                    l as u32,
                    pc,
                    Some(x),
                    detail,
                ));
            }
            if pending {
                self.async_touch(w.id, l as u32, pc, x, total, is_st)?;
            }
            let off = x as usize;
            let tid = w.id * 32 + l as u32;
            if let Op::Atom {
                op: aop,
                size,
                signed,
                d,
                b,
                c,
                ..
            } = *op
            {
                if !self.shared.written[off..off + total].iter().all(|&b| b) {
                    return Err(self.fault(
                        FaultKind::Uninitialized,
                        w.id,
                        l as u32,
                        pc,
                        Some(x),
                        format!(
                            "atomic on shared bytes never written: {}",
                            self.shared.describe(x)
                        ),
                    ));
                }
                let old = rd(&self.shared.data[off..off + total]);
                let bv = w.regs[(rb + b as usize) * 32 + l];
                let cv = w.regs[(rb + c as usize) * 32 + l];
                let new = atom_value(aop, size, signed, old, bv, cv);
                self.shared.data[off..off + total].copy_from_slice(&new.to_le_bytes()[..total]);
                w.regs[(rb + d as usize) * 32 + l] = old;
                continue;
            }
            // The bytes a store would write.
            let mut bytes = [0u8; 32];
            if let Op::St { s, .. } = *op {
                for (i, &ss) in s[..n as usize].iter().enumerate() {
                    let v = w.regs[(rb + ss as usize) * 32 + l];
                    bytes[i * size as usize..(i + 1) * size as usize]
                        .copy_from_slice(&v.to_le_bytes()[..size as usize]);
                }
            }
            // Racecheck and initcheck per byte.
            let epoch = self.shared.epoch;
            for i in 0..total {
                let cell = &mut self.shared.cells[off + i];
                if cell.epoch != epoch {
                    *cell = Cell {
                        epoch,
                        writer: NONE,
                        wstamp: 0,
                        reader: NONE,
                    };
                }
                let other = if is_st {
                    if cell.writer != NONE
                        && cell.writer != tid
                        && !(cell.wstamp == stamp && self.shared.data[off + i] == bytes[i])
                    {
                        Some((cell.writer, "write after write"))
                    } else if cell.reader != NONE && cell.reader != tid {
                        Some((cell.reader, "write after read"))
                    } else {
                        cell.writer = tid;
                        cell.wstamp = stamp;
                        None
                    }
                } else if cell.writer != NONE && cell.writer != tid {
                    Some((cell.writer, "read after write"))
                } else {
                    cell.reader = if cell.reader == NONE || cell.reader == tid {
                        tid
                    } else {
                        MULTI
                    };
                    None
                };
                if let Some((t, what)) = other {
                    let who = if t == MULTI {
                        "two or more other threads".to_string()
                    } else {
                        format!("thread {}", tid_str(thread_of(&self.dims, t / 32, t % 32)))
                    };
                    let detail = format!(
                        "shared-memory race ({what}) with {who} since the last barrier: {}",
                        self.shared.describe(x + i as u64)
                    );
                    return Err(self.fault(
                        FaultKind::SharedRace,
                        w.id,
                        l as u32,
                        pc,
                        Some(x + i as u64),
                        detail,
                    ));
                }
                if !is_st && !self.shared.written[off + i] {
                    let detail = format!(
                        "read of shared memory never written: {}",
                        self.shared.describe(x + i as u64)
                    );
                    return Err(self.fault(
                        FaultKind::Uninitialized,
                        w.id,
                        l as u32,
                        pc,
                        Some(x + i as u64),
                        detail,
                    ));
                }
            }
            match *op {
                Op::St { .. } => {
                    self.shared.data[off..off + total].copy_from_slice(&bytes[..total]);
                    self.shared.written[off..off + total].fill(true);
                }
                Op::Ld { sext_bits, d, .. } => {
                    let (d, data) = (&d[..n as usize], &self.shared.data);
                    load_lane(w, l, d, size as usize, sext_bits, data, off);
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn local_op(
        &mut self,
        w: &mut Warp,
        m: u32,
        pc: u32,
        addrs: &[u64; 32],
        op: &Op,
    ) -> Result<(), Fault> {
        let (size, n) = match *op {
            Op::Ld { size, n, .. } | Op::St { size, n, .. } => (size as usize, n as usize),
            _ => {
                return Err(self.fault(
                    FaultKind::Unsupported,
                    w.id,
                    m.trailing_zeros(),
                    pc,
                    None,
                    "atomic on local memory".into(),
                ))
            }
        };
        let total = size * n;
        let rb = w.reg_base;
        for l in 0..32usize {
            if m >> l & 1 == 0 {
                continue;
            }
            let x = addrs[l];
            if x.saturating_add(total as u64) > w.frame_top as u64 {
                let detail = format!(
                    "out-of-bounds local access of {total} bytes at local offset {x:#x}: the \
                     thread's frames end at {:#x}",
                    w.frame_top
                );
                return Err(self.fault(
                    FaultKind::OutOfBounds,
                    w.id,
                    l as u32,
                    pc,
                    Some(x),
                    detail,
                ));
            }
            let x = x as usize;
            for i in 0..n {
                let o = x + i * size;
                match *op {
                    Op::Ld { sext_bits, d, .. } => {
                        let mut v = 0u64;
                        for k in 0..size {
                            v |= (w.local[(o + k) * 32 + l] as u64) << (8 * k);
                        }
                        w.regs[(rb + d[i] as usize) * 32 + l] = extend(v, size, sext_bits);
                    }
                    Op::St { s, .. } => {
                        let v = w.regs[(rb + s[i] as usize) * 32 + l];
                        for k in 0..size {
                            w.local[(o + k) * 32 + l] = (v >> (8 * k)) as u8;
                        }
                    }
                    _ => {}
                }
            }
        }
        Ok(())
    }

    fn param_op(
        &mut self,
        w: &mut Warp,
        m: u32,
        pc: u32,
        addrs: &[u64; 32],
        op: &Op,
    ) -> Result<(), Fault> {
        let Op::Ld {
            size,
            n,
            sext_bits,
            d,
            ..
        } = *op
        else {
            return Err(self.fault(
                FaultKind::OutOfBounds,
                w.id,
                m.trailing_zeros(),
                pc,
                Some(addrs[m.trailing_zeros() as usize]),
                "write to the kernel's parameters (read-only)".into(),
            ));
        };
        let (size, n) = (size as usize, n as usize);
        let rb = w.reg_base;
        let first = m.trailing_zeros() as usize;
        let uniform = addrs
            .iter()
            .enumerate()
            .all(|(l, &a)| m >> l & 1 == 0 || a == addrs[first]);
        for l in 0..32usize {
            if m >> l & 1 == 0 {
                continue;
            }
            if uniform && l > first {
                // Same address in every lane (the common case): copy lane `first`.
                for &ds in &d[..n] {
                    let i = (rb + ds as usize) * 32;
                    w.regs[i + l] = w.regs[i + first];
                }
                continue;
            }
            let x = addrs[l] - PARAM_WIN;
            if x.saturating_add((size * n) as u64) > self.kparams.len() as u64 {
                let detail = format!(
                    "parameter read of {} bytes at offset {x} past the kernel's {} bytes of parameters",
                    size * n,
                    self.kparams.len()
                );
                return Err(self.fault(
                    FaultKind::OutOfBounds,
                    w.id,
                    l as u32,
                    pc,
                    Some(addrs[l]),
                    detail,
                ));
            }
            load_lane(w, l, &d[..n], size, sext_bits, &self.kparams, x as usize);
        }
        Ok(())
    }
}

/// The new value of an atomic.
fn atom_value(op: AtomOp, size: u8, signed: bool, old: u64, b: u64, c: u64) -> u64 {
    let w = size as u32 * 8;
    let mk = super::alu::mask(w);
    let (so, sb) = (super::alu::sext(old, w), super::alu::sext(b, w));
    (match op {
        AtomOp::Add => old.wrapping_add(b),
        // The PTX ISA: atom.add.f32 flushes subnormal inputs and results to
        // sign-preserving zero; f64 and the .noftz f16/bf16 forms do not.
        AtomOp::FAdd(FloatTy::F32) => numeric::fadd(FloatTy::F32, old, b, Rnd::Rn, true, false),
        AtomOp::FAdd(ty) => numeric::fadd(ty, old, b, Rnd::Rn, false, false),
        AtomOp::Cas => {
            if old == b & mk {
                c
            } else {
                old
            }
        }
        AtomOp::Exch => b,
        AtomOp::Min => {
            if (signed && sb < so) || (!signed && b & mk < old) {
                b
            } else {
                old
            }
        }
        AtomOp::Max => {
            if (signed && sb > so) || (!signed && b & mk > old) {
                b
            } else {
                old
            }
        }
        AtomOp::And => old & b,
        AtomOp::Or => old | b,
        AtomOp::Xor => old ^ b,
        AtomOp::Inc => {
            if old >= b & mk {
                0
            } else {
                old + 1
            }
        }
        AtomOp::Dec => {
            if old == 0 || old > b & mk {
                b
            } else {
                old - 1
            }
        }
    }) & mk
}
