//! Syntax tree → decoded module: names resolved to register slots and
//! addresses, frames and shared memory laid out, module globals allocated
//! in device memory, every instruction decoded (see [`super::opcode`]) and
//! the reconvergence point of every branch computed (see [`super::cfg`]).

use super::ir::*;
use super::parse::{Imm, Operand, RawFunc, RawInst, RawModule, Stmt, VarDecl};
use super::{LoadError, ParamSpec, PARAM_WIN};
use crate::memory::DeviceMemory;
use std::collections::HashMap;

/// A decoded module.
pub(crate) struct Decoded {
    /// Functions (definitions only), kernels and `.func`s.
    pub funcs: Vec<Func>,
    /// All instructions, functions one after the other.
    pub code: Vec<Inst>,
    /// Source of each instruction.
    pub src: Vec<SrcInfo>,
    /// Each instruction's profile class (index) and FLOPs per thread.
    pub cost: Vec<(u8, u32)>,
    /// Device addresses of the module's `.global` variables.
    pub globals: Vec<u64>,
}

/// The device runtime's assertion handler (`assert` failing calls it).
pub(crate) const ASSERTFAIL: &str = "__assertfail";

/// What a name means inside a function.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Name {
    /// A value register and its declared width in bits.
    Val(Slot, u8),
    /// A predicate register.
    Pred(PSlot),
    /// A symbol whose address is a constant (global, shared, kernel param).
    Abs(u64),
    /// A symbol in the current frame (depot, call parameters, own params).
    Frame(u32),
}

/// A callee: its index, its parameters' (offset, size) in its frame, its
/// return value's.
pub(crate) type Callee<'a> = (u32, &'a [(u32, u32)], Option<(u32, u32)>);

/// Signature of a function: where its parameters and return value go in
/// its frame.
#[derive(Clone, Debug)]
struct Sig {
    params: Vec<(u32, u32)>,
    ret: Option<(u32, u32)>,
    head_bytes: u32,
}

fn align_up(x: u32, a: u32) -> u32 {
    x.div_ceil(a.max(1)) * a.max(1)
}

fn lerr<T>(line: usize, message: impl Into<String>) -> Result<T, LoadError> {
    Err(LoadError {
        line,
        message: message.into(),
    })
}

/// The decoding state of one function.
pub(crate) struct FnCtx<'m> {
    scopes: Vec<HashMap<String, Name>>,
    pub(crate) nslots: u32,
    pub(crate) npreds: u32,
    consts: HashMap<u64, Slot>,
    specials: HashMap<Special, Slot>,
    pub(crate) init: Vec<(Slot, SlotInit)>,
    pub(crate) labels: HashMap<String, u32>,
    pub(crate) frame_bytes: u32,
    /// Function indices by name, and each one's signature.
    func_index: &'m HashMap<String, usize>,
    sigs: &'m [Sig],
    /// `.shared` variables of this function (kernels only).
    pub(crate) shared: Vec<(String, u32, u32)>,
    pub(crate) shared_bytes: u32,
    pub(crate) is_entry: bool,
}

impl FnCtx<'_> {
    fn lookup(&self, n: &str) -> Option<Name> {
        self.scopes.iter().rev().find_map(|s| s.get(n).copied())
    }

    fn declare(&mut self, n: &str, v: Name) {
        if let Some(s) = self.scopes.last_mut() {
            s.insert(n.to_string(), v);
        }
    }

    /// The slot holding the constant `v` in every lane.
    pub(crate) fn konst(&mut self, v: u64) -> Slot {
        if let Some(&s) = self.consts.get(&v) {
            return s;
        }
        let s = self.nslots;
        self.nslots += 1;
        self.consts.insert(v, s);
        self.init.push((s, SlotInit::Const(v)));
        s
    }

    fn special(&mut self, name: &str) -> Option<Slot> {
        let xyz = |s: &str| match s {
            "x" => Some(0u8),
            "y" => Some(1),
            "z" => Some(2),
            _ => None,
        };
        let sp = match name.split_once('.') {
            Some(("%tid", d)) => Special::Tid(xyz(d)?),
            Some(("%ntid", d)) => Special::Ntid(xyz(d)?),
            Some(("%ctaid", d)) => Special::Ctaid(xyz(d)?),
            Some(("%nctaid", d)) => Special::Nctaid(xyz(d)?),
            None if name == "%laneid" => Special::LaneId,
            None if name == "%warpid" => Special::WarpId,
            None if name == "%nwarpid" => Special::NWarpId,
            None if name == "WARP_SZ" => Special::WarpSize,
            _ => return None,
        };
        if let Some(&s) = self.specials.get(&sp) {
            return Some(s);
        }
        let s = self.nslots;
        self.nslots += 1;
        self.specials.insert(sp, s);
        self.init.push((s, SlotInit::Special(sp)));
        Some(s)
    }

    /// Resolves a name used as an operand.
    pub(crate) fn name(&self, n: &str, line: usize) -> Result<Name, LoadError> {
        self.lookup(n).ok_or_else(|| LoadError {
            line,
            message: format!("undeclared name `{n}`"),
        })
    }

    /// A value source of a `bits`-wide type (`float` for float types:
    /// integer literals then mean numbers, not bits).
    pub(crate) fn src(
        &mut self,
        o: &Operand,
        bits: u32,
        float: bool,
        line: usize,
    ) -> Result<Slot, LoadError> {
        match o {
            Operand::Name(n) => {
                if let Some(s) = self.special(n) {
                    return Ok(s);
                }
                match self.name(n, line)? {
                    Name::Val(s, _) => Ok(s),
                    Name::Abs(a) => Ok(self.konst(a & super::alu::mask(bits))),
                    Name::Pred(_) => lerr(line, format!("predicate `{n}` used as a value")),
                    Name::Frame(_) => lerr(
                        line,
                        format!("address of frame symbol `{n}` used as a value"),
                    ),
                }
            }
            Operand::Imm(i) => {
                let v = imm_bits(*i, bits, float).ok_or(LoadError {
                    line,
                    message: format!("immediate {i:?} does not fit a {bits}-bit operand"),
                })?;
                Ok(self.konst(v))
            }
            _ => lerr(line, format!("bad source operand {o:?}")),
        }
    }

    /// A fresh slot nothing reads (where a result is discarded).
    pub(crate) fn scratch(&mut self) -> Slot {
        self.nslots += 1;
        self.nslots - 1
    }

    /// A value destination (`_` is a scratch slot).
    pub(crate) fn dst(&mut self, o: &Operand, line: usize) -> Result<Slot, LoadError> {
        match o {
            Operand::Sink => Ok(self.scratch()),
            Operand::Name(n) => match self.name(n, line)? {
                Name::Val(s, _) => Ok(s),
                _ => lerr(line, format!("`{n}` is not a value register")),
            },
            _ => lerr(line, format!("bad destination operand {o:?}")),
        }
    }

    /// Declared width of a value register destination.
    pub(crate) fn reg_bits(&self, o: &Operand, line: usize) -> Result<u8, LoadError> {
        match o {
            Operand::Name(n) => match self.name(n, line)? {
                Name::Val(_, b) => Ok(b),
                _ => lerr(line, format!("`{n}` is not a value register")),
            },
            Operand::Sink => Ok(64),
            _ => lerr(line, format!("bad register operand {o:?}")),
        }
    }

    /// A predicate register (source or destination).
    pub(crate) fn pred(&self, o: &Operand, line: usize) -> Result<PSlot, LoadError> {
        match o {
            Operand::Name(n) => match self.name(n, line)? {
                Name::Pred(p) => Ok(p),
                _ => lerr(line, format!("`{n}` is not a predicate")),
            },
            _ => lerr(line, format!("bad predicate operand {o:?}")),
        }
    }

    /// An address operand `[…]`.
    pub(crate) fn addr(&mut self, o: &Operand, line: usize) -> Result<Addr, LoadError> {
        let Operand::Addr(base, off) = o else {
            return lerr(line, format!("expected an address, found {o:?}"));
        };
        let off = *off as u64;
        Ok(match base {
            None => Addr {
                base: Base::Abs,
                off,
            },
            Some(n) => match self.name(n, line)? {
                Name::Val(s, _) => Addr {
                    base: Base::Reg(s),
                    off,
                },
                Name::Abs(a) => Addr {
                    base: Base::Abs,
                    off: a.wrapping_add(off),
                },
                Name::Frame(f) => Addr {
                    base: Base::Frame,
                    off: (f as u64).wrapping_add(off),
                },
                Name::Pred(_) => return lerr(line, format!("predicate `{n}` used as an address")),
            },
        })
    }

    /// Frame offset of a call-block parameter symbol.
    pub(crate) fn frame_sym(&self, n: &str, line: usize) -> Result<u32, LoadError> {
        match self.name(n, line)? {
            Name::Frame(f) => Ok(f),
            _ => lerr(
                line,
                format!("`{n}` is not a .param variable of this function"),
            ),
        }
    }

    /// The index and signature (param offsets, return) of a callee.
    pub(crate) fn callee(&self, n: &str, line: usize) -> Result<Callee<'_>, LoadError> {
        let i = *self.func_index.get(n).ok_or(LoadError {
            line,
            message: format!("call of unknown function `{n}`"),
        })?;
        let s = &self.sigs[i];
        Ok((i as u32, &s.params, s.ret))
    }

    fn alloc_frame(&mut self, size: u32, align: u32) -> u32 {
        let off = align_up(self.frame_bytes, align);
        self.frame_bytes = off + size;
        off
    }
}

/// Bits of an immediate for a `bits`-wide operand.
pub(crate) fn imm_bits(i: Imm, bits: u32, float: bool) -> Option<u64> {
    let m = super::alu::mask(bits);
    Some(match (i, float, bits) {
        (Imm::Int(v), false, _) | (Imm::Int(v), true, 16) => {
            if !(-(1i128 << 64)..(1i128 << 64)).contains(&v) {
                return None;
            }
            (v as u64) & m
        }
        (Imm::Int(v), true, 32) => (v as f32).to_bits() as u64,
        (Imm::Int(v), true, _) => (v as f64).to_bits(),
        (Imm::F32(b), _, 32) => b as u64,
        (Imm::F32(b), _, 64) => (f32::from_bits(b) as f64).to_bits(),
        (Imm::F64(b), _, 64) => b,
        (Imm::F64(b), _, 32) => (f64::from_bits(b) as f32).to_bits() as u64,
        _ => return None,
    })
}

fn reg_width(ty: &str) -> Option<u8> {
    Some(match ty {
        ".pred" => 1,
        ".b8" | ".u8" | ".s8" => 8,
        ".b16" | ".u16" | ".s16" | ".f16" | ".bf16" => 16,
        ".b32" | ".u32" | ".s32" | ".f32" | ".f16x2" | ".bf16x2" => 32,
        ".b64" | ".u64" | ".s64" | ".f64" => 64,
        _ => return None,
    })
}

fn sig_of(f: &RawFunc) -> Sig {
    let mut off = 0u32;
    let mut place = |d: &VarDecl| {
        let o = align_up(off, d.align as u32);
        off = o + d.size as u32;
        (o, d.size as u32)
    };
    let ret = f.ret.as_ref().map(&mut place);
    let params = f.params.iter().map(&mut place).collect();
    Sig {
        params,
        ret,
        head_bytes: off,
    }
}

/// Decodes a parsed module, allocating its `.global` variables in `mem`
/// (freed again if decoding fails).
pub(crate) fn decode(raw: RawModule, mem: &mut DeviceMemory) -> Result<Decoded, LoadError> {
    let mut globals = Vec::new();
    let r = decode_inner(raw, mem, &mut globals);
    if r.is_err() {
        for g in globals {
            let _ = mem.free(g);
        }
    }
    r
}

fn decode_inner(
    raw: RawModule,
    mem: &mut DeviceMemory,
    globals: &mut Vec<u64>,
) -> Result<Decoded, LoadError> {
    // Module scope: globals in device memory, module-level shared variables.
    let mut module_names: HashMap<String, Name> = HashMap::new();
    let mut module_shared = Vec::new();
    for g in &raw.globals {
        if g.space == ".shared" {
            module_shared.push(g.clone());
            continue;
        }
        let a = mem.alloc(g.size as u64).map_err(|e| LoadError {
            line: g.line,
            message: format!("cannot allocate `.global {}`: {e}", g.name),
        })?;
        globals.push(a);
        let bytes = g.init.clone().unwrap_or_else(|| vec![0; g.size]);
        if g.size > 0 {
            mem.write(a, &bytes).map_err(|e| LoadError {
                line: g.line,
                message: format!("cannot initialise `{}`: {e}", g.name),
            })?;
        }
        module_names.insert(g.name.clone(), Name::Abs(a));
    }
    // Functions: definitions win over prototypes; signatures first, so that
    // calls to later functions resolve.
    let mut func_index = HashMap::new();
    let mut defs: Vec<&RawFunc> = Vec::new();
    for f in &raw.funcs {
        if f.body.is_some() {
            if func_index.contains_key(&f.name) {
                return lerr(f.line, format!("function `{}` defined twice", f.name));
            }
            func_index.insert(f.name.clone(), defs.len());
            defs.push(f);
        }
    }
    for f in &raw.funcs {
        if f.body.is_none() && !func_index.contains_key(&f.name) {
            // The device runtime's functions the interpreter provides.
            if f.name == ASSERTFAIL {
                continue;
            }
            let what = match f.name.as_str() {
                "vprintf" => "device-side printf (`vprintf`) is not supported".to_string(),
                "malloc" | "free" => format!("device-side `{}` is not supported", f.name),
                n if n.starts_with("cudaGetParameterBuffer") || n.starts_with("cudaLaunch") => {
                    format!("dynamic parallelism (`{n}`) is not supported")
                }
                n => format!(
                    "function `{n}` is declared but never defined (calls outside the module \
                     are not supported)"
                ),
            };
            return lerr(f.line, what);
        }
    }
    let sigs: Vec<Sig> = defs.iter().map(|f| sig_of(f)).collect();
    let mut out = Decoded {
        funcs: Vec::new(),
        code: Vec::new(),
        src: Vec::new(),
        cost: Vec::new(),
        globals: globals.clone(),
    };
    for (fi, f) in defs.iter().enumerate() {
        let func = decode_func(
            f,
            &sigs[fi],
            &module_names,
            &module_shared,
            &func_index,
            &sigs,
            &mut out,
        )?;
        out.funcs.push(func);
    }
    Ok(out)
}

#[allow(clippy::too_many_arguments)]
fn decode_func(
    f: &RawFunc,
    sig: &Sig,
    module_names: &HashMap<String, Name>,
    module_shared: &[VarDecl],
    func_index: &HashMap<String, usize>,
    sigs: &[Sig],
    out: &mut Decoded,
) -> Result<Func, LoadError> {
    let mut cx = FnCtx {
        scopes: vec![module_names.clone(), HashMap::new()],
        nslots: 0,
        npreds: 0,
        consts: HashMap::new(),
        specials: HashMap::new(),
        init: Vec::new(),
        labels: HashMap::new(),
        frame_bytes: sig.head_bytes,
        func_index,
        sigs,
        shared: Vec::new(),
        shared_bytes: 0,
        is_entry: f.is_entry,
    };
    let mut kparams = Vec::new();
    let mut kparam_bytes = 0u32;
    if f.is_entry {
        for p in &f.params {
            let off = align_up(kparam_bytes, p.align as u32);
            kparam_bytes = off + p.size as u32;
            kparams.push((
                off,
                ParamSpec {
                    size: p.size,
                    align: p.align,
                },
            ));
            cx.declare(&p.name, Name::Abs(PARAM_WIN + off as u64));
        }
    } else {
        for (p, &(off, _)) in f.params.iter().zip(&sig.params) {
            cx.declare(&p.name, Name::Frame(off));
        }
        if let (Some(r), Some((off, _))) = (&f.ret, sig.ret) {
            cx.declare(&r.name, Name::Frame(off));
        }
    }
    let add_shared = |cx: &mut FnCtx, v: &VarDecl| {
        let off = align_up(cx.shared_bytes, v.align as u32);
        cx.shared_bytes = off + v.size as u32;
        cx.shared.push((v.name.clone(), off, v.size as u32));
        cx.declare(&v.name, Name::Abs(off as u64));
    };
    let body = f.body.as_deref().unwrap_or(&[]);
    let mut dyn_base = 0;
    if f.is_entry {
        for v in module_shared.iter().filter(|v| !v.is_extern) {
            add_shared(&mut cx, v);
        }
        dyn_base = dynamic_shared_base(&cx, module_shared, body);
        for v in module_shared.iter().filter(|v| v.is_extern) {
            cx.declare(&v.name, Name::Abs(dyn_base as u64));
        }
    }
    // Pass 1: labels → instruction indices.
    let base = out.code.len() as u32;
    let mut n = 0u32;
    for s in body {
        match s {
            Stmt::Label(l, line) if cx.labels.insert(l.clone(), base + n).is_some() => {
                return lerr(*line, format!("label `{l}` defined twice"));
            }
            Stmt::Inst(_) => n += 1,
            _ => {}
        }
    }
    // Pass 2: declarations (scoped) and instructions.
    let mut insts: Vec<&RawInst> = Vec::new();
    for s in body {
        match s {
            Stmt::Open => cx.scopes.push(HashMap::new()),
            Stmt::Close => {
                cx.scopes.pop();
            }
            Stmt::Reg { ty, names, line } => {
                let w = reg_width(ty).ok_or(LoadError {
                    line: *line,
                    message: format!("unsupported register type `{ty}`"),
                })?;
                if names.len() > 1 << 20 {
                    return lerr(*line, "too many registers");
                }
                for nm in names {
                    let v = if w == 1 {
                        cx.npreds += 1;
                        Name::Pred(cx.npreds - 1)
                    } else {
                        cx.nslots += 1;
                        Name::Val(cx.nslots - 1, w)
                    };
                    cx.declare(nm, v);
                }
            }
            Stmt::Var(v) => match v.space.as_str() {
                ".shared" if f.is_entry && cx.scopes.len() == 2 => add_shared(&mut cx, v),
                ".local" | ".param" => {
                    let off = cx.alloc_frame(v.size as u32, v.align as u32);
                    cx.declare(&v.name, Name::Frame(off));
                }
                s => {
                    return lerr(
                        v.line,
                        format!("unsupported `{s}` variable `{}` here", v.name),
                    )
                }
            },
            Stmt::Label(..) => {}
            Stmt::Inst(ri) => {
                let op = super::opcode::decode_inst(&mut cx, ri)?;
                let guard = match &ri.guard {
                    None => None,
                    Some((p, neg)) => Some((cx.pred(&Operand::Name(p.clone()), ri.line)?, *neg)),
                };
                out.code.push(Inst { op, guard });
                out.src.push(SrcInfo {
                    line: ri.line as u32,
                    text: ri.text.clone(),
                });
                let (class, flops) = crate::profile::classify(&ri.opcode);
                out.cost.push((class.index() as u8, flops));
                insts.push(ri);
            }
        }
    }
    super::cfg::set_reconvergence(&mut out.code[base as usize..], base).map_err(|(i, m)| {
        LoadError {
            line: insts.get(i).map_or(f.line, |r| r.line),
            message: m,
        }
    })?;
    Ok(Func {
        name: f.name.clone(),
        is_entry: f.is_entry,
        start: base,
        nslots: cx.nslots,
        npreds: cx.npreds,
        init: cx.init,
        frame_bytes: align_up(cx.frame_bytes, 16),
        kparams,
        kparam_bytes,
        shared: cx.shared,
        shared_bytes: cx.shared_bytes,
        // The extern arrays the kernel names (all alias one base), for
        // fault messages.
        dyn_shared: module_shared
            .iter()
            .filter(|v| v.is_extern && f.is_entry && insts.iter().any(|i| names(i, &v.name)))
            .map(|v| v.name.clone())
            .collect(),
        dyn_shared_base: dyn_base,
    })
}

/// Whether instruction `ri` names symbol `n` (as an operand or an
/// address base).
fn names(ri: &RawInst, n: &str) -> bool {
    ri.operands.iter().any(|o| match o {
        Operand::Name(x) | Operand::Addr(Some(x), _) => x == n,
        _ => false,
    })
}

/// Offset of dynamic shared memory (`.extern .shared`): after every static
/// shared variable of the kernel (module scope, laid out already in `cx`,
/// and the body's, laid out the same way later), aligned to the largest of
/// 16 and the extern declarations' alignments.
fn dynamic_shared_base(cx: &FnCtx, module_shared: &[VarDecl], body: &[Stmt]) -> u32 {
    let mut end = cx.shared_bytes;
    for s in body {
        if let Stmt::Var(v) = s {
            if v.space == ".shared" {
                end = align_up(end, v.align as u32) + v.size as u32;
            }
        }
    }
    let align = module_shared
        .iter()
        .filter(|v| v.is_extern)
        .map(|v| v.align as u32)
        .fold(16, u32::max);
    align_up(end, align)
}
