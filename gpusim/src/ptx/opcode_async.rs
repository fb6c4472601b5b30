//! Decoding of the asynchronous copies: `cp.async.{ca,cg}.shared.global`
//! (cp-size 4, 8 or 16; `.cg` only 16; an optional src-size or ignore-src
//! operand; cache hints accepted and ignored), `cp.async.commit_group`,
//! `cp.async.wait_group N` and `cp.async.wait_all`.

use super::decode::{FnCtx, Name};
use super::ir::*;
use super::parse::{Imm, Operand, RawInst};
use super::LoadError;

/// Decodes every `cp.async…` form.
pub(crate) fn cp_async(cx: &mut FnCtx, ri: &RawInst) -> Result<Op, LoadError> {
    let line = ri.line;
    let unsupported = |why: &str| LoadError {
        line,
        message: format!("unsupported instruction `{}`{why}", ri.text.trim()),
    };
    let parts: Vec<&str> = ri.opcode.split('.').collect();
    let ops = &ri.operands;
    match parts[..] {
        ["cp", "async", "commit_group"] if ops.is_empty() => return Ok(Op::CpAsyncCommit),
        ["cp", "async", "wait_all"] if ops.is_empty() => {
            return Ok(Op::CpAsyncWait { n: 0, all: true })
        }
        ["cp", "async", "wait_group"] => {
            return match ops[..] {
                [Operand::Imm(Imm::Int(n))] if (0..=u32::MAX as i128).contains(&n) => {
                    Ok(Op::CpAsyncWait {
                        n: n as u32,
                        all: false,
                    })
                }
                _ => Err(unsupported(" (wait_group takes one integer constant)")),
            }
        }
        ["cp", "async", "ca" | "cg", ..] => {}
        ["cp", "async", "mbarrier", ..] => {
            return Err(unsupported(" (mbarrier completion is not simulated)"))
        }
        _ => return Err(unsupported("")),
    }
    let cg = parts[2] == "cg";
    if !matches!(parts[3..], ["shared" | "shared::cta", "global", ..]) {
        return Err(unsupported(" (cp.async copies .global to .shared)"));
    }
    let mut hint = false;
    for m in &parts[5..] {
        match *m {
            "L2::cache_hint" => hint = true,
            // Prefetch sizes are performance hints.
            "L2::64B" | "L2::128B" | "L2::256B" => {}
            _ => return Err(unsupported("")),
        }
    }
    // [dst], [src], cp-size {, src-size | ignore-src} {, cache-policy}
    let n = ops.len() - hint as usize;
    if !(3..=4).contains(&n) || ops.len() < 3 {
        return Err(unsupported(" (wrong number of operands)"));
    }
    let size = match ops[2] {
        Operand::Imm(Imm::Int(s @ (4 | 8 | 16))) => s as u8,
        _ => return Err(unsupported(" (cp-size must be 4, 8 or 16)")),
    };
    if cg && size != 16 {
        return Err(unsupported(" (cp.async.cg copies 16 bytes)"));
    }
    if hint {
        // The cache policy is a hint: decoded (a valid register) and ignored.
        cx.src(&ops[ops.len() - 1], 64, false, line)?;
    }
    let (mut src_size, mut ignore) = (None, None);
    if n == 4 {
        match &ops[3] {
            Operand::Not(p) => ignore = Some((cx.pred(&Operand::Name(p.clone()), line)?, true)),
            Operand::Name(p) if matches!(cx.name(p, line), Ok(Name::Pred(_))) => {
                ignore = Some((cx.pred(&ops[3], line)?, false))
            }
            o => src_size = Some(cx.src(o, 32, false, line)?),
        }
    }
    Ok(Op::CpAsync(Box::new(CpAsync {
        dst: cx.addr(&ops[0], line)?,
        src: cx.addr(&ops[1], line)?,
        size,
        src_size,
        ignore,
    })))
}
