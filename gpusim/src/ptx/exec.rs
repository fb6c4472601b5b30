//! Execution of a launch: blocks one after another; in a block, warps of
//! 32 lanes in lockstep, each run until it reaches a barrier or exits, then
//! the barrier is released. Divergence uses a SIMT reconvergence stack per
//! warp (entries `pc, rpc, mask`; a divergent branch turns the top entry
//! into the reconvergence entry and pushes one entry per path, which pop
//! when they reach the branch's immediate post-dominator).

use super::alu::{lanes, mask as wmask};
use super::decode::Decoded;
use super::ir::*;
use super::{Fault, FaultKind, LaunchDims, LaunchStats};
use crate::memory::DeviceMemory;
use crate::numeric;

/// Deepest call chain before a fault (recursion is allowed up to this).
const MAX_CALL_DEPTH: usize = 64;

/// One entry of the SIMT stack.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Entry {
    pub pc: u32,
    pub rpc: u32,
    pub mask: u32,
}

/// A call in progress.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Frame {
    /// The caller.
    func: u32,
    reg_base: usize,
    pred_base: usize,
    frame_base: u32,
    frame_top: u32,
    /// Index of the callee's first SIMT entry.
    stack_base: usize,
    call_mask: u32,
    ret: Option<ParamCopy>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WarpState {
    Running,
    AtBarrier,
    Done,
}

/// A warp's state.
pub(crate) struct Warp {
    pub id: u32,
    /// Value registers, `[slot][lane]`, the current window at `reg_base`.
    pub regs: Vec<u64>,
    /// Predicate registers as lane bit masks.
    pub preds: Vec<u32>,
    pub stack: Vec<Entry>,
    pub frames: Vec<Frame>,
    pub reg_base: usize,
    pub pred_base: usize,
    /// The current frame in local memory and the end of the frames.
    pub frame_base: u32,
    pub frame_top: u32,
    pub func: u32,
    /// Lanes that exist (threads of the block).
    pub valid: u32,
    /// Lanes that exited (or do not exist).
    pub exited: u32,
    /// Carry flag per lane.
    pub carry: u32,
    /// Local memory, `[byte][lane]`.
    pub local: Vec<u8>,
    pub state: WarpState,
}

/// Everything a launch needs while running.
pub(crate) struct Exec<'a> {
    pub m: &'a Decoded,
    pub kernel: u32,
    pub mem: &'a mut DeviceMemory,
    pub kparams: Vec<u8>,
    pub dims: LaunchDims,
    pub block: [u32; 3],
    pub shared: super::mem::Shared,
    pub stats: LaunchStats,
    /// The profile's counters, when profiling.
    pub prof: Option<Box<crate::profile::Counting>>,
}

/// Thread index (x, y, z) of lane `lane` of warp `warp` in a block of `dims`.
pub(crate) fn thread_of(dims: &LaunchDims, warp: u32, lane: u32) -> [u32; 3] {
    let t = warp * 32 + lane;
    let [bx, by, _] = dims.block;
    [t % bx, (t / bx) % by, t / (bx * by)]
}

impl Exec<'_> {
    /// A fault at instruction `pc` in lane `lane` of warp `w`.
    pub(crate) fn fault(
        &self,
        kind: FaultKind,
        w: u32,
        lane: u32,
        pc: u32,
        address: Option<u64>,
        detail: String,
    ) -> Fault {
        let instruction = match self.m.src.get(pc as usize) {
            Some(s) => format!("line {}: {}", s.line, s.text),
            None => "(launch)".to_string(),
        };
        Fault {
            kind,
            kernel: self.m.funcs[self.kernel as usize].name.clone(),
            block: self.block,
            thread: thread_of(&self.dims, w, lane),
            instruction,
            address,
            detail,
        }
    }

    fn special(&self, sp: Special, warp: u32, lane: u32) -> u64 {
        let d = &self.dims;
        let nthreads = d.block[0] * d.block[1] * d.block[2];
        (match sp {
            Special::Tid(i) => thread_of(d, warp, lane)[i as usize],
            Special::Ntid(i) => d.block[i as usize],
            Special::Ctaid(i) => self.block[i as usize],
            Special::Nctaid(i) => d.grid[i as usize],
            Special::LaneId => lane,
            Special::WarpId => warp,
            Special::NWarpId => nthreads.div_ceil(32),
            Special::WarpSize => 32,
        }) as u64
    }

    /// Fills the init slots of function `f` in the window at `base`.
    pub(crate) fn init_slots(&self, w: &mut Warp, f: u32, base: usize, only_block: bool) {
        let func = &self.m.funcs[f as usize];
        for &(s, init) in &func.init {
            let i = (base + s as usize) * 32;
            match init {
                SlotInit::Const(v) if !only_block => w.regs[i..i + 32].fill(v),
                SlotInit::Special(sp) if !only_block || matches!(sp, Special::Ctaid(_)) => {
                    for l in 0..32 {
                        w.regs[i + l] = self.special(sp, w.id, l as u32);
                    }
                }
                _ => {}
            }
        }
    }

    /// Runs the block's warps to completion.
    pub(crate) fn run_block(&mut self, warps: &mut [Warp]) -> Result<(), Fault> {
        loop {
            for w in warps.iter_mut() {
                if w.state == WarpState::Running {
                    self.run_warp(w)?;
                }
            }
            if warps.iter().all(|w| w.state == WarpState::Done) {
                return self.async_block_end();
            }
            // Every warp is at the barrier or exited (exited threads count
            // as arrived): release.
            for w in warps.iter_mut() {
                if w.state == WarpState::AtBarrier {
                    w.state = WarpState::Running;
                }
            }
            self.shared.epoch = self.shared.epoch.wrapping_add(1);
        }
    }

    /// Pops finished SIMT entries and finished calls. Returns false when
    /// the warp has nothing left to run.
    fn settle(&mut self, w: &mut Warp) -> bool {
        loop {
            let Some(top) = w.stack.last().copied() else {
                return false;
            };
            if top.mask != 0 && top.pc != top.rpc {
                return true;
            }
            w.stack.pop();
            if let Some(fr) = w.frames.last().copied() {
                if w.stack.len() == fr.stack_base {
                    self.finish_call(w, fr);
                }
            }
        }
    }

    fn finish_call(&mut self, w: &mut Warp, fr: Frame) {
        w.frames.pop();
        if let Some(c) = fr.ret {
            let live = fr.call_mask & !w.exited;
            for i in 0..c.size as usize {
                let s = (w.frame_base as usize + c.from as usize + i) * 32;
                let d = (fr.frame_base as usize + c.to as usize + i) * 32;
                for l in 0..32 {
                    if live >> l & 1 != 0 {
                        w.local[d + l] = w.local[s + l];
                    }
                }
            }
        }
        w.func = fr.func;
        w.reg_base = fr.reg_base;
        w.pred_base = fr.pred_base;
        w.frame_base = fr.frame_base;
        w.frame_top = fr.frame_top;
    }

    /// Removes lanes `m` from the SIMT entries from index `from` on.
    fn remove_lanes(w: &mut Warp, from: usize, m: u32) {
        for e in &mut w.stack[from..] {
            e.mask &= !m;
        }
    }

    /// Runs warp `w` until it reaches a barrier or finishes.
    pub(crate) fn run_warp(&mut self, w: &mut Warp) -> Result<(), Fault> {
        let code = &self.m.code;
        let mut ti = 0u64;
        let mut wi = 0u64;
        let result = 'outer: loop {
            if !self.settle(w) {
                w.state = WarpState::Done;
                break Ok(());
            }
            let top = w.stack.len() - 1;
            let Entry { mut pc, rpc, mask } = w.stack[top];
            if pc == NO_PC {
                break Err(self.fault(
                    FaultKind::Trap,
                    w.id,
                    mask.trailing_zeros(),
                    pc,
                    None,
                    "internal error: lanes resumed at no reconvergence point".into(),
                ));
            }
            let lanes_n = mask.count_ones() as u64;
            loop {
                if pc == rpc {
                    w.stack[top].pc = pc;
                    continue 'outer;
                }
                let Some(inst) = code.get(pc as usize) else {
                    break 'outer Err(self.fault(
                        FaultKind::Trap,
                        w.id,
                        0,
                        pc,
                        None,
                        "pc out of range".into(),
                    ));
                };
                wi += 1;
                ti += lanes_n;
                let m = match inst.guard {
                    None => mask,
                    Some((p, neg)) => {
                        let pv = w.preds[w.pred_base + p as usize];
                        mask & if neg { !pv } else { pv }
                    }
                };
                if let Some(p) = self.prof.as_deref_mut() {
                    // Threads count as Nsight's thread_inst_executed (the
                    // active lanes, predicated or not); FLOPs only where
                    // the guard lets the lane work.
                    let (class, flops) = self.m.cost[pc as usize];
                    p.c.warp_instructions[class as usize] += 1;
                    p.c.thread_instructions[class as usize] += lanes_n;
                    if flops != 0 {
                        p.c.flops[class as usize] += m.count_ones() as u64 * flops as u64;
                    }
                }
                let rb = w.reg_base * 32;
                let r = &mut w.regs[rb..];
                match &inst.op {
                    Op::Bin { f, d, a, b } => f(r, m, *d, *a, *b),
                    Op::Tern { f, d, a, b, c } => f(r, m, *d, *a, *b, *c),
                    Op::Un { f, d, a } => f(r, m, *d, *a),
                    Op::Mov { d, a } => {
                        let av = lanes(r, *a);
                        let i = *d as usize * 32;
                        for l in 0..32 {
                            if m >> l & 1 != 0 {
                                r[i + l] = av[l];
                            }
                        }
                    }
                    Op::Setp {
                        f,
                        d,
                        d2,
                        a,
                        b,
                        comb,
                    } => {
                        let mut v = f(r, *a, *b);
                        let mut v2 = !v;
                        if let Some((op, c, neg)) = comb {
                            let mut cv = w.preds[w.pred_base + *c as usize];
                            if *neg {
                                cv = !cv;
                            }
                            let f = |x: u32| match op {
                                BoolOp::And => x & cv,
                                BoolOp::Or => x | cv,
                                BoolOp::Xor => x ^ cv,
                            };
                            v = f(v);
                            v2 = f(v2);
                        }
                        let p = &mut w.preds[w.pred_base + *d as usize];
                        *p = (*p & !m) | (v & m);
                        if let Some(d2) = d2 {
                            let p = &mut w.preds[w.pred_base + *d2 as usize];
                            *p = (*p & !m) | (v2 & m);
                        }
                    }
                    Op::Selp { d, a, b, p } => {
                        let pv = w.preds[w.pred_base + *p as usize];
                        let (av, bv) = (lanes(r, *a), lanes(r, *b));
                        let i = *d as usize * 32;
                        for l in 0..32 {
                            if m >> l & 1 != 0 {
                                r[i + l] = if pv >> l & 1 != 0 { av[l] } else { bv[l] };
                            }
                        }
                    }
                    Op::Bra { target, rpc: brpc } => {
                        if m == mask {
                            pc = *target;
                            continue;
                        } else if m == 0 {
                            pc += 1;
                            continue;
                        }
                        // Lanes whose path is an unguarded kernel exit
                        // exit now rather than wait at the reconvergence
                        // point: the early-return idiom before a barrier
                        // (`if (i >= n) return; … __syncthreads();`) is legal
                        // since Volta, and exited threads count as arrived.
                        let is_exit = |p: u32| {
                            matches!(
                                code.get(p as usize),
                                Some(Inst {
                                    op: Op::Exit,
                                    guard: None
                                })
                            )
                        };
                        let mut gone = 0;
                        if is_exit(*target) {
                            gone |= m;
                        }
                        if is_exit(pc + 1) {
                            gone |= mask & !m;
                        }
                        if gone != 0 {
                            w.exited |= gone;
                            w.stack[top].pc = if gone & m != 0 { pc + 1 } else { *target };
                            Self::remove_lanes(w, 0, gone);
                            continue 'outer;
                        }
                        // Divergence: the top entry waits at the
                        // reconvergence point; each path gets an entry.
                        w.stack[top].pc = *brpc;
                        w.stack.push(Entry {
                            pc: pc + 1,
                            rpc: *brpc,
                            mask: mask & !m,
                        });
                        w.stack.push(Entry {
                            pc: *target,
                            rpc: *brpc,
                            mask: m,
                        });
                        continue 'outer;
                    }
                    Op::Ld { .. } | Op::St { .. } | Op::Atom { .. } => {
                        if m != 0 {
                            if let Err(f) = self.mem_op(w, &inst.op, m, pc) {
                                break 'outer Err(f);
                            }
                        }
                    }
                    Op::Bar => {
                        let live = w.valid & !w.exited;
                        if m != mask || mask != live {
                            break 'outer Err(self.fault(
                                FaultKind::DivergentBarrier,
                                w.id,
                                m.trailing_zeros().min(31),
                                pc,
                                None,
                                format!(
                                    "bar.sync reached by lanes {m:#010x} of warp {} while its \
                                     non-exited lanes {live:#010x} are not all there (a barrier \
                                     in divergent code)",
                                    w.id
                                ),
                            ));
                        }
                        w.stack[top].pc = pc + 1;
                        w.state = WarpState::AtBarrier;
                        break 'outer Ok(());
                    }
                    Op::Exit => {
                        w.exited |= m;
                        w.stack[top].pc = pc + 1;
                        Self::remove_lanes(w, 0, m);
                        continue 'outer;
                    }
                    Op::Ret => {
                        w.stack[top].pc = pc + 1;
                        let base = w.frames.last().map_or(0, |f| f.stack_base);
                        Self::remove_lanes(w, base, m);
                        continue 'outer;
                    }
                    Op::Trap => {
                        if m != 0 {
                            break 'outer Err(self.fault(
                                FaultKind::Trap,
                                w.id,
                                m.trailing_zeros(),
                                pc,
                                None,
                                "trap executed".into(),
                            ));
                        }
                    }
                    Op::Call { func, args, ret } => {
                        w.stack[top].pc = pc + 1;
                        if m != 0 {
                            if let Err(f) = self.call(w, pc, m, *func, args, *ret) {
                                break 'outer Err(f);
                            }
                        }
                        continue 'outer;
                    }
                    op => {
                        if let Err(f) = self.slow_op(w, op, m, pc) {
                            break 'outer Err(f);
                        }
                    }
                }
                pc += 1;
            }
        };
        self.stats.thread_instructions += ti;
        self.stats.warp_instructions += wi;
        result
    }

    fn call(
        &mut self,
        w: &mut Warp,
        pc: u32,
        m: u32,
        func: u32,
        args: &[ParamCopy],
        ret: Option<ParamCopy>,
    ) -> Result<(), Fault> {
        if w.frames.len() >= MAX_CALL_DEPTH {
            return Err(self.fault(
                FaultKind::Trap,
                w.id,
                m.trailing_zeros(),
                pc,
                None,
                format!("call depth exceeds {MAX_CALL_DEPTH} (runaway recursion)"),
            ));
        }
        let caller = &self.m.funcs[w.func as usize];
        let callee = &self.m.funcs[func as usize];
        let fr = Frame {
            func: w.func,
            reg_base: w.reg_base,
            pred_base: w.pred_base,
            frame_base: w.frame_base,
            frame_top: w.frame_top,
            stack_base: w.stack.len(),
            call_mask: m,
            ret,
        };
        let reg_base = w.reg_base + caller.nslots as usize;
        let pred_base = w.pred_base + caller.npreds as usize;
        let need = (reg_base + callee.nslots as usize) * 32;
        if w.regs.len() < need {
            w.regs.resize(need, 0);
        }
        if w.preds.len() < pred_base + callee.npreds as usize {
            w.preds.resize(pred_base + callee.npreds as usize, 0);
        }
        let frame_base = w.frame_top.div_ceil(16) * 16;
        let frame_top = frame_base + callee.frame_bytes;
        if w.local.len() < frame_top as usize * 32 {
            w.local.resize(frame_top as usize * 32, 0);
        }
        for c in args {
            for i in 0..c.size as usize {
                let s = (w.frame_base as usize + c.from as usize + i) * 32;
                let d = (frame_base as usize + c.to as usize + i) * 32;
                for l in 0..32 {
                    if m >> l & 1 != 0 {
                        w.local[d + l] = w.local[s + l];
                    }
                }
            }
        }
        w.frames.push(fr);
        w.stack.push(Entry {
            pc: callee.start,
            rpc: NO_PC,
            mask: m,
        });
        w.func = func;
        w.reg_base = reg_base;
        w.pred_base = pred_base;
        w.frame_base = frame_base;
        w.frame_top = frame_top;
        self.init_slots(w, func, reg_base, false);
        Ok(())
    }

    /// Everything but the hottest operations.
    fn slow_op(&mut self, w: &mut Warp, op: &Op, m: u32, pc: u32) -> Result<(), Fault> {
        let rb = w.reg_base * 32;
        let pb = w.pred_base;
        let r = &mut w.regs[rb..];
        // Per-lane helper over the active lanes.
        macro_rules! each {
            (|$l:ident| $body:expr) => {
                for $l in 0..32usize {
                    if m >> $l & 1 != 0 {
                        $body;
                    }
                }
            };
        }
        let at = |s: Slot, l: usize| s as usize * 32 + l;
        match *op {
            Op::PConst { d, v } => {
                let p = &mut w.preds[pb + d as usize];
                *p = (*p & !m) | if v { m } else { 0 };
            }
            Op::PMov { d, a } => {
                let v = w.preds[pb + a as usize];
                let p = &mut w.preds[pb + d as usize];
                *p = (*p & !m) | (v & m);
            }
            Op::PLogic { op, d, a, b, neg_b } => {
                let av = w.preds[pb + a as usize];
                let mut bv = b.map_or(0, |b| w.preds[pb + b as usize]);
                if neg_b {
                    bv = !bv;
                }
                let v = match op {
                    BoolOp::And => av & bv,
                    BoolOp::Or => av | bv,
                    BoolOp::Xor => av ^ bv,
                };
                let p = &mut w.preds[pb + d as usize];
                *p = (*p & !m) | (v & m);
            }
            Op::Pack { d, s, n, bits } => each!(|l| {
                let mut v = 0u64;
                for (i, &si) in s[..n as usize].iter().enumerate() {
                    v |= (r[at(si, l)] & wmask(bits as u32)) << (i as u32 * bits as u32);
                }
                r[at(d, l)] = v;
            }),
            Op::Unpack { d, n, bits, a } => each!(|l| {
                let v = r[at(a, l)];
                for (i, &di) in d[..n as usize].iter().enumerate() {
                    r[at(di, l)] = (v >> (i as u32 * bits as u32)) & wmask(bits as u32);
                }
            }),
            Op::FrameAddr { d, off } => each!(|l| r[at(d, l)] = w.frame_base as u64 + off),
            Op::Bfi {
                bits,
                d,
                a,
                b,
                c,
                e,
            } => each!(|l| {
                let w_ = bits as u32;
                let (pos, len) = ((r[at(c, l)] & 0xff) as u32, (r[at(e, l)] & 0xff) as u32);
                let (av, mut bv) = (r[at(a, l)], r[at(b, l)]);
                for i in 0..len {
                    if pos + i < w_ {
                        bv = (bv & !(1 << (pos + i))) | ((av >> i & 1) << (pos + i));
                    }
                }
                r[at(d, l)] = bv & wmask(w_);
            }),
            Op::Carry {
                op,
                bits,
                d,
                a,
                b,
                c,
            } => {
                let bw = bits as u32;
                let mut carry = w.carry;
                each!(|l| {
                    let (x, y, z) = (
                        r[at(a, l)] as u128,
                        r[at(b, l)] as u128,
                        r[at(c, l)] as u128,
                    );
                    let cin = (carry >> l & 1) as u128;
                    let full = wmask(bw) as u128;
                    let (res, cout, set) = match op {
                        CarryOp::Add { cin: ci, cout } => {
                            let s = x + y + if ci { cin } else { 0 };
                            (s, cout, s > full)
                        }
                        CarryOp::Sub { cin: ci, cout } => {
                            let sub = y + if ci { cin } else { 0 };
                            let s = x.wrapping_sub(sub) & full;
                            (s, cout, sub > x)
                        }
                        CarryOp::Mad { hi, cin: ci, cout } => {
                            let p = x * y;
                            let part = if hi { p >> bw } else { p & full };
                            let s = part + z + if ci { cin } else { 0 };
                            (s, cout, s > full)
                        }
                    };
                    r[at(d, l)] = (res & full) as u64;
                    if cout {
                        carry = (carry & !(1 << l)) | ((set as u32) << l);
                    }
                });
                w.carry = carry;
            }
            Op::Set { f, d, a, b, one } => {
                let v = f(r, a, b);
                each!(|l| r[at(d, l)] = if v >> l & 1 != 0 { one } else { 0 });
            }
            Op::Slct { d, a, b, c, f32 } => each!(|l| {
                let cv = r[at(c, l)];
                let ge = if f32 {
                    f32::from_bits(cv as u32) >= 0.0
                } else {
                    (cv as u32 as i32) >= 0
                };
                r[at(d, l)] = if ge { r[at(a, l)] } else { r[at(b, l)] };
            }),
            Op::Cvt {
                dst,
                src,
                mode,
                d,
                a,
            } => {
                each!(|l| r[at(d, l)] = numeric::cvt(dst, src, mode, r[at(a, l)]))
            }
            Op::FBin {
                op,
                ty,
                ftz,
                sat,
                d,
                a,
                b,
            } => each!(|l| {
                let (x, y) = (r[at(a, l)], r[at(b, l)]);
                r[at(d, l)] = match op {
                    FBin::Add(rn) => numeric::fadd(ty, x, y, rn, ftz, sat),
                    FBin::Sub(rn) => numeric::fsub(ty, x, y, rn, ftz, sat),
                    FBin::Mul(rn) => numeric::fmul(ty, x, y, rn, ftz, sat),
                    FBin::Div(p) => numeric::fdiv(ty, x, y, p, ftz),
                    FBin::Min { nan } => numeric::fminmax(ty, x, y, false, ftz, nan),
                    FBin::Max { nan } => numeric::fminmax(ty, x, y, true, ftz, nan),
                    FBin::Copysign => numeric::fcopysign(ty, x, y),
                };
            }),
            Op::Fma {
                ty,
                rnd,
                ftz,
                sat,
                d,
                a,
                b,
                c,
            } => each!(|l| {
                r[at(d, l)] =
                    numeric::ffma(ty, r[at(a, l)], r[at(b, l)], r[at(c, l)], rnd, ftz, sat)
            }),
            Op::FUn { op, ty, ftz, d, a } => each!(|l| {
                let x = r[at(a, l)];
                r[at(d, l)] = match op {
                    FUn::Abs => numeric::fabs(ty, x, ftz),
                    FUn::Neg => numeric::fneg(ty, x, ftz),
                    FUn::Sqrt(p) => numeric::fsqrt(ty, x, p, ftz),
                    FUn::Rcp(p) => numeric::frcp(ty, x, p, ftz),
                    FUn::Approx(o) => numeric::approx(o, ty, x, ftz),
                };
            }),
            Op::Cvta {
                space,
                to,
                bits,
                d,
                a,
            } => {
                let win = match space {
                    Space::Shared => super::SHARED_WIN,
                    _ => super::LOCAL_WIN,
                };
                each!(|l| {
                    let v = r[at(a, l)];
                    r[at(d, l)] = if to {
                        v.wrapping_sub(win)
                    } else {
                        v.wrapping_add(win)
                    } & wmask(bits as u32);
                })
            }
            Op::Vote {
                mode,
                d,
                pd,
                p,
                neg,
                member,
            } => {
                let first = m.trailing_zeros();
                if m == 0 {
                    return Ok(());
                }
                let mm = r[at(member, first as usize)] as u32;
                let missing = mm & w.valid & !w.exited & !m;
                if missing != 0 {
                    return Err(self.fault(
                        FaultKind::DivergentBarrier,
                        w.id,
                        first,
                        pc,
                        None,
                        format!(
                            "vote.sync with member mask {mm:#010x} executed by lanes {m:#010x}: \
                             lanes {missing:#010x} have not exited and are not converged"
                        ),
                    ));
                }
                let mut pv = w.preds[pb + p as usize];
                if neg {
                    pv = !pv;
                }
                let act = m & mm;
                match mode {
                    VoteMode::Ballot => {
                        let bal = pv & act;
                        each!(|l| r[at(d, l)] = bal as u64);
                    }
                    _ => {
                        let t = pv & act;
                        let v = match mode {
                            VoteMode::All => t == act,
                            VoteMode::Any => t != 0,
                            _ => t == act || t == 0,
                        };
                        let q = &mut w.preds[pb + pd as usize];
                        *q = (*q & !m) | if v { m } else { 0 };
                    }
                }
            }
            Op::Shfl { .. }
            | Op::Redux { .. }
            | Op::Match { .. }
            | Op::WarpSync { .. }
            | Op::ActiveMask { .. } => return self.warp_op(w, op, m, pc),
            Op::Packed { .. } | Op::CmpPair { .. } => super::exec_half::half_pair_op(w, op, m),
            Op::CpAsync(_) | Op::CpAsyncCommit | Op::CpAsyncWait { .. } => {
                return self.async_op(w, op, m, pc)
            }
            Op::Mma(_) | Op::Ldmatrix(_) | Op::Stmatrix(_) => return self.mma_op(w, op, m, pc),
            Op::AssertFail { args } if m != 0 => return Err(self.assert_fail(w, args, m, pc)),
            Op::Nop => {}
            _ => {
                return Err(self.fault(
                    FaultKind::Unsupported,
                    w.id,
                    m.trailing_zeros().min(31),
                    pc,
                    None,
                    "instruction not executable here".into(),
                ))
            }
        }
        Ok(())
    }
}
