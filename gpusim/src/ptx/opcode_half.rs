//! Decoding of packed half-pair arithmetic (`.f16x2`, `.bf16x2`), of
//! half-pair comparisons (`set`/`setp` on `.f16x2`/`.bf16x2`) and of the
//! byte permute `prmt.b32` with its lane function.

use super::alu;
use super::decode::FnCtx;
use super::ir::*;
use super::parse::{Operand, RawInst};
use super::LoadError;
use crate::numeric::{CmpOp, FloatTy, Rnd};

/// The pair type of a modifier.
fn pair_ty(m: &str) -> Option<FloatTy> {
    match m {
        "f16x2" => Some(FloatTy::F16),
        "bf16x2" => Some(FloatTy::Bf16),
        _ => None,
    }
}

/// Whether `opcode` is an arithmetic instruction on half pairs.
pub(crate) fn is_packed(opcode: &str) -> bool {
    let base = opcode.split('.').next().unwrap_or("");
    opcode.rsplit('.').next().and_then(pair_ty).is_some()
        && matches!(
            base,
            "add" | "sub" | "mul" | "fma" | "neg" | "abs" | "min" | "max"
        )
}

/// Decodes `add/sub/mul/fma/neg/abs/min/max` on `.f16x2`/`.bf16x2`.
pub(crate) fn packed(cx: &mut FnCtx, ri: &RawInst) -> Result<Op, LoadError> {
    let line = ri.line;
    let unsupported = || LoadError {
        line,
        message: format!("unsupported instruction `{}`", ri.text.trim()),
    };
    let parts: Vec<&str> = ri.opcode.split('.').collect();
    let (base, mods) = (parts[0], &parts[1..parts.len() - 1]);
    let ty = pair_ty(parts[parts.len() - 1]).ok_or_else(unsupported)?;
    let has = |m: &str| mods.contains(&m);
    let (ftz, sat, nan, relu) = (has("ftz"), has("sat"), has("NaN"), has("relu"));
    let rn = has("rn");
    let known = mods
        .iter()
        .all(|m| matches!(*m, "ftz" | "sat" | "NaN" | "relu" | "rn"));
    // bf16 forms take no .ftz/.sat; .NaN only on min/max, .relu only on fma.
    let bad = !known
        || (ty == FloatTy::Bf16 && (ftz || sat))
        || (nan && !matches!(base, "min" | "max"))
        || (relu && (base != "fma" || sat))
        || (rn && matches!(base, "neg" | "abs" | "min" | "max"))
        || (sat && matches!(base, "neg" | "abs" | "min" | "max"));
    if bad {
        return Err(unsupported());
    }
    let op = match base {
        "add" => PackedOp::Add(Rnd::Rn),
        "sub" => PackedOp::Sub(Rnd::Rn),
        "mul" => PackedOp::Mul(Rnd::Rn),
        "fma" if rn => PackedOp::Fma { rnd: Rnd::Rn, relu },
        "neg" => PackedOp::Neg,
        "abs" => PackedOp::Abs,
        "min" => PackedOp::Min { nan },
        "max" => PackedOp::Max { nan },
        _ => return Err(unsupported()),
    };
    let n = match base {
        "neg" | "abs" => 2,
        "fma" => 4,
        _ => 3,
    };
    let ops = &ri.operands;
    if ops.len() != n {
        return Err(LoadError {
            line,
            message: format!("`{}` takes {n} operands", ri.opcode),
        });
    }
    let a = cx.src(&ops[1], 32, false, line)?;
    let b = if n > 2 {
        cx.src(&ops[2], 32, false, line)?
    } else {
        a
    };
    let c = if n > 3 {
        cx.src(&ops[3], 32, false, line)?
    } else {
        a
    };
    Ok(Op::Packed {
        op,
        ty,
        ftz,
        sat,
        d: cx.dst(&ops[0], line)?,
        a,
        b,
        c,
    })
}

const CMP_OPS: [(&str, CmpOp); 14] = [
    ("eq", CmpOp::Eq),
    ("ne", CmpOp::Ne),
    ("lt", CmpOp::Lt),
    ("le", CmpOp::Le),
    ("gt", CmpOp::Gt),
    ("ge", CmpOp::Ge),
    ("equ", CmpOp::Equ),
    ("neu", CmpOp::Neu),
    ("ltu", CmpOp::Ltu),
    ("leu", CmpOp::Leu),
    ("gtu", CmpOp::Gtu),
    ("geu", CmpOp::Geu),
    ("num", CmpOp::Num),
    ("nan", CmpOp::Nan),
];

/// Decodes `set.cmp[.ftz].dtype.{f16x2,bf16x2}` (dtype `.u32`/`.s32`/`.b32`:
/// each half all ones; `.f16x2`/`.bf16x2`: each half 1.0) and
/// `setp.cmp[.ftz].{f16x2,bf16x2} p|q, a, b`. `None` when the source type
/// is not a pair (the scalar decoder's case).
pub(crate) fn cmp_pair(
    cx: &mut FnCtx,
    ri: &RawInst,
    is_set: bool,
) -> Option<Result<Op, LoadError>> {
    let line = ri.line;
    let parts: Vec<&str> = ri.opcode.split('.').skip(1).collect();
    let ty = pair_ty(parts.last()?)?;
    let unsupported = || LoadError {
        line,
        message: format!("unsupported instruction `{}`", ri.text.trim()),
    };
    let r = (|| {
        let op = CMP_OPS
            .iter()
            .find(|(n, _)| *n == parts[0])
            .ok_or_else(unsupported)?
            .1;
        let ftz = parts.get(1) == Some(&"ftz");
        let rest = &parts[1 + ftz as usize..parts.len() - 1];
        if ftz && ty == FloatTy::Bf16 || ri.operands.len() != 3 {
            return Err(unsupported());
        }
        let ops = &ri.operands;
        let a = cx.src(&ops[1], 32, false, line)?;
        let b = cx.src(&ops[2], 32, false, line)?;
        let (mut d, mut p, mut q, mut one) = (SINK, NO_PRED, NO_PRED, 0u16);
        if is_set {
            one = match rest {
                ["u32" | "s32" | "b32"] => 0xffff,
                ["f16x2"] if ty == FloatTy::F16 => 0x3c00,
                ["bf16x2"] if ty == FloatTy::Bf16 => 0x3f80,
                _ => return Err(unsupported()),
            };
            d = cx.dst(&ops[0], line)?;
        } else {
            if !rest.is_empty() {
                return Err(unsupported());
            }
            match &ops[0] {
                Operand::Pair(x, y) => {
                    p = cx.pred(&Operand::Name(x.clone()), line)?;
                    q = cx.pred(&Operand::Name(y.clone()), line)?;
                }
                o => p = cx.pred(o, line)?,
            }
        }
        Ok(Op::CmpPair {
            op,
            ty,
            ftz,
            one,
            d,
            p,
            q,
            a,
            b,
        })
    })();
    Some(r)
}

/// `prmt.b32` in default mode: each result byte picks one of the eight
/// bytes of `{b, a}` by a selector nibble of `c`; a nibble's bit 3
/// replicates the picked byte's sign bit instead.
#[inline(always)]
pub(crate) fn prmt_default(a: u64, b: u64, c: u64) -> u64 {
    let tmp = (b & 0xffff_ffff) << 32 | (a & 0xffff_ffff);
    let mut d = 0u64;
    for i in 0..4 {
        let sel = (c >> (4 * i)) & 0xf;
        let mut byte = (tmp >> (8 * (sel & 7))) & 0xff;
        if sel & 8 != 0 {
            byte = if byte & 0x80 != 0 { 0xff } else { 0 };
        }
        d |= byte << (8 * i);
    }
    d
}

/// `prmt.b32.mode`: the byte of `{b, a}` each result byte takes, from the
/// mode's table indexed by `c[1:0]`.
#[inline(always)]
pub(crate) fn prmt_mode(mode: u8, a: u64, b: u64, c: u64) -> u64 {
    let tmp = (b & 0xffff_ffff) << 32 | (a & 0xffff_ffff);
    let ctl = (c & 3) as usize;
    let mut d = 0u64;
    for i in 0..4usize {
        let src = match mode {
            1 => ctl + i,                 // f4e: forward 4 extract
            2 => (ctl + 8 - i) & 7,       // b4e: backward 4 extract
            3 => ctl,                     // rc8: replicate byte
            4 => ctl.max(i),              // ecl: edge clamp left
            5 => ctl.min(i),              // ecr: edge clamp right
            _ => (ctl & 1) * 2 + (i & 1), // rc16: replicate half
        };
        d |= ((tmp >> (8 * src)) & 0xff) << (8 * i);
    }
    d
}

/// One `prmt` mode as a lane function (0 = default).
struct Prmt<const MODE: u8>;
impl<const MODE: u8> alu::B3 for Prmt<MODE> {
    #[inline(always)]
    fn f(a: u64, b: u64, c: u64) -> u64 {
        if MODE == 0 {
            prmt_default(a, b, c)
        } else {
            prmt_mode(MODE, a, b, c)
        }
    }
}

/// Decodes `prmt.b32[.mode] d, a, b, c`.
pub(crate) fn prmt(cx: &mut FnCtx, ri: &RawInst) -> Result<Op, LoadError> {
    let line = ri.line;
    let f: alu::TernFn = match ri.opcode.as_str() {
        "prmt.b32" => alu::tern::<Prmt<0>>,
        "prmt.b32.f4e" => alu::tern::<Prmt<1>>,
        "prmt.b32.b4e" => alu::tern::<Prmt<2>>,
        "prmt.b32.rc8" => alu::tern::<Prmt<3>>,
        "prmt.b32.ecl" => alu::tern::<Prmt<4>>,
        "prmt.b32.ecr" => alu::tern::<Prmt<5>>,
        "prmt.b32.rc16" => alu::tern::<Prmt<6>>,
        _ => {
            return Err(LoadError {
                line,
                message: format!("unsupported instruction `{}`", ri.text.trim()),
            })
        }
    };
    let ops = &ri.operands;
    if ops.len() != 4 {
        return Err(LoadError {
            line,
            message: format!("`{}` takes 4 operands", ri.opcode),
        });
    }
    Ok(Op::Tern {
        f,
        d: cx.dst(&ops[0], line)?,
        a: cx.src(&ops[1], 32, false, line)?,
        b: cx.src(&ops[2], 32, false, line)?,
        c: cx.src(&ops[3], 32, false, line)?,
    })
}
