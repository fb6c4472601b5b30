//! Execution of the warp-synchronous instructions (`shfl.sync`,
//! `redux.sync`, `match.sync`, `bar.warp.sync`, `activemask`) with the synccheck rules the
//! ISA leaves undefined: every executing lane must be in its own member
//! mask, every member lane that has not exited must execute the same
//! instruction with the same mask (converged), and a shuffle must not read
//! a lane that is not executing it (exited, absent or not a member).
//! Violations are [`FaultKind::DivergentBarrier`] faults naming the lanes.

use super::alu::lanes;
use super::exec::{Exec, Warp};
use super::ir::*;
use super::{Fault, FaultKind};

/// Each executing lane's member mask.
type Masks = [u32; 32];

impl Exec<'_> {
    /// A synccheck fault of a warp-synchronous instruction.
    fn sync_fault(&self, w: &Warp, lane: u32, pc: u32, detail: String) -> Fault {
        self.fault(FaultKind::DivergentBarrier, w.id, lane, pc, None, detail)
    }

    /// Reads and checks the member masks of a warp-synchronous instruction
    /// executed by lanes `m`.
    fn members(&self, w: &Warp, m: u32, member: Slot, pc: u32, what: &str) -> Result<Masks, Fault> {
        let i = (w.reg_base + member as usize) * 32;
        let mut mm = [0u32; 32];
        for l in 0..32 {
            mm[l] = w.regs[i + l] as u32;
        }
        let live = w.valid & !w.exited;
        let first = m.trailing_zeros() as usize;
        let uniform = (0..32).all(|l| m >> l & 1 == 0 || mm[l] == mm[first]);
        // The uniform case (a constant mask) checks once for all lanes.
        let mut rest = if uniform { 1u32 << first } else { m };
        while rest != 0 {
            let l = rest.trailing_zeros() as usize;
            rest &= rest - 1;
            let own = if uniform { m } else { 1 << l };
            let outside = own & !mm[l];
            if outside != 0 {
                let o = outside.trailing_zeros();
                return Err(self.sync_fault(
                    w,
                    o,
                    pc,
                    format!(
                        "{what} executed by lane {o} whose member mask {:#010x} does not \
                         include itself",
                        mm[l]
                    ),
                ));
            }
            let missing = mm[l] & live & !m;
            if missing != 0 {
                return Err(self.sync_fault(
                    w,
                    l as u32,
                    pc,
                    format!(
                        "{what} with member mask {:#010x} executed by lanes {m:#010x}: lanes \
                         {missing:#010x} have not exited and are not converged (a \
                         warp-synchronous instruction in divergent code)",
                        mm[l]
                    ),
                ));
            }
            if !uniform {
                let mut ks = mm[l] & m;
                while ks != 0 {
                    let k = ks.trailing_zeros() as usize;
                    ks &= ks - 1;
                    if mm[k] != mm[l] {
                        return Err(self.sync_fault(
                            w,
                            l as u32,
                            pc,
                            format!(
                                "{what}: lane {l} has member mask {:#010x} but member lane {k} \
                                 has {:#010x} (members must name the same mask)",
                                mm[l], mm[k]
                            ),
                        ));
                    }
                }
            }
        }
        if uniform {
            mm = [mm[first]; 32];
        }
        Ok(mm)
    }

    /// Executes a warp-synchronous instruction for the lanes of `m`.
    pub(crate) fn warp_op(&mut self, w: &mut Warp, op: &Op, m: u32, pc: u32) -> Result<(), Fault> {
        if m == 0 {
            return Ok(());
        }
        match *op {
            Op::Shfl {
                mode,
                d,
                p,
                a,
                b,
                c,
                member,
            } => {
                let mm = self.members(w, m, member, pc, "shfl.sync")?;
                self.shfl(w, m, &mm, pc, mode, [d, a, b, c], p)
            }
            Op::Redux { op, d, a, member } => {
                let mm = self.members(w, m, member, pc, "redux.sync")?;
                redux(w, m, &mm, op, d, a);
                Ok(())
            }
            Op::Match {
                all,
                d,
                p,
                a,
                member,
            } => {
                let mm = self.members(w, m, member, pc, "match.sync")?;
                match_sync(w, m, &mm, all, d, p, a);
                Ok(())
            }
            Op::WarpSync { member } => {
                // Lockstep lanes are already synchronised; their shared
                // accesses become ordered (racecheck).
                let mm = self.members(w, m, member, pc, "bar.warp.sync")?;
                let group = (0..32)
                    .filter(|l| m >> l & 1 != 0)
                    .fold(0, |g, l| g | mm[l]);
                self.shared.forget_lanes(w.id, group & m);
                Ok(())
            }
            Op::ActiveMask { d } => {
                let i = (w.reg_base + d as usize) * 32;
                for l in 0..32 {
                    if m >> l & 1 != 0 {
                        w.regs[i + l] = m as u64;
                    }
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// `shfl.sync` as the ISA defines it: `c` packs the clamp value (bits
    /// 0–4) and the segment mask (bits 8–12); an out-of-range source lane
    /// reads the lane's own value and clears `p`.
    #[allow(clippy::too_many_arguments)]
    fn shfl(
        &mut self,
        w: &mut Warp,
        m: u32,
        mm: &Masks,
        pc: u32,
        mode: ShflMode,
        [d, a, b, c]: [Slot; 4],
        p: PSlot,
    ) -> Result<(), Fault> {
        let r = &w.regs[w.reg_base * 32..];
        let (av, bv, cv) = (lanes(r, a), lanes(r, b), lanes(r, c));
        let mut out = [0u64; 32];
        let mut pbits = 0u32;
        for l in 0..32usize {
            if m >> l & 1 == 0 {
                continue;
            }
            let lane = l as i32;
            let bval = (bv[l] & 31) as i32;
            let cval = (cv[l] & 31) as i32;
            let seg = (cv[l] >> 8 & 31) as i32;
            let max_lane = (lane & seg) | (cval & !seg);
            let min_lane = lane & seg;
            let (j, pval) = match mode {
                ShflMode::Up => (lane - bval, lane - bval >= max_lane),
                ShflMode::Down => (lane + bval, lane + bval <= max_lane),
                ShflMode::Bfly => (lane ^ bval, lane ^ bval <= max_lane),
                ShflMode::Idx => {
                    let j = min_lane | (bval & !seg);
                    (j, j <= max_lane)
                }
            };
            let j = if pval { j as usize } else { l };
            if m >> j & 1 == 0 || mm[l] >> j & 1 == 0 {
                let why = if mm[l] >> j & 1 == 0 {
                    format!("is not in the member mask {:#010x}", mm[l])
                } else if w.valid >> j & 1 == 0 {
                    "does not exist (the block has fewer threads)".to_string()
                } else {
                    "has exited".to_string()
                };
                return Err(self.sync_fault(
                    w,
                    l as u32,
                    pc,
                    format!("shfl.sync: lane {l} reads source lane {j}, which {why}"),
                ));
            }
            out[l] = av[j];
            pbits |= (pval as u32) << l;
        }
        let i = (w.reg_base + d as usize) * 32;
        for l in 0..32 {
            if m >> l & 1 != 0 {
                w.regs[i + l] = out[l];
            }
        }
        if p != NO_PRED {
            let q = &mut w.preds[w.pred_base + p as usize];
            *q = (*q & !m) | (pbits & m);
        }
        Ok(())
    }
}

/// `redux.sync`: each lane gets the reduction over its (checked) members.
fn redux(w: &mut Warp, m: u32, mm: &Masks, op: ReduxOp, d: Slot, a: Slot) {
    let av = lanes(&w.regs[w.reg_base * 32..], a);
    let reduce = |group: u32| -> u64 {
        let mut it = (0..32)
            .filter(|k| group >> k & 1 != 0)
            .map(|k| av[k] as u32);
        let first = it.next().unwrap_or(0);
        it.fold(first, |x, y| match op {
            ReduxOp::Add => x.wrapping_add(y),
            ReduxOp::Min(false) => x.min(y),
            ReduxOp::Max(false) => x.max(y),
            ReduxOp::Min(true) => (x as i32).min(y as i32) as u32,
            ReduxOp::Max(true) => (x as i32).max(y as i32) as u32,
            ReduxOp::And => x & y,
            ReduxOp::Or => x | y,
            ReduxOp::Xor => x ^ y,
        }) as u64
    };
    let i = (w.reg_base + d as usize) * 32;
    // Lanes of one group share the result: reduce once per distinct group.
    let mut last: Option<(u32, u64)> = None;
    for l in 0..32 {
        if m >> l & 1 != 0 {
            let group = mm[l] & m;
            let v = match last {
                Some((g, v)) if g == group => v,
                _ => reduce(group),
            };
            last = Some((group, v));
            w.regs[i + l] = v;
        }
    }
}

/// `match.any.sync` (lanes of the group holding the same value) and
/// `match.all.sync` (the member mask when the whole group agrees, else 0).
fn match_sync(w: &mut Warp, m: u32, mm: &Masks, all: bool, d: Slot, p: PSlot, a: Slot) {
    let av = lanes(&w.regs[w.reg_base * 32..], a);
    let i = (w.reg_base + d as usize) * 32;
    let mut pbits = 0u32;
    for l in 0..32 {
        if m >> l & 1 == 0 {
            continue;
        }
        let group = mm[l] & m;
        let same = (0..32)
            .filter(|&k| group >> k & 1 != 0 && av[k] == av[l])
            .fold(0u32, |s, k| s | 1 << k);
        let v = if !all {
            same
        } else if same == group {
            pbits |= 1 << l;
            mm[l]
        } else {
            0
        };
        w.regs[i + l] = v as u64;
    }
    if p != NO_PRED {
        let q = &mut w.preds[w.pred_base + p as usize];
        *q = (*q & !m) | (pbits & m);
    }
}
