//! Decoding of memory instructions (`ld`, `st`, `atom`, `red`) and `call`.

use super::decode::FnCtx;
use super::ir::*;
use super::parse::{Operand, RawInst};
use super::LoadError;
use crate::numeric::FloatTy;

fn space(m: &str) -> Option<Space> {
    Some(match m {
        "global" => Space::Global,
        "shared" => Space::Shared,
        "local" => Space::Local,
        "param" => Space::Param,
        _ => return None,
    })
}

/// (bytes, signed, float) of a memory type.
fn mem_ty(m: &str) -> Option<(u32, bool, bool)> {
    Some(match m {
        "u8" | "b8" => (1, false, false),
        "s8" => (1, true, false),
        "u16" | "b16" => (2, false, false),
        "s16" => (2, true, false),
        "f16" | "bf16" => (2, false, true),
        "u32" | "b32" => (4, false, false),
        "s32" => (4, true, false),
        "f32" => (4, false, true),
        "u64" | "b64" => (8, false, false),
        "s64" => (8, true, false),
        "f64" => (8, false, true),
        _ => return None,
    })
}

/// Decodes `ld`, `st`, `atom` and `red`.
pub(crate) fn mem(cx: &mut FnCtx, ri: &RawInst) -> Result<Op, LoadError> {
    let line = ri.line;
    let unsupported = || LoadError {
        line,
        message: format!("unsupported instruction `{}`", ri.text.trim()),
    };
    let parts: Vec<&str> = ri.opcode.split('.').collect();
    let base = parts[0];
    let mods = &parts[1..];
    let mut sp = Space::Generic;
    let mut n = 1u8;
    let mut ty = None;
    let mut aop = None;
    let mut noftz = false;
    for m in mods {
        if let Some(s) = space(m) {
            sp = s;
        } else if *m == "v2" {
            n = 2;
        } else if *m == "v4" {
            n = 4;
        } else if let Some(t) = mem_ty(m) {
            ty = Some((*m, t));
        } else if (matches!(
            *m,
            "nc" | "volatile" | "ca" | "cg" | "cs" | "lu" | "cv" | "wb" | "wt"
        ) && matches!(base, "ld" | "st"))
            || matches!(
                *m,
                "relaxed" | "acquire" | "release" | "acq_rel" | "cta" | "gpu" | "sys"
            )
        {
            // Cache hints and memory-model qualifiers: one thread runs at a
            // time here, so every access is already sequentially consistent.
        } else if *m == "noftz" && matches!(base, "atom" | "red") {
            noftz = true;
        } else if matches!(base, "atom" | "red")
            && matches!(
                *m,
                "add" | "cas" | "exch" | "min" | "max" | "and" | "or" | "xor" | "inc" | "dec"
            )
        {
            aop = Some(*m);
        } else {
            return Err(unsupported());
        }
    }
    let Some((tname, (size, signed, float))) = ty else {
        return Err(unsupported());
    };
    let ops = &ri.operands;
    let bits = size * 8;
    match base {
        "ld" | "st" => {
            if ops.len() != 2 || aop.is_some() {
                return Err(unsupported());
            }
            let (reg_op, addr_op) = if base == "ld" {
                (&ops[0], &ops[1])
            } else {
                (&ops[1], &ops[0])
            };
            let addr = cx.addr(addr_op, line)?;
            let regs: Vec<Operand> = match reg_op {
                Operand::Vec(v) if v.len() == n as usize && n > 1 => v.clone(),
                o if n == 1 => vec![o.clone()],
                _ => return Err(unsupported()),
            };
            let mut slots = [SINK; 4];
            if base == "ld" {
                let mut sext_bits = 0u8;
                for (i, o) in regs.iter().enumerate() {
                    slots[i] = cx.dst(o, line)?;
                    let rb = cx.reg_bits(o, line)?;
                    if (rb as u32) < bits {
                        return Err(LoadError {
                            line,
                            message: format!("register narrower than `{}`", ri.opcode),
                        });
                    }
                    if signed {
                        sext_bits = rb;
                    }
                }
                Ok(Op::Ld {
                    space: sp,
                    size: size as u8,
                    n,
                    sext_bits,
                    d: slots,
                    addr,
                })
            } else {
                if sp == Space::Param && addr.base != Base::Frame && addr.base != Base::Abs {
                    // st.param through a register: only frame params are writable.
                }
                for (i, o) in regs.iter().enumerate() {
                    slots[i] = cx.src(o, bits, float, line)?;
                }
                Ok(Op::St {
                    space: sp,
                    size: size as u8,
                    n,
                    s: slots,
                    addr,
                })
            }
        }
        _ => {
            let is_red = base == "red";
            if n != 1 || !matches!(sp, Space::Global | Space::Shared | Space::Generic) {
                return Err(unsupported());
            }
            let aop = aop.ok_or_else(unsupported)?;
            let is_b = tname.starts_with('b');
            let op = match (aop, size, float) {
                ("add", 4 | 8, false) if !is_b => AtomOp::Add,
                ("add", 4, true) if tname == "f32" => AtomOp::FAdd(FloatTy::F32),
                ("add", 8, true) => AtomOp::FAdd(FloatTy::F64),
                ("add", 2, true) if noftz => AtomOp::FAdd(if tname == "f16" {
                    FloatTy::F16
                } else {
                    FloatTy::Bf16
                }),
                ("cas", 2 | 4 | 8, false) => AtomOp::Cas,
                ("exch", 4 | 8, false) => AtomOp::Exch,
                ("min", 4 | 8, false) if !is_b => AtomOp::Min,
                ("max", 4 | 8, false) if !is_b => AtomOp::Max,
                ("and", 4 | 8, false) if is_b => AtomOp::And,
                ("or", 4 | 8, false) if is_b => AtomOp::Or,
                ("xor", 4 | 8, false) if is_b => AtomOp::Xor,
                ("inc", 4, false) if tname == "u32" => AtomOp::Inc,
                ("dec", 4, false) if tname == "u32" => AtomOp::Dec,
                _ => return Err(unsupported()),
            };
            if noftz && !matches!(op, AtomOp::FAdd(FloatTy::F16 | FloatTy::Bf16)) {
                return Err(unsupported());
            }
            let nsrc = if op == AtomOp::Cas { 2 } else { 1 };
            let first = if is_red { 0 } else { 1 };
            if ops.len() != first + 1 + nsrc {
                return Err(unsupported());
            }
            let d = if is_red {
                cx.scratch()
            } else {
                cx.dst(&ops[0], line)?
            };
            let addr = cx.addr(&ops[first], line)?;
            let b = cx.src(&ops[first + 1], bits, float, line)?;
            let c = if nsrc == 2 {
                cx.src(&ops[first + 2], bits, float, line)?
            } else {
                b
            };
            Ok(Op::Atom {
                space: sp,
                op,
                size: size as u8,
                signed,
                d,
                addr,
                b,
                c,
            })
        }
    }
}

/// Decodes `call{.uni} [(ret),] func[, (args)]`.
pub(crate) fn call(cx: &mut FnCtx, ri: &RawInst) -> Result<Op, LoadError> {
    let line = ri.line;
    let unsupported = || LoadError {
        line,
        message: format!("unsupported instruction `{}`", ri.text.trim()),
    };
    if !(ri.opcode == "call" || ri.opcode == "call.uni") {
        return Err(unsupported());
    }
    let mut ops = ri.operands.iter().peekable();
    let ret_sym = match ops.peek() {
        Some(Operand::List(r)) => {
            let r = r.clone();
            ops.next();
            if r.len() > 1 {
                return Err(unsupported());
            }
            r.into_iter().next()
        }
        _ => None,
    };
    let Some(Operand::Name(fname)) = ops.next() else {
        return Err(unsupported());
    };
    let args: Vec<String> = match ops.next() {
        None => Vec::new(),
        Some(Operand::List(a)) => a.clone(),
        _ => return Err(unsupported()),
    };
    if ops.next().is_some() {
        return Err(unsupported());
    }
    let mut arg_offs = Vec::new();
    for a in &args {
        arg_offs.push(cx.frame_sym(a, line)?);
    }
    let ret_off = match &ret_sym {
        Some(r) => Some(cx.frame_sym(r, line)?),
        None => None,
    };
    if fname == super::decode::ASSERTFAIL {
        let args: [u32; 5] = arg_offs.try_into().map_err(|_| LoadError {
            line,
            message: "`__assertfail` takes 5 arguments".into(),
        })?;
        return Ok(Op::AssertFail { args });
    }
    let (func, params, ret) = cx.callee(fname, line)?;
    if params.len() != args.len() || ret.is_some() != ret_off.is_some() && ret_off.is_some() {
        return Err(LoadError {
            line,
            message: format!("call of `{fname}` with the wrong number of arguments"),
        });
    }
    let copies: Vec<ParamCopy> = arg_offs
        .iter()
        .zip(params)
        .map(|(&from, &(to, size))| ParamCopy { from, to, size })
        .collect();
    let ret = match (ret, ret_off) {
        (Some((from, size)), Some(to)) => Some(ParamCopy { from, to, size }),
        _ => None,
    };
    Ok(Op::Call {
        func,
        args: copies.into_boxed_slice(),
        ret,
    })
}
