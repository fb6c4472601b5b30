//! One PTX instruction → an [`Op`]. Every opcode, type and modifier
//! combination the executor implements is listed here; anything else is a
//! load error naming the instruction, so nothing unsupported is found at
//! run time.

use super::alu;
use super::decode::FnCtx;
use super::ir::*;
use super::parse::{Operand, RawInst};
use super::LoadError;
use crate::numeric::{ApproxOp, CmpOp, CvtMode, CvtTy, FloatTy, IntTy, Precision, Rnd};

/// A PTX scalar type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ty {
    /// `.uN` / `.sN`
    Int(u32, bool),
    /// `.bN`
    Bits(u32),
    /// A float type.
    F(FloatTy),
    /// `.pred`
    Pred,
}

impl Ty {
    fn bits(self) -> u32 {
        match self {
            Ty::Int(b, _) | Ty::Bits(b) => b,
            Ty::F(FloatTy::F16 | FloatTy::Bf16) => 16,
            Ty::F(FloatTy::F32) => 32,
            Ty::F(FloatTy::F64) => 64,
            Ty::Pred => 1,
        }
    }
    fn signed(self) -> bool {
        matches!(self, Ty::Int(_, true))
    }
    fn is_float(self) -> bool {
        matches!(self, Ty::F(_))
    }
    fn is_int(self) -> bool {
        matches!(self, Ty::Int(..) | Ty::Bits(_))
    }
}

fn ty(s: &str) -> Option<Ty> {
    Some(match s {
        "u8" => Ty::Int(8, false),
        "u16" => Ty::Int(16, false),
        "u32" => Ty::Int(32, false),
        "u64" => Ty::Int(64, false),
        "s8" => Ty::Int(8, true),
        "s16" => Ty::Int(16, true),
        "s32" => Ty::Int(32, true),
        "s64" => Ty::Int(64, true),
        "b8" => Ty::Bits(8),
        "b16" => Ty::Bits(16),
        "b32" => Ty::Bits(32),
        "b64" => Ty::Bits(64),
        "f16" => Ty::F(FloatTy::F16),
        "bf16" => Ty::F(FloatTy::Bf16),
        "f32" => Ty::F(FloatTy::F32),
        "f64" => Ty::F(FloatTy::F64),
        "pred" => Ty::Pred,
        _ => return None,
    })
}

fn rnd(s: &str) -> Option<Rnd> {
    Some(match s {
        "rn" => Rnd::Rn,
        "rz" => Rnd::Rz,
        "rm" => Rnd::Rm,
        "rp" => Rnd::Rp,
        _ => return None,
    })
}

/// A float comparison through `numeric::fcmp` (ftz, f16, bf16), one
/// monomorphization per type/op/ftz.
struct NCmp<const T: u8, const OP: u8, const FTZ: bool>;
impl<const T: u8, const OP: u8, const FTZ: bool> alu::C2 for NCmp<T, OP, FTZ> {
    #[inline(always)]
    fn f(a: u64, b: u64) -> bool {
        use CmpOp::*;
        let ty = [FloatTy::F16, FloatTy::Bf16, FloatTy::F32, FloatTy::F64][T as usize];
        let op = [
            Eq, Ne, Lt, Le, Gt, Ge, Equ, Neu, Ltu, Leu, Gtu, Geu, Num, Nan,
        ][OP as usize];
        crate::numeric::fcmp(ty, op, a, b, FTZ)
    }
}

pub(crate) fn numeric_cmp(t: FloatTy, op: u8, ftz: bool) -> alu::CmpFn {
    macro_rules! ops {
        ($t:literal, $f:literal) => {
            match op {
                0 => alu::cmp::<NCmp<$t, 0, $f>> as alu::CmpFn,
                1 => alu::cmp::<NCmp<$t, 1, $f>>,
                2 => alu::cmp::<NCmp<$t, 2, $f>>,
                3 => alu::cmp::<NCmp<$t, 3, $f>>,
                4 => alu::cmp::<NCmp<$t, 4, $f>>,
                5 => alu::cmp::<NCmp<$t, 5, $f>>,
                6 => alu::cmp::<NCmp<$t, 6, $f>>,
                7 => alu::cmp::<NCmp<$t, 7, $f>>,
                8 => alu::cmp::<NCmp<$t, 8, $f>>,
                9 => alu::cmp::<NCmp<$t, 9, $f>>,
                10 => alu::cmp::<NCmp<$t, 10, $f>>,
                11 => alu::cmp::<NCmp<$t, 11, $f>>,
                12 => alu::cmp::<NCmp<$t, 12, $f>>,
                _ => alu::cmp::<NCmp<$t, 13, $f>>,
            }
        };
    }
    match (t, ftz) {
        (FloatTy::F16, _) => ops!(0, false),
        (FloatTy::Bf16, _) => ops!(1, false),
        (FloatTy::F32, false) => ops!(2, false),
        (FloatTy::F32, true) => ops!(2, true),
        (FloatTy::F64, _) => ops!(3, false),
    }
}

fn cvt_ty(t: Ty) -> Option<CvtTy> {
    let int = |b: u32, s: bool| {
        Some(CvtTy::Int(match (b, s) {
            (8, false) => IntTy::U8,
            (16, false) => IntTy::U16,
            (32, false) => IntTy::U32,
            (64, false) => IntTy::U64,
            (8, true) => IntTy::S8,
            (16, true) => IntTy::S16,
            (32, true) => IntTy::S32,
            (64, true) => IntTy::S64,
            _ => return None,
        }))
    };
    match t {
        Ty::F(f) => Some(CvtTy::Float(f)),
        Ty::Int(b, s) => int(b, s),
        Ty::Bits(b) => int(b, false),
        Ty::Pred => None,
    }
}

/// Decodes one instruction (validating it).
pub(crate) fn decode_inst(cx: &mut FnCtx, ri: &RawInst) -> Result<Op, LoadError> {
    let unsupported = || LoadError {
        line: ri.line,
        message: format!("unsupported instruction `{}`", ri.text.trim()),
    };
    let line = ri.line;
    let parts: Vec<&str> = ri.opcode.split('.').collect();
    let base = parts[0];
    let mods = &parts[1..];
    let has = |m: &str| mods.contains(&m);
    let ops = &ri.operands;
    let nops = |n: usize| -> Result<(), LoadError> {
        if ops.len() == n {
            Ok(())
        } else {
            Err(LoadError {
                line,
                message: format!("`{}` takes {n} operands", ri.opcode),
            })
        }
    };
    // The last modifier is the type for most instructions.
    let last_ty = mods.last().and_then(|m| ty(m));
    let rnd_mod = mods.iter().find_map(|m| rnd(m));
    let ftz = has("ftz");
    let sat = has("sat");

    if super::opcode_half::is_packed(&ri.opcode) {
        return super::opcode_half::packed(cx, ri);
    }
    Ok(match base {
        "prmt" => super::opcode_half::prmt(cx, ri)?,
        "mov" => {
            nops(2)?;
            let t = last_ty.ok_or_else(unsupported)?;
            if mods.len() != 1 {
                return Err(unsupported());
            }
            if let (Ty::Pred, Operand::Imm(super::parse::Imm::Int(v))) = (t, &ops[1]) {
                Op::PConst {
                    d: cx.pred(&ops[0], line)?,
                    v: *v != 0,
                }
            } else if t == Ty::Pred {
                Op::PMov {
                    d: cx.pred(&ops[0], line)?,
                    a: cx.pred(&ops[1], line)?,
                }
            } else if let Operand::Vec(ds) = &ops[0] {
                let n = ds.len() as u32;
                if !matches!(n, 2 | 4) || t.bits() % n != 0 || t.bits() / n < 8 {
                    return Err(unsupported());
                }
                let mut d = [SINK; 4];
                for (i, o) in ds.iter().enumerate() {
                    d[i] = cx.dst(o, line)?;
                }
                Op::Unpack {
                    d,
                    n: n as u8,
                    bits: (t.bits() / n) as u8,
                    a: cx.src(&ops[1], t.bits(), false, line)?,
                }
            } else if let Operand::Vec(ss) = &ops[1] {
                let n = ss.len() as u32;
                if !matches!(n, 2 | 4) || t.bits() % n != 0 || t.bits() / n < 8 {
                    return Err(unsupported());
                }
                let mut s = [SINK; 4];
                for (i, o) in ss.iter().enumerate() {
                    s[i] = cx.src(o, t.bits() / n, false, line)?;
                }
                Op::Pack {
                    d: cx.dst(&ops[0], line)?,
                    s,
                    n: n as u8,
                    bits: (t.bits() / n) as u8,
                }
            } else {
                let d = cx.dst(&ops[0], line)?;
                if let Operand::Name(n) = &ops[1] {
                    if let Ok(super::decode::Name::Frame(off)) = cx.name(n, line) {
                        return Ok(Op::FrameAddr { d, off: off as u64 });
                    }
                }
                Op::Mov {
                    d,
                    a: cx.src(&ops[1], t.bits(), t.is_float(), line)?,
                }
            }
        }
        "and" | "or" | "xor" | "not" if last_ty == Some(Ty::Pred) => {
            if mods.len() != 1 {
                return Err(unsupported());
            }
            let op = match base {
                "and" => BoolOp::And,
                "or" => BoolOp::Or,
                _ => BoolOp::Xor,
            };
            if base == "not" {
                nops(2)?;
                Op::PLogic {
                    op,
                    d: cx.pred(&ops[0], line)?,
                    a: cx.pred(&ops[1], line)?,
                    b: None,
                    neg_b: true,
                }
            } else {
                nops(3)?;
                let (b, neg_b) = match &ops[2] {
                    Operand::Not(n) => (cx.pred(&Operand::Name(n.clone()), line)?, true),
                    o => (cx.pred(o, line)?, false),
                };
                Op::PLogic {
                    op,
                    d: cx.pred(&ops[0], line)?,
                    a: cx.pred(&ops[1], line)?,
                    b: Some(b),
                    neg_b,
                }
            }
        }
        "add" | "sub" | "mul" | "div" | "rem" | "min" | "max" | "and" | "or" | "xor" | "shl"
        | "shr" | "copysign"
            if !has("cc") =>
        {
            nops(3)?;
            let t = last_ty.ok_or_else(unsupported)?;
            let d = cx.dst(&ops[0], line)?;
            if let Ty::F(ft) = t {
                return float_bin(cx, ri, base, mods, ft, d, unsupported);
            }
            if !t.is_int() || sat {
                return Err(unsupported());
            }
            let (w, s) = (t.bits(), t.signed());
            let key = match (base, mods.len()) {
                ("mul", 2) => match mods[0] {
                    "lo" => "mul.lo",
                    "hi" => "mul.hi",
                    "wide" => "mul.wide",
                    _ => return Err(unsupported()),
                },
                ("mul", _) | (_, 2..) | ("copysign", _) => return Err(unsupported()),
                (b, _) => b,
            };
            if matches!(base, "and" | "or" | "xor") && !matches!(t, Ty::Bits(_)) {
                return Err(unsupported());
            }
            let f = alu::int_bin(key, w, s).ok_or_else(unsupported)?;
            let bw = if matches!(base, "shl" | "shr") { 32 } else { w };
            Op::Bin {
                f,
                d,
                a: cx.src(&ops[1], w, false, line)?,
                b: cx.src(&ops[2], bw, false, line)?,
            }
        }
        "add" | "sub" | "addc" | "subc" | "mad" | "madc" => {
            // Carry chains (`add.cc`, `addc{.cc}`, `mad.lo.cc`, `madc.hi{.cc}` …).
            let t = last_ty.ok_or_else(unsupported)?;
            if !matches!(t, Ty::Int(32 | 64, _)) && !matches!(t, Ty::Bits(32 | 64)) {
                return Err(unsupported());
            }
            let cout = has("cc");
            let cin = base.ends_with('c');
            let rest: Vec<&str> = mods.iter().copied().filter(|m| *m != "cc").collect();
            let op = match base {
                "add" | "addc" if rest.len() == 1 => CarryOp::Add { cin, cout },
                "sub" | "subc" if rest.len() == 1 => CarryOp::Sub { cin, cout },
                "mad" | "madc" if rest.len() == 2 && matches!(rest[0], "lo" | "hi") => {
                    if !cout && !cin {
                        return int_mad(cx, ri, mods, unsupported);
                    }
                    CarryOp::Mad {
                        hi: rest[0] == "hi",
                        cin,
                        cout,
                    }
                }
                "mad" if rest.len() >= 2 => return int_mad(cx, ri, mods, unsupported),
                _ => return Err(unsupported()),
            };
            let w = t.bits();
            let n = if matches!(op, CarryOp::Mad { .. }) {
                4
            } else {
                3
            };
            nops(n)?;
            let d = cx.dst(&ops[0], line)?;
            let a = cx.src(&ops[1], w, false, line)?;
            let b = cx.src(&ops[2], w, false, line)?;
            let c = if n == 4 {
                cx.src(&ops[3], w, false, line)?
            } else {
                a
            };
            Op::Carry {
                op,
                bits: w as u8,
                d,
                a,
                b,
                c,
            }
        }
        "fma" => {
            nops(4)?;
            let Some(Ty::F(ft)) = last_ty else {
                return Err(unsupported());
            };
            let r = rnd_mod.ok_or_else(unsupported)?;
            fma(cx, ri, ft, r, ftz, sat)?
        }
        "not" | "neg" | "abs" | "clz" | "popc" | "brev" | "cnot" => {
            nops(2)?;
            let t = last_ty.ok_or_else(unsupported)?;
            let d = cx.dst(&ops[0], line)?;
            if let Ty::F(ft) = t {
                if !matches!(base, "neg" | "abs") || mods.len() != 1 + ftz as usize {
                    return Err(unsupported());
                }
                return Ok(Op::FUn {
                    op: if base == "neg" { FUn::Neg } else { FUn::Abs },
                    ty: ft,
                    ftz,
                    d,
                    a: cx.src(&ops[1], t.bits(), true, line)?,
                });
            }
            if mods.len() != 1 || !t.is_int() {
                return Err(unsupported());
            }
            let bits_only = matches!(base, "not" | "clz" | "popc" | "brev" | "cnot");
            if bits_only != matches!(t, Ty::Bits(_)) && base != "neg" && base != "abs" {
                return Err(unsupported());
            }
            Op::Un {
                f: alu::int_un(base, t.bits()).ok_or_else(unsupported)?,
                d,
                a: cx.src(&ops[1], t.bits(), false, line)?,
            }
        }
        "sqrt" | "rcp" | "ex2" | "lg2" | "sin" | "cos" | "rsqrt" | "tanh" => {
            nops(2)?;
            let Some(Ty::F(ft)) = last_ty else {
                return Err(unsupported());
            };
            let approx = has("approx");
            let prec = if approx {
                Precision::Approx
            } else {
                Precision::Ieee(rnd_mod.ok_or_else(unsupported)?)
            };
            let expected = 2 + ftz as usize;
            if mods.len() != expected || !matches!(ft, FloatTy::F32 | FloatTy::F64) {
                return Err(unsupported());
            }
            let d = cx.dst(&ops[0], line)?;
            let a = cx.src(&ops[1], ft_bits(ft), true, line)?;
            let op = match base {
                "sqrt" => {
                    if prec == Precision::Ieee(Rnd::Rn) && !ftz {
                        return Ok(Op::Un {
                            f: alu::float_sqrt_rn(ft == FloatTy::F64),
                            d,
                            a,
                        });
                    }
                    FUn::Sqrt(prec)
                }
                "rcp" => FUn::Rcp(prec),
                _ if !approx || (ft == FloatTy::F64 && base != "rsqrt") => {
                    return Err(unsupported())
                }
                "ex2" => FUn::Approx(ApproxOp::Ex2),
                "lg2" => FUn::Approx(ApproxOp::Lg2),
                "sin" => FUn::Approx(ApproxOp::Sin),
                "cos" => FUn::Approx(ApproxOp::Cos),
                "rsqrt" => FUn::Approx(ApproxOp::Rsqrt),
                _ => FUn::Approx(ApproxOp::Tanh),
            };
            Op::FUn {
                op,
                ty: ft,
                ftz,
                d,
                a,
            }
        }
        "bfe" => {
            nops(4)?;
            let t = last_ty.ok_or_else(unsupported)?;
            if mods.len() != 1 || !matches!(t, Ty::Int(32 | 64, _)) {
                return Err(unsupported());
            }
            Op::Tern {
                f: alu::int_tern("bfe", t.bits(), t.signed()).ok_or_else(unsupported)?,
                d: cx.dst(&ops[0], line)?,
                a: cx.src(&ops[1], t.bits(), false, line)?,
                b: cx.src(&ops[2], 32, false, line)?,
                c: cx.src(&ops[3], 32, false, line)?,
            }
        }
        "bfi" => {
            nops(5)?;
            let t = last_ty.ok_or_else(unsupported)?;
            if mods.len() != 1 || !matches!(t, Ty::Bits(32 | 64)) {
                return Err(unsupported());
            }
            Op::Bfi {
                bits: t.bits() as u8,
                d: cx.dst(&ops[0], line)?,
                a: cx.src(&ops[1], t.bits(), false, line)?,
                b: cx.src(&ops[2], t.bits(), false, line)?,
                c: cx.src(&ops[3], 32, false, line)?,
                e: cx.src(&ops[4], 32, false, line)?,
            }
        }
        "setp" | "set" => super::opcode_cmp::setp(cx, ri, base == "set")?,
        "selp" => {
            nops(4)?;
            let t = last_ty.ok_or_else(unsupported)?;
            if mods.len() != 1 || t == Ty::Pred {
                return Err(unsupported());
            }
            Op::Selp {
                d: cx.dst(&ops[0], line)?,
                a: cx.src(&ops[1], t.bits(), t.is_float(), line)?,
                b: cx.src(&ops[2], t.bits(), t.is_float(), line)?,
                p: cx.pred(&ops[3], line)?,
            }
        }
        "slct" => {
            nops(4)?;
            let dt = mods.first().and_then(|m| ty(m)).ok_or_else(unsupported)?;
            let f32 = match *mods.last().unwrap_or(&"") {
                "s32" => false,
                "f32" => true,
                _ => return Err(unsupported()),
            };
            if ftz || mods.len() != 2 || dt.bits() != 32 && dt.bits() != 64 && dt.bits() != 16 {
                return Err(unsupported());
            }
            Op::Slct {
                d: cx.dst(&ops[0], line)?,
                a: cx.src(&ops[1], dt.bits(), dt.is_float(), line)?,
                b: cx.src(&ops[2], dt.bits(), dt.is_float(), line)?,
                c: cx.src(&ops[3], 32, f32, line)?,
                f32,
            }
        }
        "cvt" if mods.contains(&"tf32") => super::opcode_mma::cvt_tf32(cx, ri)?,
        "cvt" => cvt(cx, ri, mods, unsupported)?,
        "cvta" => {
            nops(2)?;
            let to = has("to");
            let space = mods.iter().find_map(|m| match *m {
                "global" => Some(Space::Global),
                "shared" => Some(Space::Shared),
                "local" => Some(Space::Local),
                _ => None,
            });
            let t = last_ty.ok_or_else(unsupported)?;
            let (Some(space), 32 | 64) = (space, t.bits()) else {
                return Err(unsupported());
            };
            if mods.len() != 2 + to as usize {
                return Err(unsupported());
            }
            let d = cx.dst(&ops[0], line)?;
            let a = cx.src(&ops[1], t.bits(), false, line)?;
            if space == Space::Global {
                Op::Mov { d, a }
            } else {
                Op::Cvta {
                    space,
                    to,
                    bits: t.bits() as u8,
                    d,
                    a,
                }
            }
        }
        "ld" | "st" | "atom" | "red" => super::opcode_mem::mem(cx, ri)?,
        "bra" => {
            nops(1)?;
            if !(mods.is_empty() || mods == ["uni"]) {
                return Err(unsupported());
            }
            let Operand::Name(l) = &ops[0] else {
                return Err(unsupported());
            };
            let target = *cx.labels.get(l).ok_or(LoadError {
                line,
                message: format!("unknown label `{l}`"),
            })?;
            Op::Bra { target, rpc: NO_PC }
        }
        "call" => super::opcode_mem::call(cx, ri)?,
        "ret" | "exit" | "trap" => {
            nops(0)?;
            if !(mods.is_empty() || mods == ["uni"] && base == "ret") {
                return Err(unsupported());
            }
            match base {
                "ret" if cx.is_entry => Op::Exit,
                "ret" => Op::Ret,
                "exit" => Op::Exit,
                _ => Op::Trap,
            }
        }
        "bar" if mods == ["warp", "sync"] => super::opcode_warp::warp(cx, ri)?,
        "bar" | "barrier" => {
            let ok = matches!(mods, ["sync"] | ["sync", "aligned"]);
            if !ok || ops.len() > 1 {
                return Err(unsupported());
            }
            Op::Bar
        }
        "vote" => {
            let (mode, bal) = match mods {
                ["sync", "ballot", "b32"] | ["ballot", "b32"] => (VoteMode::Ballot, true),
                ["sync", "all", "pred"] | ["all", "pred"] => (VoteMode::All, false),
                ["sync", "any", "pred"] | ["any", "pred"] => (VoteMode::Any, false),
                ["sync", "uni", "pred"] | ["uni", "pred"] => (VoteMode::Uni, false),
                _ => return Err(unsupported()),
            };
            let sync = mods[0] == "sync";
            nops(2 + sync as usize)?;
            let (p, neg) = match &ops[1] {
                Operand::Not(n) => (cx.pred(&Operand::Name(n.clone()), line)?, true),
                o => (cx.pred(o, line)?, false),
            };
            let member = if sync {
                cx.src(&ops[2], 32, false, line)?
            } else {
                cx.konst(0xffff_ffff)
            };
            let (d, pd) = if bal {
                (cx.dst(&ops[0], line)?, 0)
            } else {
                (cx.scratch(), cx.pred(&ops[0], line)?)
            };
            Op::Vote {
                mode,
                d,
                pd,
                p,
                neg,
                member,
            }
        }
        "shfl" | "redux" | "match" | "activemask" => super::opcode_warp::warp(cx, ri)?,
        "cp" => super::opcode_async::cp_async(cx, ri)?,
        "mma" | "ldmatrix" | "stmatrix" => super::opcode_mma::mma(cx, ri)?,
        "membar" | "fence" => Op::Nop,
        _ => return Err(unsupported()),
    })
}

fn ft_bits(f: FloatTy) -> u32 {
    Ty::F(f).bits()
}

#[allow(clippy::too_many_arguments)]
fn float_bin(
    cx: &mut FnCtx,
    ri: &RawInst,
    base: &str,
    mods: &[&str],
    ft: FloatTy,
    d: Slot,
    unsupported: impl Fn() -> LoadError,
) -> Result<Op, LoadError> {
    let line = ri.line;
    let has = |m: &str| mods.contains(&m);
    let (ftz, sat) = (has("ftz"), has("sat"));
    let r = mods.iter().find_map(|m| rnd(m));
    let nan = has("NaN");
    let known = mods.iter().all(|m| {
        matches!(*m, "ftz" | "sat" | "NaN" | "full" | "approx")
            || rnd(m).is_some()
            || ty(m).is_some()
    });
    if !known || mods.iter().filter(|m| ty(m).is_some()).count() != 1 {
        return Err(unsupported());
    }
    let w = ft_bits(ft);
    let a = cx.src(&ri.operands[1], w, true, line)?;
    let b = cx.src(&ri.operands[2], w, true, line)?;
    let wide = matches!(ft, FloatTy::F32 | FloatTy::F64);
    let op = match base {
        "add" | "sub" | "mul" => {
            if has("NaN") || has("full") || has("approx") {
                return Err(unsupported());
            }
            let r = r.unwrap_or(Rnd::Rn);
            if r == Rnd::Rn && !ftz && !sat && wide {
                let f = alu::float_bin_rn(base, ft == FloatTy::F64).ok_or_else(&unsupported)?;
                return Ok(Op::Bin { f, d, a, b });
            }
            match base {
                "add" => FBin::Add(r),
                "sub" => FBin::Sub(r),
                _ => FBin::Mul(r),
            }
        }
        "div" => {
            if !wide || sat || nan {
                return Err(unsupported());
            }
            let prec = match (r, has("full"), has("approx")) {
                (Some(r), false, false) => Precision::Ieee(r),
                (None, true, false) if ft == FloatTy::F32 => Precision::Full,
                (None, false, true) if ft == FloatTy::F32 => Precision::Approx,
                _ => return Err(unsupported()),
            };
            if prec == Precision::Ieee(Rnd::Rn) && !ftz {
                let f = alu::float_bin_rn("div", ft == FloatTy::F64).ok_or_else(&unsupported)?;
                return Ok(Op::Bin { f, d, a, b });
            }
            FBin::Div(prec)
        }
        "min" | "max" if r.is_none() && !sat => {
            if base == "min" {
                FBin::Min { nan }
            } else {
                FBin::Max { nan }
            }
        }
        "copysign" if mods.len() == 1 && wide => FBin::Copysign,
        _ => return Err(unsupported()),
    };
    Ok(Op::FBin {
        op,
        ty: ft,
        ftz,
        sat,
        d,
        a,
        b,
    })
}

fn fma(
    cx: &mut FnCtx,
    ri: &RawInst,
    ft: FloatTy,
    r: Rnd,
    ftz: bool,
    sat: bool,
) -> Result<Op, LoadError> {
    let line = ri.line;
    let w = ft_bits(ft);
    let d = cx.dst(&ri.operands[0], line)?;
    let a = cx.src(&ri.operands[1], w, true, line)?;
    let b = cx.src(&ri.operands[2], w, true, line)?;
    let c = cx.src(&ri.operands[3], w, true, line)?;
    if r == Rnd::Rn && !ftz && !sat && matches!(ft, FloatTy::F32 | FloatTy::F64) {
        return Ok(Op::Tern {
            f: alu::float_fma_rn(ft == FloatTy::F64),
            d,
            a,
            b,
            c,
        });
    }
    Ok(Op::Fma {
        ty: ft,
        rnd: r,
        ftz,
        sat,
        d,
        a,
        b,
        c,
    })
}

fn int_mad(
    cx: &mut FnCtx,
    ri: &RawInst,
    mods: &[&str],
    unsupported: impl Fn() -> LoadError,
) -> Result<Op, LoadError> {
    let line = ri.line;
    if ri.operands.len() != 4 {
        return Err(unsupported());
    }
    // `mad.rn.f32` is a float fma.
    if let Some(Ty::F(ft)) = mods.last().and_then(|m| ty(m)) {
        let r = mods.iter().find_map(|m| rnd(m)).ok_or_else(&unsupported)?;
        let known = mods
            .iter()
            .all(|m| matches!(*m, "ftz" | "sat") || rnd(m).is_some() || ty(m).is_some());
        if !known {
            return Err(unsupported());
        }
        return fma(cx, ri, ft, r, mods.contains(&"ftz"), mods.contains(&"sat"));
    }
    let [kind, t] = mods else {
        return Err(unsupported());
    };
    let t = ty(t).ok_or_else(&unsupported)?;
    if !matches!(t, Ty::Int(..)) {
        return Err(unsupported());
    }
    let key = match *kind {
        "lo" => "mad.lo",
        "hi" => "mad.hi",
        "wide" => "mad.wide",
        _ => return Err(unsupported()),
    };
    let w = t.bits();
    let cw = if *kind == "wide" { 2 * w } else { w };
    Ok(Op::Tern {
        f: alu::int_tern(key, w, t.signed()).ok_or_else(&unsupported)?,
        d: cx.dst(&ri.operands[0], line)?,
        a: cx.src(&ri.operands[1], w, false, line)?,
        b: cx.src(&ri.operands[2], w, false, line)?,
        c: cx.src(&ri.operands[3], cw, false, line)?,
    })
}

fn cvt(
    cx: &mut FnCtx,
    ri: &RawInst,
    mods: &[&str],
    unsupported: impl Fn() -> LoadError,
) -> Result<Op, LoadError> {
    let line = ri.line;
    if ri.operands.len() != 2 || mods.len() < 2 {
        return Err(unsupported());
    }
    let (dt, st) = (ty(mods[mods.len() - 2]), ty(mods[mods.len() - 1]));
    let (Some(dt), Some(st)) = (dt, st) else {
        return Err(unsupported());
    };
    let mut mode = CvtMode::default();
    for m in &mods[..mods.len() - 2] {
        match *m {
            "rn" | "rz" | "rm" | "rp" => mode.rnd = rnd(m),
            "rni" | "rzi" | "rmi" | "rpi" => {
                mode.rnd = rnd(&m[..2]);
                mode.integral = true;
            }
            "sat" => mode.sat = true,
            "ftz" => mode.ftz = true,
            "relu" => mode.relu = true,
            _ => return Err(unsupported()),
        }
    }
    let (Some(dc), Some(sc)) = (cvt_ty(dt), cvt_ty(st)) else {
        return Err(unsupported());
    };
    // Rounding rules of the ISA: float→float narrowing and int→float need
    // a float rounding; float→int needs an integer rounding; f→f of the
    // same type takes an integer rounding or none (then only ftz/sat).
    let ok = match (dc, sc) {
        (CvtTy::Int(_), CvtTy::Int(_)) => mode.rnd.is_none() && !mode.ftz && !mode.relu,
        (CvtTy::Int(_), CvtTy::Float(_)) => mode.integral && !mode.relu,
        (CvtTy::Float(_), CvtTy::Int(_)) => {
            mode.rnd.is_some() && !mode.integral && !mode.ftz && !mode.relu
        }
        (CvtTy::Float(d), CvtTy::Float(s)) => {
            let narrowing = ft_bits(d) < ft_bits(s) || (ft_bits(d) == 16 && d != s);
            if d == s {
                mode.rnd.is_none() || mode.integral
            } else if narrowing {
                mode.rnd.is_some() && !mode.integral
            } else {
                mode.rnd.is_none() && !mode.relu
            }
        }
    };
    if !ok {
        return Err(unsupported());
    }
    let d = cx.dst(&ri.operands[0], line)?;
    let a = cx.src(&ri.operands[1], st.bits(), st.is_float(), line)?;
    if let (CvtTy::Int(_), CvtTy::Int(_), false) = (dc, sc, mode.sat) {
        let f = alu::cvt_int(st.bits(), st.signed(), dt.bits()).ok_or_else(&unsupported)?;
        return Ok(Op::Un { f, d, a });
    }
    Ok(Op::Cvt {
        dst: dc,
        src: sc,
        mode,
        d,
        a,
    })
}
