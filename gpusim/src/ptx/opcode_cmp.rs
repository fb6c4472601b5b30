//! Decoding of `setp` and `set`.

use super::alu;
use super::decode::FnCtx;
use super::ir::*;
use super::parse::{Operand, RawInst};
use super::LoadError;
use crate::numeric::{CmpOp, FloatTy};

fn float_ty(s: &str) -> Option<FloatTy> {
    Some(match s {
        "f16" => FloatTy::F16,
        "bf16" => FloatTy::Bf16,
        "f32" => FloatTy::F32,
        "f64" => FloatTy::F64,
        _ => return None,
    })
}

fn int_ty(s: &str) -> Option<(u32, bool)> {
    let (k, b) = s.split_at(1);
    let bits: u32 = b.parse().ok()?;
    if !matches!(bits, 16 | 32 | 64) {
        return None;
    }
    match k {
        "u" | "b" => Some((bits, false)),
        "s" => Some((bits, true)),
        _ => None,
    }
}

const CMP_NAMES: [&str; 14] = [
    "eq", "ne", "lt", "le", "gt", "ge", "equ", "neu", "ltu", "leu", "gtu", "geu", "num", "nan",
];

/// A comparison function for `cmp` on type `t` (`ftz` for floats), and the
/// operand width.
fn cmp_fn(cmp: &str, t: &str, ftz: bool) -> Option<(alu::CmpFn, u32, bool)> {
    if let Some(ft) = float_ty(t) {
        let code = CMP_NAMES.iter().position(|n| *n == cmp)? as u8;
        let bits = match ft {
            FloatTy::F16 | FloatTy::Bf16 => 16,
            FloatTy::F32 => 32,
            FloatTy::F64 => 64,
        };
        let f = match ft {
            FloatTy::F32 | FloatTy::F64 if !ftz || ft == FloatTy::F64 => {
                alu::float_cmp(ft == FloatTy::F64, code)
            }
            _ => super::opcode::numeric_cmp(ft, code, ftz),
        };
        if ftz && ft != FloatTy::F32 {
            return None;
        }
        return Some((f, bits, true));
    }
    if ftz {
        return None;
    }
    let (bits, s) = int_ty(t)?;
    // Bit-size types compare only for equality.
    if t.starts_with('b') && !matches!(cmp, "eq" | "ne") {
        return None;
    }
    Some((alu::int_cmp(cmp, bits, s)?, bits, false))
}

/// Decodes `setp.cmp[.bop][.ftz].type` or `set.cmp[.ftz].dtype.stype`.
pub(crate) fn setp(cx: &mut FnCtx, ri: &RawInst, is_set: bool) -> Result<Op, LoadError> {
    let line = ri.line;
    let unsupported = || LoadError {
        line,
        message: format!("unsupported instruction `{}`", ri.text.trim()),
    };
    if let Some(r) = super::opcode_half::cmp_pair(cx, ri, is_set) {
        return r;
    }
    let parts: Vec<&str> = ri.opcode.split('.').skip(1).collect();
    let mut it = parts.iter().copied().peekable();
    let cmp = it.next().ok_or_else(unsupported)?;
    let bop = match it.peek().copied() {
        Some("and") => Some(BoolOp::And),
        Some("or") => Some(BoolOp::Or),
        Some("xor") => Some(BoolOp::Xor),
        _ => None,
    };
    if bop.is_some() {
        it.next();
    }
    let ftz = it.peek() == Some(&"ftz");
    if ftz {
        it.next();
    }
    let rest: Vec<&str> = it.collect();
    let ops = &ri.operands;
    if is_set {
        let [dt, st] = rest[..] else {
            return Err(unsupported());
        };
        if bop.is_some() || ops.len() != 3 {
            return Err(unsupported());
        }
        let (f, bits, float) = cmp_fn(cmp, st, ftz).ok_or_else(unsupported)?;
        let one = match dt {
            "u32" | "s32" | "b32" => 0xffff_ffff,
            "f32" => 1f32.to_bits() as u64,
            // A half destination (`set.eq.f16.f16`, cuda_fp16's __heq
            // family): 1.0 in the type.
            "f16" => 0x3c00,
            "bf16" => 0x3f80,
            _ => return Err(unsupported()),
        };
        return Ok(Op::Set {
            f,
            d: cx.dst(&ops[0], line)?,
            a: cx.src(&ops[1], bits, float, line)?,
            b: cx.src(&ops[2], bits, float, line)?,
            one,
        });
    }
    let [t] = rest[..] else {
        return Err(unsupported());
    };
    let (f, bits, float) = cmp_fn(cmp, t, ftz).ok_or_else(unsupported)?;
    if ops.len() != 3 + bop.is_some() as usize {
        return Err(unsupported());
    }
    let (d, d2) = match &ops[0] {
        Operand::Pair(p, q) => (
            cx.pred(&Operand::Name(p.clone()), line)?,
            Some(cx.pred(&Operand::Name(q.clone()), line)?),
        ),
        o => (cx.pred(o, line)?, None),
    };
    let comb = match bop {
        None => None,
        Some(b) => Some(match &ops[3] {
            Operand::Not(n) => (b, cx.pred(&Operand::Name(n.clone()), line)?, true),
            o => (b, cx.pred(o, line)?, false),
        }),
    };
    let _ = CmpOp::Eq;
    Ok(Op::Setp {
        f,
        d,
        d2,
        a: cx.src(&ops[1], bits, float, line)?,
        b: cx.src(&ops[2], bits, float, line)?,
        comb,
    })
}
