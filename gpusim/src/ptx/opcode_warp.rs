//! Decoding of the warp-synchronous instructions: `shfl.sync`,
//! `redux.sync`, `match.sync`, `bar.warp.sync` and `activemask`.

use super::decode::FnCtx;
use super::ir::*;
use super::parse::{Operand, RawInst};
use super::LoadError;

/// A value destination with an optional `|p` predicate destination.
fn dst_pred(cx: &mut FnCtx, o: &Operand, line: usize) -> Result<(Slot, PSlot), LoadError> {
    match o {
        Operand::Pair(d, p) => Ok((
            cx.dst(&Operand::Name(d.clone()), line)?,
            cx.pred(&Operand::Name(p.clone()), line)?,
        )),
        o => Ok((cx.dst(o, line)?, NO_PRED)),
    }
}

/// Decodes `shfl`, `redux`, `match` and `activemask`.
pub(crate) fn warp(cx: &mut FnCtx, ri: &RawInst) -> Result<Op, LoadError> {
    let line = ri.line;
    let unsupported = || LoadError {
        line,
        message: format!("unsupported instruction `{}`", ri.text.trim()),
    };
    let parts: Vec<&str> = ri.opcode.split('.').collect();
    let ops = &ri.operands;
    let nops = |n: usize| {
        if ops.len() == n {
            Ok(())
        } else {
            Err(LoadError {
                line,
                message: format!("`{}` takes {n} operands", ri.opcode),
            })
        }
    };
    Ok(match parts[..] {
        ["shfl", "sync", mode, "b32"] => {
            nops(5)?;
            let mode = match mode {
                "up" => ShflMode::Up,
                "down" => ShflMode::Down,
                "bfly" => ShflMode::Bfly,
                "idx" => ShflMode::Idx,
                _ => return Err(unsupported()),
            };
            let (d, p) = dst_pred(cx, &ops[0], line)?;
            Op::Shfl {
                mode,
                d,
                p,
                a: cx.src(&ops[1], 32, false, line)?,
                b: cx.src(&ops[2], 32, false, line)?,
                c: cx.src(&ops[3], 32, false, line)?,
                member: cx.src(&ops[4], 32, false, line)?,
            }
        }
        ["shfl", _, "b32"] => {
            return Err(LoadError {
                line,
                message: format!(
                    "`{}`: shfl without .sync is not supported (PTX for sm_70 and later \
                     uses shfl.sync)",
                    ri.opcode
                ),
            })
        }
        ["redux", "sync", op, ty] => {
            nops(3)?;
            let op = match (op, ty) {
                ("add", "u32" | "s32") => ReduxOp::Add,
                ("min", "u32") => ReduxOp::Min(false),
                ("min", "s32") => ReduxOp::Min(true),
                ("max", "u32") => ReduxOp::Max(false),
                ("max", "s32") => ReduxOp::Max(true),
                ("and", "b32") => ReduxOp::And,
                ("or", "b32") => ReduxOp::Or,
                ("xor", "b32") => ReduxOp::Xor,
                _ => return Err(unsupported()),
            };
            Op::Redux {
                op,
                d: cx.dst(&ops[0], line)?,
                a: cx.src(&ops[1], 32, false, line)?,
                member: cx.src(&ops[2], 32, false, line)?,
            }
        }
        ["match", mode @ ("any" | "all"), "sync", ty @ ("b32" | "b64")] => {
            nops(3)?;
            let all = mode == "all";
            let (d, p) = dst_pred(cx, &ops[0], line)?;
            if !all && p != NO_PRED {
                return Err(unsupported());
            }
            let bits = if ty == "b32" { 32 } else { 64 };
            Op::Match {
                all,
                d,
                p,
                a: cx.src(&ops[1], bits, false, line)?,
                member: cx.src(&ops[2], 32, false, line)?,
            }
        }
        ["bar", "warp", "sync"] => {
            nops(1)?;
            Op::WarpSync {
                member: cx.src(&ops[0], 32, false, line)?,
            }
        }
        ["activemask", "b32"] => {
            nops(1)?;
            Op::ActiveMask {
                d: cx.dst(&ops[0], line)?,
            }
        }
        _ => return Err(unsupported()),
    })
}
